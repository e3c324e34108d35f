#include "loom/models/umt5/model.h"

#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "loom/checkpoint/hf_export.h"
#include "loom/models/weights.h"
#include "loom/util/errors.h"

namespace loom::models {

int64_t relative_position_bucket(int64_t relative_position, int64_t num_buckets, int64_t max_distance) {
  const int64_t half = num_buckets / 2;  // buckets per direction
  const int64_t direction = relative_position > 0 ? half : 0;
  const int64_t distance = relative_position < 0 ? -relative_position : relative_position;
  const int64_t max_exact = half / 2;
  if (distance < max_exact) return direction + distance;
  // HF evaluates this in float32 (log of a float32 ratio, divided by float32(log(max_distance /
  // max_exact)), times the logarithmic bucket count) and truncates toward zero: a rounding or a double
  // evaluation could land on the next bucket where the product is an integer in exact arithmetic.
  const float ratio = static_cast<float>(distance) / static_cast<float>(max_exact);
  const auto span =
      static_cast<float>(std::log(static_cast<double>(max_distance) / static_cast<double>(max_exact)));
  const float scaled = std::log(ratio) / span * static_cast<float>(half - max_exact);
  const int64_t large = max_exact + static_cast<int64_t>(scaled);
  return direction + std::min(large, half - 1);
}

at::Tensor relative_position_buckets(int64_t query_length, int64_t key_length, int64_t num_buckets,
                                     int64_t max_distance) {
  if (query_length == 0 || key_length == 0) return at::empty({query_length, key_length}, at::kLong);
  // The bucket of each relative position k - q in [-(Lq - 1), Lk - 1], then looked up per pair.
  std::vector<int64_t> table(query_length + key_length - 1);
  for (int64_t i = 0; i < static_cast<int64_t>(table.size()); ++i)
    table[i] = relative_position_bucket(i - (query_length - 1), num_buckets, max_distance);
  const at::Tensor relative = at::arange(key_length, at::kLong).unsqueeze(0) -
                              at::arange(query_length, at::kLong).unsqueeze(1);  // (Lq, Lk): k - q
  return at::tensor(table, at::kLong)
      .index_select(0, (relative + (query_length - 1)).flatten())
      .view({query_length, key_length});
}

at::Tensor umt5_extended_attention_mask(const at::Tensor& attention_mask, at::ScalarType dtype) {
  double lowest = 0;
  switch (dtype) {
    case at::kFloat:
      lowest = std::numeric_limits<float>::lowest();
      break;
    case at::kDouble:
      lowest = std::numeric_limits<double>::lowest();
      break;
    case at::kBFloat16:
      lowest = static_cast<float>(std::numeric_limits<c10::BFloat16>::lowest());
      break;
    case at::kHalf:
      lowest = static_cast<float>(std::numeric_limits<c10::Half>::lowest());
      break;
    default:
      throw ModelError(
          fmt::format("umT5 attention mask: {} is not a floating-point dtype", c10::toString(dtype)));
  }
  if (attention_mask.dim() != 2)
    throw ModelError(
        fmt::format("umT5 attention mask: expected (B, L), got {} dimensions", attention_mask.dim()));
  const at::Tensor mask = attention_mask.to(dtype).unsqueeze(1).unsqueeze(2);  // (B, 1, 1, L)
  // The lowest finite value rather than -inf: a row with no real key is uniform, not NaN.
  return (1.0 - mask) * lowest;
}

namespace {

// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))): HF's gelu_new, the tanh approximation (not erf),
// in HF's order of operations.
at::Tensor gelu_tanh(const at::Tensor& x) {
  return 0.5 * x * (1.0 + at::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * at::pow(x, 3.0))));
}

bool half_precision(at::ScalarType dtype) { return dtype == at::kBFloat16 || dtype == at::kHalf; }

}  // namespace

UMT5LayerNorm::UMT5LayerNorm(int64_t dim, double eps_, const at::TensorOptions& options) : eps(eps_) {
  weight = register_parameter("weight", at::empty({dim}, options));
}

at::Tensor UMT5LayerNorm::forward(const at::Tensor& x) const {
  const at::Tensor variance = x.to(at::kFloat).pow(2).mean(-1, /*keepdim=*/true);  // (..., 1) fp32
  at::Tensor normed = x * at::rsqrt(variance + eps);                               // (..., dim) fp32
  if (half_precision(weight.scalar_type())) normed = normed.to(weight.scalar_type());
  return weight * normed;
}

