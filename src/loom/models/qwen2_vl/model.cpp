#include "loom/models/qwen2_vl/model.h"

#include <fmt/ranges.h>

#include <algorithm>

#include "loom/checkpoint/hf_export.h"
#include "loom/dist/mappings.h"
#include "loom/models/qwen2_vl/decoding.h"
#include "loom/util/errors.h"

namespace loom::models {

namespace {

// Qwen2.5-VL's temporal position of a video's temporal patch k: k x seconds per patch x
// tokens_per_second, in float32 and truncated, as transformers computes it (an int64 range times a
// float32 tensor): at 1.3 fps and 2 tokens a second, patch 39 is at 120 where double arithmetic
// gives 119.
int64_t temporal_position(int64_t k, double second_per_grid, double tokens_per_second) {
  const float time = static_cast<float>(k) * static_cast<float>(second_per_grid);
  return static_cast<int64_t>(time * static_cast<float>(tokens_per_second));
}

}  // namespace

RopeIndex rope_index(const VisionLanguageInputs& in, const Qwen2VLConfig& config) {
  const at::Tensor& input_ids = in.input_ids;
  const std::vector<int64_t>& cu_seqlens = in.cu_seqlens;
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
  at::Tensor mask_tensor = in.attention_mask.defined() ? in.attention_mask.to(at::kLong).contiguous()
                                                       : at::ones({batch, length}, at::kLong);
  auto mask = mask_tensor.accessor<int64_t, 2>();
  auto grid_of = [](const at::Tensor& grid) {
    return grid.defined() ? grid.to(at::kLong).contiguous() : at::zeros({0, 3}, at::kLong);
  };
  const at::Tensor image_grids = grid_of(in.image_grid_thw), video_grids = grid_of(in.video_grid_thw);
  auto image_grid = image_grids.accessor<int64_t, 2>();
  auto video_grid = video_grids.accessor<int64_t, 2>();
  const int64_t videos = video_grids.size(0);
  if (!in.second_per_grid_ts.empty() && static_cast<int64_t>(in.second_per_grid_ts.size()) != videos)
    throw ModelError(
        fmt::format("second_per_grid_ts has {} entries for {} videos", in.second_per_grid_ts.size(), videos));
  // Qwen2.5-VL spaces the temporal axis by seconds; a still image has no time extent.
  const bool time_scaled = config.family() == VisionFamily::qwen2_5_vl;

  auto positions = at::ones({3, batch, length}, at::kLong);
  auto pos = positions.accessor<int64_t, 3>();
  auto deltas = at::zeros({batch, 1}, at::kLong);
  int64_t image = 0, video = 0;
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
      const bool is_video = token == config.tokens.video;
      if (token != config.tokens.image && !is_video) {
        for (int axis = 0; axis < 3; ++axis) pos[axis][b][real[k]] = next;
        max_pos = next++;
        ++k;
        continue;
      }
      const char* kind = is_video ? "video" : "image";
      int64_t& item = is_video ? video : image;
      const auto& grid = is_video ? video_grid : image_grid;
      const int64_t items = is_video ? videos : image_grids.size(0);
      if (item >= items)
        throw ModelError(
            fmt::format("sample {} has more {} blocks than {}_grid_thw rows ({})", b, kind, kind, items));
      const int64_t t = grid[item][0], h = grid[item][1] / merge, w = grid[item][2] / merge;
      const int64_t count = t * h * w;
      if (k + count > real.size())
        throw ModelError(fmt::format("sample {}: {} {} needs {} {} tokens, the sequence ends first", b, kind,
                                     item, count, kind));
      for (int64_t j = 1; j < count; ++j)
        if (segment_start[real[k + j]])
          throw ModelError(fmt::format("packed row: {} {} runs past the end of its sample at token {}", kind,
                                       item, real[k + j]));
      const double second_per_grid = !is_video ? 0.0
                                     : in.second_per_grid_ts.empty()
                                         ? 1.0
                                         : in.second_per_grid_ts[static_cast<size_t>(item)];
      const int64_t start = next;
      for (int64_t ti = 0; ti < t; ++ti) {
        const int64_t time =
            time_scaled ? temporal_position(ti, second_per_grid, config.vision.tokens_per_second) : ti;
        for (int64_t hi = 0; hi < h; ++hi)
          for (int64_t wi = 0; wi < w; ++wi) {
            const int64_t at_index = real[k++];
            if (ids[b][at_index] != token)
              throw ModelError(fmt::format("sample {}: {} {} has fewer {} tokens than its grid needs ({})", b,
                                           kind, item, kind, count));
            pos[0][b][at_index] = start + time;
            pos[1][b][at_index] = start + hi;
            pos[2][b][at_index] = start + wi;
            max_pos = std::max({max_pos, pos[0][b][at_index], pos[1][b][at_index], pos[2][b][at_index]});
          }
      }
      next = max_pos + 1;
      ++item;
    }
    // Packed: the last sample's delta, for generation after it.
    deltas[b][0] = max_pos + 1 - (cu_seqlens.empty() ? length : length - cu_seqlens[cu_seqlens.size() - 2]);
  }
  if (image != image_grids.size(0))
    throw ModelError(fmt::format("image_grid_thw has {} images but the input ids hold {} image blocks",
                                 image_grids.size(0), image));
  if (video != videos)
    throw ModelError(
        fmt::format("video_grid_thw has {} videos but the input ids hold {} video blocks", videos, video));
  return {positions, deltas};
}

RopeIndex rope_index(const at::Tensor& input_ids, const at::Tensor& image_grid_thw,
                     const at::Tensor& attention_mask, const Qwen2VLConfig& config,
                     const std::vector<int64_t>& cu_seqlens) {
  VisionLanguageInputs in;
  in.input_ids = input_ids;
  in.image_grid_thw = image_grid_thw;
  in.attention_mask = attention_mask;
  in.cu_seqlens = cu_seqlens;
  return rope_index(in, config);
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
  return rope_index(inputs, config).position_ids;
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
