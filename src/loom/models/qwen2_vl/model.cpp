#include "loom/models/qwen2_vl/model.h"

#include <fmt/ranges.h>

#include <algorithm>

#include "loom/checkpoint/hf_export.h"
#include "loom/dist/mappings.h"
#include "loom/models/qwen2_vl/decoding.h"
#include "loom/util/errors.h"

namespace loom::models {

RopeIndex rope_index(const at::Tensor& input_ids, const at::Tensor& image_grid_thw,
                     const at::Tensor& attention_mask, const Qwen2VLConfig& config,
                     const std::vector<int64_t>& cu_seqlens) {
  const int64_t batch = input_ids.size(0), length = input_ids.size(1);
  if (!cu_seqlens.empty() && (batch != 1 || cu_seqlens.front() != 0 || cu_seqlens.back() != length ||
                              !std::is_sorted(cu_seqlens.begin(), cu_seqlens.end())))
    throw ModelError(
        fmt::format("packed position ids need one row and cu_seqlens rising from 0 to its {} "
                    "tokens; got {} rows, cu_seqlens {}",
                    length, batch, fmt::join(cu_seqlens, ",")));
  std::vector<bool> segment_start(length + 1, false);
  for (int64_t start : cu_seqlens) segment_start[start] = true;
  const int64_t merge = config.vision.spatial_merge_size;
  auto ids_tensor = input_ids.to(at::kLong).contiguous();
  auto ids = ids_tensor.accessor<int64_t, 2>();
  at::Tensor mask_tensor = attention_mask.defined() ? attention_mask.to(at::kLong).contiguous()
                                                    : at::ones({batch, length}, at::kLong);
  auto mask = mask_tensor.accessor<int64_t, 2>();
  at::Tensor grid_tensor =
      image_grid_thw.defined() ? image_grid_thw.to(at::kLong).contiguous() : at::zeros({0, 3}, at::kLong);
  auto grid = grid_tensor.accessor<int64_t, 2>();
  // Qwen2.5-VL spaces the temporal axis by seconds; a still image has no time extent.
  const bool time_scaled = config.family() == VisionFamily::qwen2_5_vl;

  auto positions = at::ones({3, batch, length}, at::kLong);
  auto pos = positions.accessor<int64_t, 3>();
  auto deltas = at::zeros({batch, 1}, at::kLong);
  int64_t image = 0;
  for (int64_t b = 0; b < batch; ++b) {
    std::vector<int64_t> real;  // indices of real tokens
    for (int64_t i = 0; i < length; ++i)
      if (mask[b][i]) real.push_back(i);
    int64_t next = 0;  // next position id to hand out
    int64_t max_pos = -1;
    size_t k = 0;
    while (k < real.size()) {
      if (segment_start[real[k]]) {  // a packed sample starts afresh
        next = 0;
        max_pos = -1;
      }
      const int64_t token = ids[b][real[k]];
      if (token == config.tokens.video)
        throw ModelError("video inputs are not supported by this version of Loom's Qwen2-VL (sample " +
                         std::to_string(b) + ")");
      if (token != config.tokens.image) {
        for (int axis = 0; axis < 3; ++axis) pos[axis][b][real[k]] = next;
        max_pos = next++;
        ++k;
        continue;
      }
      if (image >= grid_tensor.size(0))
        throw ModelError(fmt::format("sample {} has more image blocks than image_grid_thw rows ({})", b,
                                     grid_tensor.size(0)));
      const int64_t t = grid[image][0], h = grid[image][1] / merge, w = grid[image][2] / merge;
      const int64_t count = t * h * w;
      if (k + count > real.size())
        throw ModelError(fmt::format("sample {}: image {} needs {} image tokens, the sequence ends first", b,
                                     image, count));
      for (int64_t j = 1; j < count; ++j)
        if (segment_start[real[k + j]])
          throw ModelError(fmt::format("packed row: image {} runs past the end of its sample at token {}",
                                       image, real[k + j]));
      const int64_t start = next;
      for (int64_t ti = 0; ti < t; ++ti)
        for (int64_t hi = 0; hi < h; ++hi)
          for (int64_t wi = 0; wi < w; ++wi) {
            const int64_t at_index = real[k++];
            if (ids[b][at_index] != config.tokens.image)
              throw ModelError(fmt::format(
                  "sample {}: image {} has fewer image tokens than its grid needs ({})", b, image, count));
            pos[0][b][at_index] = start + (time_scaled ? 0 : ti);
            pos[1][b][at_index] = start + hi;
            pos[2][b][at_index] = start + wi;
            max_pos = std::max({max_pos, pos[0][b][at_index], pos[1][b][at_index], pos[2][b][at_index]});
          }
      next = max_pos + 1;
      ++image;
    }
    // Packed: the last sample's delta, for generation after it.
    deltas[b][0] = max_pos + 1 - (cu_seqlens.empty() ? length : length - cu_seqlens[cu_seqlens.size() - 2]);
  }
  if (image != grid_tensor.size(0))
    throw ModelError(fmt::format("image_grid_thw has {} images but the input ids hold {} image blocks",
                                 grid_tensor.size(0), image));
  return {positions, deltas};
}

Qwen2VLForConditionalGeneration::Qwen2VLForConditionalGeneration(
    const Qwen2VLConfig& c, const parallel::ParamOptions& options,
    const std::optional<parallel::TensorParallelGroup>& vision_tp)
    : config(c) {
  parallel::ParamOptions vision_options = options;
  if (vision_tp) vision_options.tp = *vision_tp;
  visual = register_module("visual", std::make_shared<VisionTransformer>(c.vision, vision_options));
  model = register_module("model", std::make_shared<TextModel>(c.text, options));
  if (auto head = make_lm_head(c.text, options)) lm_head = register_module("lm_head", head);
  layers_ = qwen2vl_layers(visual, model, c);
}

void Qwen2VLForConditionalGeneration::to(torch::Device device, bool non_blocking) {
  torch::nn::Module::to(device, non_blocking);
  device_ = device;
}

std::shared_ptr<const Qwen2VLContext> Qwen2VLForConditionalGeneration::context(
    const VisionLanguageInputs& inputs, KVCache* cache) const {
  return qwen2vl_context(inputs, config, visual->tp, model->tp, device_, cache);
}

std::shared_ptr<const VisionLanguageContext> Qwen2VLForConditionalGeneration::sharded_context(
    const VisionLanguageInputs& inputs, const parallel::ContextParallelGroup& cp) const {
  return qwen2vl_context(inputs, config, visual->tp, model->tp, device_, nullptr, &cp);
}

at::Tensor Qwen2VLForConditionalGeneration::image_embeddings(const at::Tensor& pixel_values,
                                                             const at::Tensor& image_grid_thw) const {
  if (!pixel_values.defined() || pixel_values.size(0) == 0)
    return at::empty({0, config.vision.out_width}, model->embed_tokens->weight.options());
  VisionLanguageInputs vision;  // no input ids: only the vision layers run
  vision.pixel_values = pixel_values;
  vision.image_grid_thw = image_grid_thw;
  return core::run_layers(layers_, {}, *context(vision)).get("image_embeds");
}

at::Tensor Qwen2VLForConditionalGeneration::hidden_states(const VisionLanguageInputs& inputs) const {
  return core::run_layers(layers_, {}, *context(inputs)).get("hidden");
}

at::Tensor Qwen2VLForConditionalGeneration::logits(const at::Tensor& hidden) const {
  return head_logits(*model, lm_head.get(), hidden);
}

at::Tensor Qwen2VLForConditionalGeneration::whole_logits(const at::Tensor& hidden) const {
  return whole_head_logits(*model, lm_head.get(), hidden);
}

double Qwen2VLForConditionalGeneration::training_flops(const std::vector<int64_t>& sequence_lengths,
                                                       const at::Tensor& image_grid_thw) const {
  // 2 FLOPs per multiply-add in the forward, 3x for forward + backward.
  const auto& t = config.text;
  const auto& v = config.vision;
  const double kv = t.num_kv_heads * t.head_dim();
  const double per_token_layer =
      2.0 * t.hidden_size * (t.hidden_size * 2 + kv * 2) + 2.0 * 3 * t.hidden_size * t.intermediate_size;
  const double per_token = t.num_layers * per_token_layer + 2.0 * t.hidden_size * t.vocab_size;
  double flops = 0;
  for (auto l : sequence_lengths)
    flops += l * per_token + t.num_layers * 2.0 * 2.0 * static_cast<double>(l) * l * t.hidden_size;
  if (image_grid_thw.defined() && image_grid_thw.numel() > 0) {
    const double mlp_mats = v.family == VisionFamily::qwen2_vl ? 2 : 3;
    const double per_patch =
        2.0 * v.patch_row_width() * v.width +
        v.depth * (2.0 * v.width * 4 * v.width + 2.0 * mlp_mats * v.width * v.mlp_hidden) +
        (2.0 * v.merged_width() * v.merged_width() + 2.0 * v.merged_width() * v.out_width) /
            (v.spatial_merge_size * v.spatial_merge_size);
    auto grid = image_grid_thw.to(at::kLong).contiguous();
    auto g = grid.accessor<int64_t, 2>();
    for (int64_t i = 0; i < grid.size(0); ++i) {
      const double frame = static_cast<double>(g[i][1]) * g[i][2];
      flops += g[i][0] * (frame * per_patch + v.depth * 2.0 * 2.0 * frame * frame * v.width);
    }
  }
  return 3.0 * flops;
}

at::Tensor Qwen2VLForConditionalGeneration::position_ids(const VisionLanguageInputs& inputs) const {
  if (inputs.position_ids.defined()) return inputs.position_ids;
  return rope_index(inputs.input_ids, inputs.image_grid_thw, inputs.attention_mask, config, inputs.cu_seqlens)
      .position_ids;
}

std::unique_ptr<VisionLanguageDecoder> Qwen2VLForConditionalGeneration::decoder() const {
  return std::make_unique<Qwen2VLDecoder>(*this);
}

std::vector<SpecialToken> Qwen2VLForConditionalGeneration::special_tokens() const {
  return {{"image_token_id", config.tokens.image, "<|image_pad|>"},
          {"video_token_id", config.tokens.video, "<|video_pad|>"},
          {"vision_start_token_id", config.tokens.vision_start, "<|vision_start|>"},
          {"vision_end_token_id", config.tokens.vision_end, "<|vision_end|>"}};
}

nlohmann::json Qwen2VLForConditionalGeneration::hf_config() const {
  nlohmann::json hf = to_hf_config(config);
  hf["torch_dtype"] = checkpoint::hf_torch_dtype(lm_head_weight().scalar_type());
  return hf;
}

std::vector<std::string> Qwen2VLForConditionalGeneration::freeze_examples() const {
  std::vector<std::string> out{"visual", "visual.merger", "model", "model.layers.0"};
  if (lm_head) out.push_back("lm_head");  // a tied head is model.embed_tokens
  return out;
}

}  // namespace loom::models
