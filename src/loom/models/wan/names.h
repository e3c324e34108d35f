// Wan2.1 DiT weights in either of their published layouts: Wan's own names (the Wan-AI release,
// WanModel.from_pretrained) or diffusers' WanTransformer3DModel names (the -Diffusers repositories'
// transformer/ folder), told apart by the names alone, and loaded into a WanModel (Wan names).
//
// diffusers -> Wan, per parameter (blocks.{i}. prefixes kept):
//   condition_embedder.time_embedder.linear_{1,2}   time_embedding.{0,2}
//   condition_embedder.text_embedder.linear_{1,2}   text_embedding.{0,2}
//   condition_embedder.time_proj                    time_projection.1
//   scale_shift_table / proj_out                    head.modulation / head.head
//   blocks.{i}.scale_shift_table                    blocks.{i}.modulation
//   blocks.{i}.attn1.to_{q,k,v} / to_out.0 / norm_{q,k}   blocks.{i}.self_attn.{q,k,v} / o / norm_{q,k}
//   blocks.{i}.attn2.*                              blocks.{i}.cross_attn.* (the same sub-names)
//   blocks.{i}.norm2                                blocks.{i}.norm3 (the cross-attention norm; the
//                                                   other norms have no parameters in either layout)
//   blocks.{i}.ffn.net.0.proj / ffn.net.2           blocks.{i}.ffn.0 / ffn.2
//   patch_embedding                                 patch_embedding
#pragma once
#include <string>
#include <vector>

#include "loom/models/wan/dit.h"

namespace loom::models {

// Whether tensor names are diffusers' layout: any of them under condition_embedder.
bool is_diffusers_layout(const std::vector<std::string>& names);

// One diffusers name as Wan's; a CheckpointError for a name with no Wan counterpart (an image
// embedder, added k/v projections of an image-to-video model).
std::string wan_name_from_diffusers(const std::string& name);

// One Wan name as diffusers' (for export); a CheckpointError for a name that is not a WanModel
// parameter.
std::string diffusers_name_from_wan(const std::string& name);

// Copies every parameter of `model` from the safetensors of `model_dir`, in either layout:
// model.safetensors, diffusion_pytorch_model.safetensors, or the .safetensors.index.json of either
// (in that order of preference), converting dtype. Missing, mis-shaped, mis-typed and unexpected
// tensors are CheckpointErrors naming the tensor (as the file names it) and the file.
void load_wan_parameters(WanModel& model, const std::string& model_dir);

}  // namespace loom::models
