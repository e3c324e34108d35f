#include "loom/models/wan/dit.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include <cmath>

#include "loom/checkpoint/hf_export.h"
#include "loom/memory/recompute.h"
#include "loom/models/wan/layers.h"
#include "loom/models/weights.h"
#include "loom/nn/attention.h"
#include "loom/util/errors.h"

namespace loom::models {

at::Tensor apply_linear(const WanLinear& layer, const at::Tensor& x) {
  return at::linear(x.to(layer.weight.scalar_type()), layer.weight, layer.bias);
}

at::Tensor apply_linear_fp32(const WanLinear& layer, const at::Tensor& x) {
  return at::linear(x.to(at::kFloat), layer.weight.to(at::kFloat), layer.bias.to(at::kFloat));
}

namespace {

std::shared_ptr<WanLinear> make_linear(int64_t in, int64_t out, const parallel::ParamOptions& options) {
  return std::make_shared<WanLinear>(in, out, /*bias=*/true, options);
}

// The options of a layer held whole on every rank.
parallel::ParamOptions whole(parallel::ParamOptions options) {
  options.tp = {};
  return options;
}

}  // namespace

WanPatchEmbedding::WanPatchEmbedding(const WanConfig& c, const parallel::ParamOptions& options)
    : patch(c.patch_size) {
  weight = register_parameter(
      "weight", at::empty({c.dim, c.in_dim, patch[0], patch[1], patch[2]}, options.tensor_options()));
  bias = register_parameter("bias", at::empty({c.dim}, options.tensor_options()));
}

at::Tensor WanPatchEmbedding::forward(const at::Tensor& latents, WanGrid* grid) const {
  const at::Tensor rows = patchify(latents.to(weight.scalar_type()), patch, grid);  // [B, L, C_in pt ph pw]
  return at::linear(rows, weight.reshape({weight.size(0), -1}), bias);              // [B, L, C]
}

WanTextEmbedding::WanTextEmbedding(const WanConfig& c, const parallel::ParamOptions& options) {
  linear_1 = register_module("0", make_linear(c.text_dim, c.dim, options));
  linear_2 = register_module("2", make_linear(c.dim, c.dim, options));
}

at::Tensor WanTextEmbedding::forward(const at::Tensor& text) const {
  return apply_linear(*linear_2, at::gelu(apply_linear(*linear_1, text), "tanh"));  // [B, text_len, C]
}

WanTimeEmbedding::WanTimeEmbedding(const WanConfig& c, const parallel::ParamOptions& options) {
  linear_1 = register_module("0", make_linear(c.freq_dim, c.dim, options));
  linear_2 = register_module("2", make_linear(c.dim, c.dim, options));
}

at::Tensor WanTimeEmbedding::forward(const at::Tensor& sinusoid) const {
  return apply_linear_fp32(*linear_2, at::silu(apply_linear_fp32(*linear_1, sinusoid)));  // [B, C] fp32
}

WanTimeProjection::WanTimeProjection(const WanConfig& c, const parallel::ParamOptions& options) : dim(c.dim) {
  linear = register_module("1", make_linear(c.dim, 6 * c.dim, options));
}

at::Tensor WanTimeProjection::forward(const at::Tensor& e) const {
  return apply_linear_fp32(*linear, at::silu(e.to(at::kFloat))).view({e.size(0), 6, dim});  // [B, 6, C]
}

WanAttention::WanAttention(const WanConfig& c, const parallel::ParamOptions& options)
    : num_heads(c.num_heads / options.tp.size()), head_dim(c.head_dim()) {
  q = register_module("q", make_linear(c.dim, c.dim, options));
  k = register_module("k", make_linear(c.dim, c.dim, options));
  v = register_module("v", make_linear(c.dim, c.dim, options));
  o = register_module("o", std::make_shared<WanRowLinear>(c.dim, c.dim, /*bias=*/true, options));
  if (c.qk_norm) {
    norm_q = register_module("norm_q", std::make_shared<nn::SplitRMSNorm>(c.dim, c.eps, options));
    norm_k = register_module("norm_k", std::make_shared<nn::SplitRMSNorm>(c.dim, c.eps, options));
  }
}

std::array<at::Tensor, 3> WanAttention::project(const at::Tensor& x, const at::Tensor& keys_from) const {
  at::Tensor query = apply_linear(*q, x), key = apply_linear(*k, keys_from);  // [B, L, C], [B, Lk, C]
  if (norm_q) {
    // RMSNorm over the whole width C (all heads at once, over every rank's), before the heads are split.
    query = norm_q->forward(query);
    key = norm_k->forward(key);
  }
  const at::Tensor value = apply_linear(*v, keys_from);
  auto heads = [&](const at::Tensor& t) { return t.view({t.size(0), t.size(1), num_heads, head_dim}); };
  return {heads(query), heads(key), heads(value)};
}

at::Tensor WanAttention::self_attention(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                        const std::vector<int64_t>& cu,
                                        const parallel::ContextAttention* context_parallel) const {
  const int64_t batch = x.size(0), length = x.size(1);
  const at::Tensor input = q->group().enter(x, 1);
  auto [query, key, value] = project(input, input);  // [B, L, H, d]
  query = apply_rotary_interleaved(query, cos, sin);
  key = apply_rotary_interleaved(key, cos, sin);
  auto tokens = [&](const at::Tensor& t) { return t.reshape({batch * length, num_heads, head_dim}); };
  const at::Tensor attended =
      context_parallel ? nn::context_attention(tokens(query), tokens(key), tokens(value), *context_parallel)
                       : nn::segment_attention(tokens(query), tokens(key), tokens(value), cu);  // (BL,H,d)
  return o->forward(attended.reshape({batch, length, num_heads * head_dim}).to(o->weight.scalar_type()),
                    1);  // [B, L, C]
}

at::Tensor WanAttention::cross_attention(const at::Tensor& x, const at::Tensor& text) const {
  const auto& group = q->group();
  const auto [query, key, value] =
      project(group.enter(x, 1), group.enter(text, 1));  // [B, L, H, d], [B, text_len, H, d] x 2
  const at::Tensor attended = models::cross_attention(query, key, value);  // [B, L, H, d]
  return o->forward(
      attended.reshape({x.size(0), x.size(1), num_heads * head_dim}).to(o->weight.scalar_type()), 1);
}

WanAttentionBlock::WanAttentionBlock(const WanConfig& c, const parallel::ParamOptions& options) : eps(c.eps) {
  modulation = register_parameter("modulation", at::empty({1, 6, c.dim}, options.tensor_options()));
  self_attn = register_module("self_attn", std::make_shared<WanAttention>(c, options));
  if (c.cross_attn_norm)
    norm3 = register_module("norm3", std::make_shared<nn::LayerNorm>(c.dim, c.eps, whole(options)));
  cross_attn = register_module("cross_attn", std::make_shared<WanAttention>(c, options));
  auto ffn = register_module("ffn", std::make_shared<nn::ModuleList>());
  ffn_in = ffn->add("0", make_linear(c.dim, c.ffn_dim, options));
  ffn_out = ffn->add("2", std::make_shared<WanRowLinear>(c.ffn_dim, c.dim, /*bias=*/true, options));
}

at::Tensor WanAttentionBlock::forward(const at::Tensor& x_in, const at::Tensor& e0, const at::Tensor& text,
                                      const at::Tensor& cos, const at::Tensor& sin,
                                      const std::vector<int64_t>& cu,
                                      const parallel::ContextAttention* context_parallel) const {
  at::Tensor x = x_in.to(at::kFloat);                          // [B, L, C] residual stream
  const at::Tensor mod = modulation.to(at::kFloat) + e0;       // [B, 6, C]
  auto part = [&](int64_t i) { return mod.narrow(1, i, 1); };  // [B, 1, C]
  const at::Tensor shift_1 = part(0), scale_1 = part(1), gate_1 = part(2);
  const at::Tensor shift_2 = part(3), scale_2 = part(4), gate_2 = part(5);

  // Under selective recompute the norms', modulations' and GELU's outputs, which the next operation
  // saves, are emptied after the block's forward and made again before its backward, in this order.
  const double eps_ = eps;
  auto modulated = [eps_](const at::Tensor& residual, const at::Tensor& scale, const at::Tensor& shift) {
    const at::Tensor normed =
        memory::refilled_in_backward(layer_norm_no_affine(residual, eps_),
                                     [residual, eps_] { return layer_norm_no_affine(residual, eps_); });
    auto run = [normed, scale, shift] { return normed * (1 + scale) + shift; };
    return memory::refilled_in_backward(run(), run);
  };
  const at::Tensor attn_in = modulated(x, scale_1, shift_1);
  x = x + self_attn->self_attention(attn_in, cos, sin, cu, context_parallel) * gate_1;

  at::Tensor cross_in = x;
  if (norm3) {
    auto run = [x, w = norm3->weight, b = norm3->bias, eps_] {
      return at::layer_norm(x, {x.size(-1)}, w.to(at::kFloat), b.to(at::kFloat), eps_);
    };
    cross_in = memory::refilled_in_backward(run(), run);
  }
  x = x + cross_attn->cross_attention(cross_in, text);

  const at::Tensor ffn_in_x = modulated(x, scale_2, shift_2);
  const at::Tensor projected = apply_linear(*ffn_in, ffn_in->group().enter(ffn_in_x, 1));
  auto gelu = [projected] { return at::gelu(projected, "tanh"); };
  const at::Tensor hidden = memory::refilled_in_backward(gelu(), gelu);
  const at::Tensor ffn_y = ffn_out->forward(hidden, 1);
  return x + ffn_y * gate_2;  // [B, L, C] float32
}

WanHead::WanHead(const WanConfig& c, const parallel::ParamOptions& options) : eps(c.eps) {
  modulation = register_parameter("modulation", at::empty({1, 2, c.dim}, options.tensor_options()));
  head = register_module("head", make_linear(c.dim, c.patch_out_width(), options));
}

at::Tensor WanHead::forward(const at::Tensor& x, const at::Tensor& e) const {
  const at::Tensor mod = modulation.to(at::kFloat) + e.to(at::kFloat).unsqueeze(1);  // [B, 2, C]
  const at::Tensor shift = mod.narrow(1, 0, 1), scale = mod.narrow(1, 1, 1);         // [B, 1, C]
  return apply_linear_fp32(*head,
                           layer_norm_no_affine(x, eps) * (1 + scale) + shift);  // [B, L, pt ph pw C_out]
}

WanModel::WanModel(const WanConfig& c, const parallel::ParamOptions& options)
    : config(c), context_parallel(options.cp) {
  if (options.dtype != at::kFloat && options.dtype != at::kBFloat16)
    throw ModelError(
        fmt::format("Wan DiT runs in float32 or bfloat16, not {}", c10::toString(options.dtype)));
  const int64_t tp = options.tp.size();
  if (tp > 1 && options.tp.sequence_parallel)
    throw ModelError(
        "Wan DiT: sequence parallelism is not supported (its residual stream stays whole under tp)");
  if (c.num_heads % tp != 0 || c.ffn_dim % tp != 0)
    throw ModelError(
        fmt::format("Wan DiT: {} tensor-parallel ranks must divide num_heads ({}) and ffn_dim ({})", tp,
                    c.num_heads, c.ffn_dim));
  patch_embedding =
      register_module("patch_embedding", std::make_shared<WanPatchEmbedding>(c, whole(options)));
  text_embedding = register_module("text_embedding", std::make_shared<WanTextEmbedding>(c, whole(options)));
  time_embedding = register_module("time_embedding", std::make_shared<WanTimeEmbedding>(c, whole(options)));
  time_projection =
      register_module("time_projection", std::make_shared<WanTimeProjection>(c, whole(options)));
  auto list = register_module("blocks", std::make_shared<nn::ModuleList>());
  for (int64_t i = 0; i < c.num_layers; ++i)
    blocks.push_back(list->append(std::make_shared<WanAttentionBlock>(c, options)));
  head = register_module("head", std::make_shared<WanHead>(c, whole(options)));
  layers_ = wan_layers(*this);
}

std::shared_ptr<const WanContext> WanModel::context(const at::Tensor& latents, const at::Tensor& timesteps,
                                                    const at::Tensor& text) const {
  return wan_context(config, latents, timesteps, text);
}

std::shared_ptr<const WanContext> WanModel::sharded_context(const at::Tensor& latents,
                                                            const at::Tensor& timesteps,
                                                            const at::Tensor& text) const {
  return wan_context(config, latents, timesteps, text, &context_parallel);
}

std::shared_ptr<const DenoiserContext> WanModel::context(const at::Tensor& latents,
                                                         const at::Tensor& timesteps, const at::Tensor& text,
                                                         bool sharded) const {
  return sharded ? sharded_context(latents, timesteps, text) : context(latents, timesteps, text);
}

at::Tensor WanModel::output_tokens(const at::Tensor& target) const {
  return head_tokens(target, config.patch_size);
}

at::Tensor WanModel::text_batch(const std::vector<at::Tensor>& captions) const {
  return pad_text(captions, config.text_len);
}

std::array<int64_t, 3> WanModel::patch_size() const { return config.patch_size; }

int64_t WanModel::tokens(const at::Tensor& latents) const {
  return latent_grid(latents, config.patch_size).tokens();
}

double WanModel::training_flops(const at::Tensor& latents) const {
  return training_flops(latent_grid(latents, config.patch_size), latents.size(0));
}

at::Tensor WanModel::forward(const at::Tensor& latents, const at::Tensor& timesteps,
                             const at::Tensor& text) const {
  const auto c = context(latents, timesteps, text);
  const at::Tensor e = time_embedding->forward(wan_sinusoid(config.freq_dim, c->timesteps));  // [B, C]
  const at::Tensor e0 = time_projection->forward(e);                                          // [B, 6, C]
  const at::Tensor words = text_embedding->forward(c->text);           // [B, text_len, C]
  at::Tensor x = patch_embedding->forward(c->latents).to(at::kFloat);  // [B, L, C]
  for (const auto& block : blocks) x = block->forward(x, e0, words, c->rope_cos, c->rope_sin, c->self_cu);
  return unpatchify(head->forward(x, e), c->grid, config.patch_size, config.out_dim);  // [B, C_out, T, H, W]
}

nlohmann::json WanModel::hf_config() const {
  nlohmann::json hf = to_hf_config(config);
  hf["torch_dtype"] = checkpoint::hf_torch_dtype(head->head->weight.scalar_type());
  return hf;
}

std::vector<std::string> WanModel::freeze_examples() const {
  return {
      "patch_embedding", "text_embedding", "time_embedding", "time_projection", "blocks", "blocks.0", "head"};
}

namespace {

bool starts_with(const std::string& s, const std::string& prefix) { return s.rfind(prefix, 0) == 0; }
bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// What init_wan_parameters draws for one parameter.
enum class InitRule { zeros, ones, normal, xavier };

struct Init {
  InitRule rule;
  double std = 0;  // normal
};

Init init_of(const std::string& name, const at::Tensor& param) {
  if (name == "head.head.weight") return {InitRule::zeros};
  if (ends_with(name, ".bias")) return {InitRule::zeros};
  if (ends_with(name, "modulation"))
    return {InitRule::normal, 1.0 / std::sqrt(static_cast<double>(param.size(-1)))};
  if (ends_with(name, ".norm_q.weight") || ends_with(name, ".norm_k.weight") ||
      ends_with(name, ".norm3.weight"))
    return {InitRule::ones};
  if ((starts_with(name, "text_embedding.") || starts_with(name, "time_embedding.")) &&
      ends_with(name, ".weight"))
    return {InitRule::normal, 0.02};
  if (ends_with(name, ".weight") && (param.dim() == 2 || name == "patch_embedding.weight"))
    return {InitRule::xavier};
  throw ModelError(fmt::format("init_wan_parameters: no initialisation rule for parameter '{}'", name));
}

}  // namespace

void init_wan_parameters(WanModel& model, uint64_t seed) {
  at::NoGradGuard no_grad;
  const auto layouts = parallel::shard_layouts(model);
  for (auto& [name, param] : named_parameters(model)) {
    const Init init = init_of(name, param);
    if (param.is_meta()) continue;
    if (init.rule == InitRule::zeros) {
      param.zero_();
    } else if (init.rule == InitRule::ones) {
      param.fill_(1.0);
    } else {
      const auto layout = layouts.find(name);
      auto generator = at::make_generator<at::CPUGeneratorImpl>(derive_seed(seed, "init/" + name));
      at::Tensor values =
          at::empty(layout == layouts.end() ? param.sizes().vec() : layout->second.whole_shape(param.sizes()),
                    at::kFloat);
      if (init.rule == InitRule::normal) {
        values.normal_(0.0, init.std, generator);
      } else {
        // Xavier-uniform over the whole weight as a matrix [out, in] (the patch embedding's kernel
        // flattened).
        const double fan_out = static_cast<double>(values.size(0));
        const double fan_in = static_cast<double>(values.numel()) / fan_out;
        const double bound = std::sqrt(6.0 / (fan_in + fan_out));
        values.uniform_(-bound, bound, generator);
      }
      param.copy_(layout == layouts.end() ? values : layout->second.slice(values));
    }
  }
}

double WanModel::training_flops(const WanGrid& grid, int64_t batch) const {
  const double c = static_cast<double>(config.dim), f = static_cast<double>(config.ffn_dim);
  const double l = static_cast<double>(grid.tokens()), text = static_cast<double>(config.text_len);
  // Multiply-adds of one sample's forward.
  const double per_token_block = 4 * c * c + 2 * c * c + 2 * c * f + 2 * l * c + 2 * text * c;
  const double per_block = l * per_token_block + 2 * text * c * c;  // + the cross-attention's k and v
  const double outside = l * c * static_cast<double>(config.patch_in_width() + config.patch_out_width()) +
                         text * (static_cast<double>(config.text_dim) * c + c * c);
  return 3.0 * 2.0 * static_cast<double>(batch) *
         (static_cast<double>(config.num_layers) * per_block + outside);
}

}  // namespace loom::models
