// InternVL's checkpoint layouts: Loom's parameters carry the names of the published -hf checkpoints
// (vision_tower.*, multi_modal_projector.*, language_model.model.*, language_model.lm_head.weight);
// transformers 5's in-memory names (model.vision_tower.*, model.multi_modal_projector.*,
// model.language_model.*, lm_head.weight) and the original remote-code checkpoints' (vision_model.*,
// mlp1.*, language_model.*, q/k/v fused in attn.qkv) are read through a name map.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "loom/models/weights.h"

namespace loom::models {

enum class InternVLLayout { hf, transformers5, original };

// The layout of a checkpoint's tensor names.
InternVLLayout internvl_layout(const std::vector<std::string>& file_names);

// Where parameter `name` is in a checkpoint of `layout`; `vision_width` is the vision tower's hidden
// size, by which the original layout's fused q/k/v rows are cut.
FileTensor internvl_file_tensor(const std::string& name, InternVLLayout layout, int64_t vision_width);

// The weights of a model directory in any of the three layouts.
void load_internvl_parameters(torch::nn::Module& model, const std::string& dir, int64_t vision_width);

}  // namespace loom::models