UMT5Attention::UMT5Attention(const UMT5Config& c, const at::TensorOptions& options)
    : num_heads(c.num_heads),
      d_kv(c.d_kv),
      num_buckets(c.relative_attention_num_buckets),
      max_distance(c.relative_attention_max_distance) {
  const int64_t inner = c.inner_dim();
  q = register_module("q", std::make_shared<nn::WeightHolder>(at::IntArrayRef{inner, c.d_model}, options));
  k = register_module("k", std::make_shared<nn::WeightHolder>(at::IntArrayRef{inner, c.d_model}, options));
  v = register_module("v", std::make_shared<nn::WeightHolder>(at::IntArrayRef{inner, c.d_model}, options));
  o = register_module("o", std::make_shared<nn::WeightHolder>(at::IntArrayRef{c.d_model, inner}, options));
  relative_attention_bias =
      register_module("relative_attention_bias",
                      std::make_shared<nn::WeightHolder>(
                          at::IntArrayRef{c.relative_attention_num_buckets, c.num_heads}, options));
}

at::Tensor UMT5Attention::compute_bias(int64_t query_length, int64_t key_length) const {
  const at::Tensor& table = relative_attention_bias->weight;  // (num_buckets, H)
  const at::Tensor buckets =
      relative_position_buckets(query_length, key_length, num_buckets, max_distance).to(table.device());
  return at::embedding(table, buckets).permute({2, 0, 1}).unsqueeze(0);  // (Lq, Lk, H) -> (1, H, Lq, Lk)
}

at::Tensor UMT5Attention::forward(const at::Tensor& x, const at::Tensor& mask, at::Tensor* probabilities,
                                  at::Tensor* bias) const {
  const int64_t batch = x.size(0), length = x.size(1);
  auto heads = [&](const at::Tensor& projected) {  // (B, L, H * d_kv) -> (B, H, L, d_kv)
    return projected.view({batch, length, num_heads, d_kv}).permute({0, 2, 1, 3});
  };
  const at::Tensor query = heads(at::linear(x, q->weight));
  const at::Tensor key = heads(at::linear(x, k->weight));
  const at::Tensor value = heads(at::linear(x, v->weight));
  at::Tensor scores = at::matmul(query, key.transpose(3, 2));     // (B, H, L, L), no 1/sqrt(d_kv)
  const at::Tensor position_bias = compute_bias(length, length);  // (1, H, L, L)
  if (bias) *bias = position_bias;
  scores = scores + (position_bias + mask);  // HF adds the mask to the bias, then the bias to the scores
  const at::Tensor weights = at::softmax(scores.to(at::kFloat), -1).to(scores.scalar_type());  // (B, H, L, L)
  if (probabilities) *probabilities = weights;
  const at::Tensor context =
      at::matmul(weights, value).permute({0, 2, 1, 3}).contiguous().view({batch, length, num_heads * d_kv});
  return at::linear(context, o->weight);  // (B, L, d_model)
}

UMT5LayerSelfAttention::UMT5LayerSelfAttention(const UMT5Config& c, const at::TensorOptions& options) {
  attention = register_module("SelfAttention", std::make_shared<UMT5Attention>(c, options));
  layer_norm = register_module("layer_norm",
                               std::make_shared<UMT5LayerNorm>(c.d_model, c.layer_norm_epsilon, options));
}

at::Tensor UMT5LayerSelfAttention::forward(const at::Tensor& x, const at::Tensor& mask,
                                           at::Tensor* probabilities, at::Tensor* bias) const {
  return x + attention->forward(layer_norm->forward(x), mask, probabilities, bias);
}

UMT5DenseGatedActDense::UMT5DenseGatedActDense(const UMT5Config& c, const at::TensorOptions& options) {
  wi_0 = register_module("wi_0",
                         std::make_shared<nn::WeightHolder>(at::IntArrayRef{c.d_ff, c.d_model}, options));
  wi_1 = register_module("wi_1",
                         std::make_shared<nn::WeightHolder>(at::IntArrayRef{c.d_ff, c.d_model}, options));
  // HF's _keep_in_fp32_modules = ["wo"]: the last projection of a half-precision model stays float32.
  const at::TensorOptions wo_options =
      half_precision(options.dtype().toScalarType()) ? options.dtype(at::kFloat) : options;
  wo = register_module("wo",
                       std::make_shared<nn::WeightHolder>(at::IntArrayRef{c.d_model, c.d_ff}, wo_options));
}

at::Tensor UMT5DenseGatedActDense::forward(const at::Tensor& x) const {
  at::Tensor hidden = gelu_tanh(at::linear(x, wi_0->weight)) * at::linear(x, wi_1->weight);  // (..., d_ff)
  if (hidden.scalar_type() != wo->weight.scalar_type()) hidden = hidden.to(wo->weight.scalar_type());
  return at::linear(hidden, wo->weight);  // (..., d_model)
}

