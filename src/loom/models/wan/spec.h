// The Wan2.1 families (models/family.h): the DiT (wan) and its causal 3D VAE (wan_vae).
#pragma once
#include <vector>

#include "loom/models/family.h"

namespace loom::models {

std::vector<Family> wan_families();

}  // namespace loom::models
