// The Qwen3.5 families (models/family.h): qwen3_5 (dense) and qwen3_5_moe.
#pragma once
#include <vector>

#include "loom/models/family.h"

namespace loom::models {

std::vector<Family> qwen3_5_families();

}  // namespace loom::models
