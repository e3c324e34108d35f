// The umT5 family (models/family.h): the text encoder of Wan2.1's flow matching.
#pragma once
#include <vector>

#include "loom/models/family.h"

namespace loom::models {

std::vector<Family> umt5_families();

}  // namespace loom::models
