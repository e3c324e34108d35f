// The umT5 encoder (HuggingFace UMT5EncoderModel), Wan2.1's frozen text encoder: token embedding
// without scale, pre-norm blocks each with its own relative position bias, final T5 RMS norm.
//
// Parameters carry HuggingFace names (shared.weight, encoder.block.{i}.layer.0.SelfAttention.q.weight,
// ..., encoder.final_layer_norm.weight); the tied encoder.embed_tokens.weight is `shared` itself and not
// a parameter of its own. A frozen helper: whole on every rank (no tensor parallelism), float32 or
// bfloat16, run under the caller's at::NoGradGuard.
#pragma once
#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <memory>
#include <string>
#include <vector>

#include "loom/core/layer.h"
#include "loom/core/model.h"
#include "loom/models/generator.h"
#include "loom/models/umt5/config.h"
#include "loom/nn/module_list.h"
#include "loom/parallel/tensor.h"

namespace loom::models {

// HuggingFace's bidirectional T5 bucket of relative_position = key - query: the first half of the
// buckets for keys at or before the query, the second half for keys after it; in each half, distances
// below num_buckets/4 get a bucket each, longer ones share logarithmically sized buckets up to
// max_distance (the log in float32, truncated toward zero, as HF computes it), the rest the last.
int64_t relative_position_bucket(int64_t relative_position, int64_t num_buckets, int64_t max_distance);

// The bucket of every (query, key) pair: (query_length, key_length) int64, [q][k] = bucket(k - q).
at::Tensor relative_position_buckets(int64_t query_length, int64_t key_length, int64_t num_buckets,
                                     int64_t max_distance);

// The additive key mask of a (B, L) 0/1 attention mask: (B, 1, 1, L) in `dtype`, 0 for real keys and
// the dtype's lowest finite value (not -inf) for padded ones, as HF's get_extended_attention_mask.
at::Tensor umt5_extended_attention_mask(const at::Tensor& attention_mask, at::ScalarType dtype);

// What a forward pass may record besides its result, for comparing against HuggingFace's outputs.
struct UMT5Trace {
  at::Tensor extended_mask;                 // (B, 1, 1, L)
  std::vector<at::Tensor> hidden_states;    // HF's tuple: each block's input (B, L, d_model), then the
                                            // final-normed output (= the result), num_layers + 1 in all
  std::vector<at::Tensor> after_attention;  // per block: x + o(attn(norm(x))), before the FFN (B, L, d_model)
  std::vector<at::Tensor> block_outputs;    // per block, raw (B, L, d_model)
  std::vector<at::Tensor> attentions;       // per block: softmax probabilities (B, H, L_q, L_k)
  std::vector<at::Tensor> position_bias;  // per block: its own relative bias before the mask (1, H, L_q, L_k)
};

// T5's RMS norm: weight * x * rsqrt(mean(x^2) + eps), statistics in float32, no mean subtracted, no
// bias; the normed x is cast to a half-precision weight's dtype before the product (and otherwise
// stays float32). Not nn::RMSNorm, which casts back to x's dtype instead.
class UMT5LayerNorm : public torch::nn::Module {
 public:
  UMT5LayerNorm(int64_t dim, double eps, const at::TensorOptions& options);
  at::Tensor forward(const at::Tensor& x) const;  // (..., dim) -> (..., dim)
  at::Tensor weight;                              // (dim)
  double eps;
};

// Self-attention with a relative position bias, no biases, and no 1/sqrt(d_kv) scaling of the scores
// (T5 folds it into the weights' initialisation).
class UMT5Attention : public torch::nn::Module {
 public:
  UMT5Attention(const UMT5Config& config, const at::TensorOptions& options);
  // This layer's bias for every (query, key) pair: (1, H, query_length, key_length).
  at::Tensor compute_bias(int64_t query_length, int64_t key_length) const;
  // x (B, L, d_model), mask (B, 1, 1, L) additive -> (B, L, d_model). `probabilities` and `bias`, when
  // given, receive the softmax (B, H, L, L) and compute_bias(L, L).
  at::Tensor forward(const at::Tensor& x, const at::Tensor& mask, at::Tensor* probabilities = nullptr,
                     at::Tensor* bias = nullptr) const;
  std::shared_ptr<nn::WeightHolder> q, k, v;  // (H * d_kv, d_model); head h owns rows h*d_kv..(h+1)*d_kv
  std::shared_ptr<nn::WeightHolder> o;        // (d_model, H * d_kv)
  std::shared_ptr<nn::WeightHolder> relative_attention_bias;  // (num_buckets, H)
  int64_t num_heads, d_kv, num_buckets, max_distance;
};

// layer.0: x + SelfAttention(layer_norm(x)).
class UMT5LayerSelfAttention : public torch::nn::Module {
 public:
  UMT5LayerSelfAttention(const UMT5Config& config, const at::TensorOptions& options);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& mask, at::Tensor* probabilities = nullptr,
                     at::Tensor* bias = nullptr) const;  // (B, L, d_model) -> (B, L, d_model)
  std::shared_ptr<UMT5Attention> attention;              // SelfAttention
  std::shared_ptr<UMT5LayerNorm> layer_norm;
};