UMT5LayerFF::UMT5LayerFF(const UMT5Config& c, const at::TensorOptions& options) {
  dense = register_module("DenseReluDense", std::make_shared<UMT5DenseGatedActDense>(c, options));
  layer_norm = register_module("layer_norm",
                               std::make_shared<UMT5LayerNorm>(c.d_model, c.layer_norm_epsilon, options));
}

at::Tensor UMT5LayerFF::forward(const at::Tensor& x) const {
  return x + dense->forward(layer_norm->forward(x));
}

UMT5Block::UMT5Block(const UMT5Config& c, const at::TensorOptions& options) {
  auto layer = register_module("layer", std::make_shared<nn::ModuleList>());
  self_attention = layer->append(std::make_shared<UMT5LayerSelfAttention>(c, options));
  feed_forward = layer->append(std::make_shared<UMT5LayerFF>(c, options));
}

at::Tensor UMT5Block::forward(const at::Tensor& x, const at::Tensor& mask, UMT5Trace* trace) const {
  at::Tensor probabilities, bias;
  const at::Tensor attended =
      self_attention->forward(x, mask, trace ? &probabilities : nullptr, trace ? &bias : nullptr);
  at::Tensor out = feed_forward->forward(attended);
  if (trace) {
    trace->after_attention.push_back(attended);
    trace->attentions.push_back(probabilities);
    trace->position_bias.push_back(bias);
    trace->block_outputs.push_back(out);
  }
  return out;
}

UMT5Stack::UMT5Stack(const UMT5Config& c, const at::TensorOptions& options) {
  auto blocks = register_module("block", std::make_shared<nn::ModuleList>());
  for (int64_t i = 0; i < c.num_layers; ++i)
    block.push_back(blocks->append(std::make_shared<UMT5Block>(c, options)));
  final_layer_norm = register_module(
      "final_layer_norm", std::make_shared<UMT5LayerNorm>(c.d_model, c.layer_norm_epsilon, options));
}

namespace {

const UMT5Context& umt5(const core::Context& context) { return static_cast<const UMT5Context&>(context); }

class EmbeddingLayer : public core::Layer {
 public:
  explicit EmbeddingLayer(const std::shared_ptr<nn::WeightHolder>& shared)
      : core::Layer("shared", shared), shared_(shared) {}
  core::Carry forward(core::Carry carry, const core::Context& context) const override {
    carry.set("hidden",
              at::embedding(shared_->weight, umt5(context).input_ids));  // (B, L, d_model), unscaled
    return carry;
  }

 private:
  std::shared_ptr<nn::WeightHolder> shared_;
};

class BlockLayer : public core::Layer {
 public:
  BlockLayer(size_t index, const std::shared_ptr<UMT5Block>& block)
      : core::Layer(fmt::format("encoder.block.{}", index), block), block_(block) {}
  bool block() const override { return true; }
  core::Carry forward(core::Carry carry, const core::Context& context) const override {
    carry.set("hidden", block_->forward(carry.take("hidden"), umt5(context).extended_mask));
    return carry;
  }

 private:
  std::shared_ptr<UMT5Block> block_;
};

class FinalNormLayer : public core::Layer {
 public:
  explicit FinalNormLayer(const std::shared_ptr<UMT5LayerNorm>& norm)
      : core::Layer("encoder.final_layer_norm", norm), norm_(norm) {}
  core::Carry forward(core::Carry carry, const core::Context& context) const override {
    (void)context;
    carry.set("hidden", norm_->forward(carry.take("hidden")));
    return carry;
  }

 private:
  std::shared_ptr<UMT5LayerNorm> norm_;
};

}  // namespace

UMT5EncoderModel::UMT5EncoderModel(const UMT5Config& c, const parallel::ParamOptions& options) : config(c) {
  if (options.dtype != at::kFloat && options.dtype != at::kBFloat16)
    throw ModelError(fmt::format("umT5 runs in float32 or bfloat16, not {}", c10::toString(options.dtype)));
  if (options.tp.size() > 1)
    throw ModelError(
        fmt::format("umT5 is a frozen helper held whole on every rank; it cannot be split over {} "
                    "tensor-parallel ranks",
                    options.tp.size()));
  const at::TensorOptions tensor_options = options.tensor_options();
  shared = register_module(
      "shared", std::make_shared<nn::WeightHolder>(at::IntArrayRef{c.vocab_size, c.d_model}, tensor_options));
  encoder = register_module("encoder", std::make_shared<UMT5Stack>(c, tensor_options));
  layers_.push_back(std::make_shared<EmbeddingLayer>(shared));
  for (size_t i = 0; i < encoder->block.size(); ++i)
    layers_.push_back(std::make_shared<BlockLayer>(i, encoder->block[i]));
  layers_.push_back(std::make_shared<FinalNormLayer>(encoder->final_layer_norm));
}

