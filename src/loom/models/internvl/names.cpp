#include "loom/models/internvl/names.h"

#include <regex>

#include "loom/checkpoint/safetensors.h"

namespace loom::models {

namespace {

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }

// The -hf name with `from` at its start replaced by `to`, or "" when it does not start so.
std::string swapped(const std::string& name, const std::string& from, const std::string& to) {
  return starts_with(name, from) ? to + name.substr(from.size()) : "";
}

// The remote-code name of an -hf vision tower or projector parameter (transformers'
// convert_internvl_weights_to_hf.py, read backwards), with the rows of a fused q/k/v.
FileTensor original(const std::string& name, int64_t width) {
  static const std::regex layer(R"(^vision_tower\.encoder\.layer\.(\d+)\.(.*)$)");
  std::smatch m;
  if (std::regex_match(name, m, layer)) {
    const std::string base = "vision_model.encoder.layers." + m[1].str() + ".";
    const std::string rest = m[2].str();
    static const std::regex qkv(R"(^attention\.([qkv])_proj\.(weight|bias)$)");
    std::smatch p;
    if (std::regex_match(rest, p, qkv)) {
      const int64_t slot = p[1].str() == "q" ? 0 : p[1].str() == "k" ? 1 : 2;
      return {base + "attn.qkv." + p[2].str(), slot * width, (slot + 1) * width};
    }
    for (const auto& [from, to] :
         std::vector<std::pair<std::string, std::string>>{{"attention.projection_layer.", "attn.proj."},
                                                          {"attention.q_norm.", "attn.q_norm."},
                                                          {"attention.k_norm.", "attn.k_norm."},
                                                          {"layernorm_before.", "norm1."},
                                                          {"layernorm_after.", "norm2."},
                                                          {"mlp.", "mlp."}})
      if (starts_with(rest, from)) return {base + to + rest.substr(from.size())};
    if (rest == "lambda_1") return {base + "ls1"};
    if (rest == "lambda_2") return {base + "ls2"};
    return {name};
  }
  if (name == "vision_tower.embeddings.cls_token") return {"vision_model.embeddings.class_embedding"};
  if (name == "vision_tower.embeddings.position_embeddings")
    return {"vision_model.embeddings.position_embedding"};
  if (const auto n = swapped(name, "vision_tower.embeddings.patch_embeddings.projection.",
                             "vision_model.embeddings.patch_embedding.");
      !n.empty())
    return {n};
  for (const auto& [from, to] :
       std::vector<std::pair<std::string, std::string>>{{"multi_modal_projector.layer_norm.", "mlp1.0."},
                                                        {"multi_modal_projector.linear_1.", "mlp1.1."},
                                                        {"multi_modal_projector.linear_2.", "mlp1.3."}})
    if (const auto n = swapped(name, from, to); !n.empty()) return {n};
  return {name};  // language_model.* is named alike
}

}  // namespace

InternVLLayout internvl_layout(const std::vector<std::string>& file_names) {
  for (const auto& name : file_names) {
    if (starts_with(name, "vision_model.") || starts_with(name, "mlp1.")) return InternVLLayout::original;
    if (starts_with(name, "model.vision_tower.") || starts_with(name, "model.language_model."))
      return InternVLLayout::transformers5;
  }
  return InternVLLayout::hf;
}

FileTensor internvl_file_tensor(const std::string& name, InternVLLayout layout, int64_t vision_width) {
  switch (layout) {
    case InternVLLayout::hf:
      return {name};
    case InternVLLayout::original:
      return original(name, vision_width);
    case InternVLLayout::transformers5:
      if (name == "language_model.lm_head.weight") return {"lm_head.weight"};
      if (const auto n = swapped(name, "language_model.model.", "model.language_model."); !n.empty())
        return {n};
      return {"model." + name};
  }
  return {name};
}

void load_internvl_parameters(torch::nn::Module& model, const std::string& dir, int64_t vision_width) {
  const InternVLLayout layout = internvl_layout(checkpoint::WeightSource(dir).names());
  load_parameters(model, dir,
                  [&](const std::string& name) { return internvl_file_tensor(name, layout, vision_width); });
}

}  // namespace loom::models
