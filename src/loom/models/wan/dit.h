// The Wan2.1 text-to-video diffusion transformer (WanModel, model_type t2v): a latent video, a
// timestep and umT5 text features in, the flow velocity of the latent out.
//
// Parameters carry Wan's own names (patch_embedding.weight, blocks.{i}.self_attn.q.weight, ...,
// head.head.weight; models/wan/names.h maps diffusers' onto them). Under tensor parallelism (Megatron's
// cut) each rank holds num_heads / tp heads of every attention (q, k, v by output rows, o by input
// columns, the q/k norms' weights by feature, their statistics over the whole width all-reduced) and
// ffn_dim / tp of the feed-forward; the embeddings, modulation tables, norms and head are whole on every
// rank, and so is the residual stream (no sequence parallelism). Float32,
// or bfloat16 parameters with Wan's float32 islands: the time embedding and projection, the
// modulation tables and arithmetic, the norms, the residual stream and the head run in float32 (the
// weights upcast), the other linears and the attention in bfloat16.
#pragma once
#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <memory>
#include <string>
#include <vector>

#include "loom/core/layer.h"
#include "loom/core/model.h"
#include "loom/models/generator.h"
#include "loom/models/wan/config.h"
#include "loom/models/wan/ops.h"
#include "loom/nn/module_list.h"
#include "loom/nn/norm.h"
#include "loom/parallel/tensor.h"

namespace loom::models {

struct WanContext;

// Wan's linears: weight [out, in] and bias [out]; q, k, v and ffn.0 cut by output rows over the
// tensor-parallel group, o and ffn.2 (RowLinear) by input columns, the rest whole (a group of one).
using WanLinear = parallel::ColumnParallelLinear;
using WanRowLinear = parallel::RowParallelLinear;

// x cast to the layer's dtype, then x W^T + b. x (..., in) -> (..., out) in the layer's dtype.
at::Tensor apply_linear(const WanLinear& layer, const at::Tensor& x);
// The same in float32, the weights upcast (the regions Wan runs under autocast float32).
at::Tensor apply_linear_fp32(const WanLinear& layer, const at::Tensor& x);

// patch_embedding: Wan's Conv3d with kernel = stride = patch, applied as a linear over patch rows
// (ops.h patchify). latents [B, C_in, T, H, W] -> [B, L, C] in the parameters' dtype.
class WanPatchEmbedding : public torch::nn::Module {
 public:
  WanPatchEmbedding(const WanConfig& config, const parallel::ParamOptions& options);
  at::Tensor forward(const at::Tensor& latents, WanGrid* grid = nullptr) const;
  at::Tensor weight;  // [C, C_in, pt, ph, pw]
  at::Tensor bias;    // [C]
  std::array<int64_t, 3> patch;
};

// text_embedding: "0" Linear(text_dim, C), GELU (tanh), "2" Linear(C, C), applied to every one of the
// text_len rows (zero padding included). text [B, text_len, text_dim] -> [B, text_len, C].
class WanTextEmbedding : public torch::nn::Module {
 public:
  WanTextEmbedding(const WanConfig& config, const parallel::ParamOptions& options);
  at::Tensor forward(const at::Tensor& text) const;
  std::shared_ptr<WanLinear> linear_1, linear_2;  // "0", "2"
};

// time_embedding: "0" Linear(freq_dim, C), SiLU, "2" Linear(C, C), in float32.
// sinusoid [B, freq_dim] -> e [B, C] float32.
class WanTimeEmbedding : public torch::nn::Module {
 public:
  WanTimeEmbedding(const WanConfig& config, const parallel::ParamOptions& options);
  at::Tensor forward(const at::Tensor& sinusoid) const;
  std::shared_ptr<WanLinear> linear_1, linear_2;  // "0", "2"
};

// time_projection: SiLU, then "1" Linear(C, 6C), in float32. e [B, C] -> e0 [B, 6, C] float32: the
// shift, scale and gate of the self-attention, then of the feed-forward, for every block.
class WanTimeProjection : public torch::nn::Module {
 public:
  WanTimeProjection(const WanConfig& config, const parallel::ParamOptions& options);
  at::Tensor forward(const at::Tensor& e) const;
  std::shared_ptr<WanLinear> linear;  // "1"
  int64_t dim;
};

// self_attn and cross_attn: q, k, v, o Linear(C, C) with bias; norm_q, norm_k RMSNorm over all C (every
// head together), applied before the heads are split (absent without qk_norm). Under tensor
// parallelism this rank's num_heads / tp heads; inputs and output whole.
class WanAttention : public torch::nn::Module {
 public:
  WanAttention(const WanConfig& config, const parallel::ParamOptions& options);
  // Self-attention over each sample's L tokens, q and k turned by the 3-D rotary embedding.
  // x [B, L, C], cos and sin (L, 1, head_dim / 2), cu {0, L, ..., B L} -> [B, L, C] (parameter dtype);
  // under context parallelism L is this rank's positions and `context_parallel` plans the attention.
  at::Tensor self_attention(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                            const std::vector<int64_t>& cu,
                            const parallel::ContextAttention* context_parallel = nullptr) const;
  // Every token over all text_len rows of its sample's text, no rotary embedding.
  // x [B, L, C], text [B, text_len, C] -> [B, L, C] (parameter dtype).
  at::Tensor cross_attention(const at::Tensor& x, const at::Tensor& text) const;
  std::shared_ptr<WanLinear> q, k, v;
  std::shared_ptr<WanRowLinear> o;
  std::shared_ptr<nn::SplitRMSNorm> norm_q, norm_k;  // null without qk_norm
  int64_t num_heads, head_dim;                       // this rank's heads