std::shared_ptr<const UMT5Context> UMT5EncoderModel::context(const at::Tensor& input_ids,
                                                             const at::Tensor& attention_mask) const {
  if (!input_ids.defined() || input_ids.dim() != 2 || !at::isIntegralType(input_ids.scalar_type(), false))
    throw ModelError("umT5: input_ids must be a (B, L) integer tensor");
  if (attention_mask.defined() && attention_mask.sizes() != input_ids.sizes())
    throw ModelError(fmt::format("umT5: attention_mask has shape [{}], input_ids [{}]",
                                 fmt::join(attention_mask.sizes(), ", "),
                                 fmt::join(input_ids.sizes(), ", ")));
  auto context = std::make_shared<UMT5Context>();
  context->input_ids = input_ids.to(at::kLong);
  if (input_ids.numel() > 0) {
    const int64_t low = context->input_ids.min().item<int64_t>(),
                  high = context->input_ids.max().item<int64_t>();
    if (low < 0 || high >= config.vocab_size)
      throw ModelError(fmt::format("umT5: token id {} is outside the vocabulary [0, {})",
                                   low < 0 ? low : high, config.vocab_size));
  }
  const at::Tensor mask = attention_mask.defined() ? attention_mask : at::ones_like(context->input_ids);
  context->extended_mask = umt5_extended_attention_mask(mask, shared->weight.scalar_type())
                               .to(shared->weight.device());  // (B, 1, 1, L)
  return context;
}

at::Tensor UMT5EncoderModel::forward(const at::Tensor& input_ids, const at::Tensor& attention_mask,
                                     UMT5Trace* trace) const {
  const auto c = context(input_ids, attention_mask);
  if (trace) {
    *trace = UMT5Trace{};
    trace->extended_mask = c->extended_mask;
  }
  at::Tensor x = at::embedding(shared->weight, c->input_ids);  // (B, L, d_model), no sqrt(d_model) scale
  for (const auto& block : encoder->block) {
    if (trace) trace->hidden_states.push_back(x);
    x = block->forward(x, c->extended_mask, trace);
  }
  x = encoder->final_layer_norm->forward(x);  // (B, L, d_model)
  if (trace) trace->hidden_states.push_back(x);
  return x;
}

nlohmann::json UMT5EncoderModel::hf_config() const {
  nlohmann::json hf = to_hf_config(config);
  hf["torch_dtype"] = checkpoint::hf_torch_dtype(shared->weight.scalar_type());
  return hf;
}

void init_umt5_parameters(UMT5EncoderModel& model, uint64_t seed) {
  const UMT5Config& c = model.config;
  auto ends_with = [](const std::string& name, const std::string& suffix) {
    return name.size() >= suffix.size() &&
           name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  at::NoGradGuard no_grad;
  for (auto& item : model.named_parameters(/*recurse=*/true)) {
    const std::string& name = item.key();
    at::Tensor param = item.value();
    double variance = 0;
    if (name.find("layer_norm") != std::string::npos) {
      param.fill_(1.0);
      continue;
    } else if (name == "shared.weight") {
      variance = 1.0;
    } else if (ends_with(name, "SelfAttention.q.weight")) {
      variance = 1.0 / static_cast<double>(c.d_model * c.d_kv);
    } else if (ends_with(name, "SelfAttention.k.weight") || ends_with(name, "SelfAttention.v.weight") ||
               ends_with(name, "relative_attention_bias.weight") || ends_with(name, "wi_0.weight") ||
               ends_with(name, "wi_1.weight")) {
      variance = 1.0 / static_cast<double>(c.d_model);
    } else if (ends_with(name, "SelfAttention.o.weight")) {
      variance = 1.0 / static_cast<double>(c.inner_dim());
    } else if (ends_with(name, "wo.weight")) {
      variance = 1.0 / static_cast<double>(c.d_ff);
    } else {
      throw ModelError(fmt::format("umT5 initialisation: no rule for parameter '{}'", name));
    }
    auto generator = at::make_generator<at::CPUGeneratorImpl>(derive_seed(seed, "init/" + name));
    at::Tensor values = at::empty(param.sizes(), at::kFloat);
    values.normal_(0.0, std::sqrt(variance), generator);
    param.copy_(values);
  }
}

}  // namespace loom::models
