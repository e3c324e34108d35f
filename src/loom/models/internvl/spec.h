// The InternVL family (models/family.h): InternVL2.5 / InternVL3 / InternVL3.5 -hf checkpoints.
#pragma once
#include <vector>

#include "loom/models/family.h"

namespace loom::models {

std::vector<Family> internvl_families();

}  // namespace loom::models