// Gated-GELU: wo(gelu_tanh(wi_0 x) * wi_1 x). As HF, wo stays float32 in a half-precision model and
// its input is cast to it.
class UMT5DenseGatedActDense : public torch::nn::Module {
 public:
  UMT5DenseGatedActDense(const UMT5Config& config, const at::TensorOptions& options);
  at::Tensor forward(const at::Tensor& x) const;  // (..., d_model) -> (..., d_model)
  std::shared_ptr<nn::WeightHolder> wi_0, wi_1;   // (d_ff, d_model); the GELU is on wi_0
  std::shared_ptr<nn::WeightHolder> wo;           // (d_model, d_ff)
};

// layer.1: x + DenseReluDense(layer_norm(x)).
class UMT5LayerFF : public torch::nn::Module {
 public:
  UMT5LayerFF(const UMT5Config& config, const at::TensorOptions& options);
  at::Tensor forward(const at::Tensor& x) const;  // (B, L, d_model) -> (B, L, d_model)
  std::shared_ptr<UMT5DenseGatedActDense> dense;  // DenseReluDense
  std::shared_ptr<UMT5LayerNorm> layer_norm;
};

// encoder.block.{i}: layer.0 (self-attention), then layer.1 (feed-forward).
class UMT5Block : public torch::nn::Module {
 public:
  UMT5Block(const UMT5Config& config, const at::TensorOptions& options);
  // x (B, L, d_model), mask (B, 1, 1, L) -> (B, L, d_model); records this block's entries in `trace`.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& mask, UMT5Trace* trace = nullptr) const;
  std::shared_ptr<UMT5LayerSelfAttention> self_attention;  // layer.0
  std::shared_ptr<UMT5LayerFF> feed_forward;               // layer.1
};

// encoder.*: the blocks and the final norm.
class UMT5Stack : public torch::nn::Module {
 public:
  UMT5Stack(const UMT5Config& config, const at::TensorOptions& options);
  std::vector<std::shared_ptr<UMT5Block>> block;
  std::shared_ptr<UMT5LayerNorm> final_layer_norm;
};

// What the layers of one forward pass read.
struct UMT5Context : core::Context {
  at::Tensor input_ids;      // (B, L) int64
  at::Tensor extended_mask;  // (B, 1, 1, L), the model's dtype
};

// As layers (core/layer.h), carrying "hidden" (B, L, d_model):
//   shared               input ids -> hidden (the embedding, unscaled)
//   encoder.block.<i>    hidden -> hidden
//   encoder.final_layer_norm  hidden -> hidden (= forward's result)
class UMT5EncoderModel : public torch::nn::Module, public TextEncoder {
 public:
  // options.dtype float32 or bfloat16; options.shapes_only builds on the meta device; options.tp must
  // be a single rank (ModelError otherwise). Parameters are uninitialised until loaded.
  UMT5EncoderModel(const UMT5Config& config, const parallel::ParamOptions& options = {});

  // input_ids (B, L) int64, attention_mask (B, L) 1 for real tokens, 0 for padding (undefined: all
  // real) -> last_hidden_state (B, L, d_model). Only keys are masked: padded positions get finite
  // values that mean nothing (Wan drops them).
  at::Tensor forward(const at::Tensor& input_ids, const at::Tensor& attention_mask,
                     UMT5Trace* trace = nullptr) const;
  // The context the layers read for these inputs (checked as forward checks them).
  std::shared_ptr<const UMT5Context> context(const at::Tensor& input_ids,
                                             const at::Tensor& attention_mask) const;

  // TextEncoder: last_hidden_state.
  at::Tensor encode(const at::Tensor& input_ids, const at::Tensor& attention_mask) const override {
    return forward(input_ids, attention_mask);
  }
  int64_t width() const override { return config.d_model; }
  int64_t vocab_size() const override { return config.vocab_size; }
  int64_t eos_token_id() const override { return config.eos_token_id; }

  // core::Model
  torch::nn::Module& module() override { return *this; }
  core::Layers layers() const override { return layers_; }
  // config.json, its torch_dtype the dtype the weights are held in.
  nlohmann::json hf_config() const override;
  std::vector<std::string> freeze_examples() const override { return {"shared", "encoder"}; }

  std::shared_ptr<nn::WeightHolder> shared;  // (vocab_size, d_model)
  std::shared_ptr<UMT5Stack> encoder;
  UMT5Config config;

 private:
  core::Layers layers_;
};

// Draws every parameter as HF's UMT5 _init_weights does (factor 1): shared N(0, 1); q N(0, 1/(d_model
// d_kv)), k and v N(0, 1/d_model), o N(0, 1/(heads d_kv)); the relative biases N(0, 1/d_model); wi_0 and
// wi_1 N(0, 1/d_model), wo N(0, 1/d_ff) (variances); norms 1. Each tensor from (seed, its name) alone
// (models::derive_seed): a fixed random encoder that tells texts apart, rebuilt alike anywhere.
void init_umt5_parameters(UMT5EncoderModel& model, uint64_t seed);

}  // namespace loom::models