 private:
  // x and keys_from as q and k, v read them (entered into the tensor-parallel region) -> (q, k, v)
  // [B, L, H, head_dim] each, q and k normed.
  std::array<at::Tensor, 3> project(const at::Tensor& x, const at::Tensor& keys_from) const;
};

// blocks.{i}, with the residual stream x [B, L, C] float32 and (shift, scale, gate) = modulation + e0:
//   x += gate_1 * self_attn(LN(x) (1 + scale_1) + shift_1)
//   x += cross_attn(norm3(x), text)                           (no gate; norm3 with affine)
//   x += gate_2 * ffn(LN(x) (1 + scale_2) + shift_2)           (ffn: "0" Linear(C, F), GELU tanh, "2")
// LN is LayerNorm without affine (Wan's norm1 and norm2, which have no parameters).
class WanAttentionBlock : public torch::nn::Module {
 public:
  WanAttentionBlock(const WanConfig& config, const parallel::ParamOptions& options);
  // x [B, L, C], e0 [B, 6, C] float32, text [B, text_len, C], rope tables as WanAttention's ->
  // [B, L, C] float32.
  // Under context parallelism x is this rank's positions of every sample and `context_parallel` says
  // how the self-attention runs.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& e0, const at::Tensor& text, const at::Tensor& cos,
                     const at::Tensor& sin, const std::vector<int64_t>& cu,
                     const parallel::ContextAttention* context_parallel = nullptr) const;
  at::Tensor modulation;  // [1, 6, C]
  std::shared_ptr<WanAttention> self_attn;
  std::shared_ptr<nn::LayerNorm> norm3;  // null without cross_attn_norm
  std::shared_ptr<WanAttention> cross_attn;
  std::shared_ptr<WanLinear> ffn_in;      // ffn.0
  std::shared_ptr<WanRowLinear> ffn_out;  // ffn.2
  double eps;
};

// head: (shift, scale) = modulation + e (the time embedding, not e0), then
// head(LN(x) (1 + scale) + shift), all in float32. x [B, L, C], e [B, C] -> [B, L, pt ph pw C_out]
// float32, the channel innermost (ops.h unpatchify).
class WanHead : public torch::nn::Module {
 public:
  WanHead(const WanConfig& config, const parallel::ParamOptions& options);
  at::Tensor forward(const at::Tensor& x, const at::Tensor& e) const;
  at::Tensor modulation;  // [1, 2, C]
  std::shared_ptr<WanLinear> head;
  double eps;
};

// As layers (models/wan/layers.h): time_embedding, time_projection, text_embedding, patch_embedding,
// blocks.{i}, head.
class WanModel : public torch::nn::Module, public Denoiser {
 public:
  // options.dtype float32 or bfloat16; options.shapes_only builds on the meta device; options.tp the
  // tensor-parallel group (num_heads and ffn_dim divisible by its size, no sequence parallelism:
  // ModelError otherwise). Parameters are uninitialised until loaded or initialised.
  WanModel(const WanConfig& config, const parallel::ParamOptions& options = {});

  // latents [B, C_in, T, H, W] (x_t), timesteps [B] (t = 1000 sigma; any numeric dtype), text
  // [B, L_text <= text_len, text_dim] with zero rows past each prompt (padded here to text_len) ->
  // velocity [B, C_out, T, H, W] float32. The same arithmetic as running layers() over context().
  at::Tensor forward(const at::Tensor& latents, const at::Tensor& timesteps,
                     const at::Tensor& text) const override;
  // Training FLOPs (forward and backward, 3 x the forward's multiply-adds x 2) of `batch` samples of
  // this token grid: every linear of the blocks, the self-attention's scores and values over the grid's
  // tokens, the cross-attention's over text_len rows, the patch embedding, head and text embedding.
  double training_flops(const WanGrid& grid, int64_t batch) const;
  // The context the layers read for these inputs (layers.h wan_context).
  std::shared_ptr<const WanContext> context(const at::Tensor& latents, const at::Tensor& timesteps,
                                            const at::Tensor& text) const;
  // The context of a training pass: under context parallelism (options.cp) each rank's layers see
  // its positions of every sample's tokens, and the head's output is theirs (the context's
  // shard.scatter_rows gives their targets); otherwise context().
  std::shared_ptr<const WanContext> sharded_context(const at::Tensor& latents, const at::Tensor& timesteps,
                                                    const at::Tensor& text) const;

  // Denoiser
  std::shared_ptr<const DenoiserContext> context(const at::Tensor& latents, const at::Tensor& timesteps,
                                                 const at::Tensor& text, bool sharded) const override;
  // Patch tokens [B, L, pt ph pw C_out] (ops.h head_tokens).
  at::Tensor output_tokens(const at::Tensor& target) const override;
  // Zero rows past each caption, to text_len (pad_text).
  at::Tensor text_batch(const std::vector<at::Tensor>& captions) const override;
  int64_t in_channels() const override { return config.in_dim; }
  int64_t out_channels() const override { return config.out_dim; }
  int64_t text_dim() const override { return config.text_dim; }
  int64_t text_len() const override { return config.text_len; }
  std::array<int64_t, 3> patch_size() const override;
  int64_t tokens(const at::Tensor& latents) const override;
  double training_flops(const at::Tensor& latents) const override;
  at::TensorOptions input_options() const override { return patch_embedding->weight.options(); }

  // core::Model
  torch::nn::Module& module() override { return *this; }
  core::Layers layers() const override { return layers_; }
  // config.json with Wan's keys, its torch_dtype the dtype the weights are held in.
  nlohmann::json hf_config() const override;
  std::vector<std::string> freeze_examples() const override;

  std::shared_ptr<WanPatchEmbedding> patch_embedding;
  std::shared_ptr<WanTextEmbedding> text_embedding;
  std::shared_ptr<WanTimeEmbedding> time_embedding;
  std::shared_ptr<WanTimeProjection> time_projection;
  std::vector<std::shared_ptr<WanAttentionBlock>> blocks;
  std::shared_ptr<WanHead> head;
  WanConfig config;
  parallel::ContextParallelGroup context_parallel;

 private:
  core::Layers layers_;
};

// Initialises every parameter as Wan's init_weights does, each drawn from (seed, parameter name)
// alone (models::derive_seed), whole and then cut to this rank's slice, so neither construction order,
// depth nor tensor parallelism changes a tensor: linears
// xavier-uniform with zero bias; the patch embedding xavier-uniform over its [C, C_in pt ph pw] matrix;
// the text and time embedding linears N(0, 0.02^2); head.head.weight zero; modulation tables
// N(0, 1/C); norm weights 1, norm biases 0. A parameter no rule covers is a ModelError.
void init_wan_parameters(WanModel& model, uint64_t seed);

}  // namespace loom::models
