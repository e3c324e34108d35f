// Qwen3.5's language model with HuggingFace's names (model.language_model.*): embed_tokens, layers
// of linear attention (Gated DeltaNet) or gated full attention as layer_types says, each with a
// dense SwiGLU MLP (qwen3_5) or a sparse mixture of experts with a gated shared expert
// (qwen3_5_moe), zero-centred RMSNorms before each half and at the end.
#pragma once
#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "loom/models/qwen3_5/attention.h"
#include "loom/models/qwen3_5/gated_deltanet.h"
#include "loom/parallel/expert.h"
#include "loom/parallel/tensor.h"

namespace loom::models::qwen3_5 {

struct TextConfig {
  int64_t vocab_size = 0, hidden_size = 0;
  std::vector<std::string> layer_types;  // "linear_attention" or "full_attention", one per layer
  AttentionConfig attention;
  GatedDeltaNetConfig linear;
  RotaryConfig rotary;
  double rms_norm_eps = 1e-6;
  // Dense: intermediate_size. MoE (num_experts > 0): every layer's experts.
  int64_t intermediate_size = 0;
  int64_t num_experts = 0, num_experts_per_tok = 0, moe_intermediate_size = 0,
          shared_expert_intermediate_size = 0;
  double router_aux_loss_coef = 0.001;
  // As transformers: the load-balancing loss joins the training loss (times router_aux_loss_coef)
  // only when the config asks for the router logits.
  bool output_router_logits = false;
  // The job's routing choices (training.moe_*; docs/parallelism.md "Expert load"), not config.json's:
  // capacity_factor > 0 caps each expert at ceil(capacity_factor * T * k / E) of a micro-batch's T tokens'
  // picks (those of highest probability; the rest dropped); z_loss the router z-loss's coefficient;
  // expert_bias_rate > 0 picks experts by probability plus a per-expert bias (mlp.expert_bias), moved
  // by that much towards balance after every step.
  double capacity_factor = 0.0, z_loss = 0.0, expert_bias_rate = 0.0;
  bool moe() const { return num_experts > 0; }
};

// SwiGLU: down(silu(gate(x)) * up(x)); mlp.* (dense) or mlp.shared_expert.*.
class Mlp : public torch::nn::Module {
 public:
  Mlp(int64_t hidden, int64_t intermediate, const parallel::ParamOptions& options);
  at::Tensor forward(const at::Tensor& x) const;  // (T, hidden) -> (T, hidden)
  std::shared_ptr<parallel::ColumnParallelLinear> gate_proj, up_proj;
  std::shared_ptr<parallel::RowParallelLinear> down_proj;
};

// The experts' weights as transformers fuses them: experts.gate_up_proj (E, 2 * I, hidden), each
// expert's gate rows then its up rows; experts.down_proj (E, hidden, I). Whole on every
// tensor-parallel rank (replicated). Under expert parallelism (options.ep) each rank of the group
// holds E / ep consecutive experts.
class Experts : public torch::nn::Module, public parallel::Sharded {
 public:
  Experts(int64_t experts, int64_t hidden, int64_t intermediate, const parallel::ParamOptions& options);
  // rows (M, hidden) grouped by expert (parallel/expert.h: `ends`), each group through the experts
  // of the same index in `weights` ({gate_up_proj, down_proj}, these or with copies) -> (M, hidden).
  static at::Tensor compute(const at::Tensor& rows, const at::Tensor& ends,
                            const std::vector<at::Tensor>& weights);
  // How the dispatched rows reach them (expert parallelism, hot-expert replication).
  parallel::ExpertExchange exchange() const { return {ep(), replicate_above_}; }
  // Split over ep, or whole: every expert here (ep 1, or gathered whole for evaluation).
  std::map<std::string, parallel::ShardLayout> layouts() const override;
  // The group the experts are split over now; null when this rank holds them all.
  std::shared_ptr<dist::Comm> ep() const { return gate_up_proj.size(0) == total_ ? nullptr : ep_; }
  int64_t total() const { return total_; }  // every rank's experts
  at::Tensor gate_up_proj, down_proj;

 private:
  parallel::TensorParallelGroup group_;
  std::shared_ptr<dist::Comm> ep_;  // null: ep 1
  double replicate_above_ = 0.0;
  int64_t total_ = 0;
};

// What a MoE layer's router did with its T tokens.
struct RouterOutput {
  at::Tensor logits;  // (T, E), the model's dtype
  at::Tensor chosen;  // (T, k) int64: each token's experts
  at::Tensor kept;    // (T, k) bool: the picks its experts computed (undefined: every pick, dropless)
  parallel::ExchangeLoad load;  // under expert parallelism: the rows the ep ranks computed
};

// The sparse block: router (gate) softmax in fp32 over the experts, the top k renormalised to sum to
// one, each token through its k experts weighted so; plus the shared expert times
// sigmoid(shared_expert_gate(x)). With an expert bias the top k are those of probability plus bias,
// weighted by their probabilities; with a capacity, the picks beyond an expert's capacity are dropped. Under
// tensor parallelism the router, its experts and the shared expert's gate are whole on every rank, each rank
// routing the tokens it holds (all of them, or its sequence chunk); the shared expert is split as the dense
// MLP is.
class SparseMoeBlock : public torch::nn::Module {
 public:
  SparseMoeBlock(const TextConfig& config, const parallel::ParamOptions& options);
  // x (T, hidden) -> (T, hidden); `router`, when given, receives the routing.
  at::Tensor forward(const at::Tensor& x, RouterOutput* router = nullptr) const;
  // After a step: the bias moved by expert_bias_rate towards the experts with fewer than the mean of
  // `picks` (E), the step's picks of this layer over every rank. No-op without a bias.
  void update_expert_bias(const at::Tensor& picks);
  int64_t top_k;
  double capacity_factor, expert_bias_rate;
  at::Tensor expert_bias;  // (E) fp32, not trained by gradients; undefined: none
  std::shared_ptr<parallel::ShardedWeight> gate, shared_expert_gate;  // (E, hidden), (1, hidden)
  std::shared_ptr<Experts> experts;
  std::shared_ptr<Mlp> shared_expert;
};

// One MoE layer's routing, over the tokens `real` (T) bool marks (undefined: all): the top-k picks
// each expert got (`chosen` (T, k); undefined: the top k of the logits) and the routing probabilities
// (softmax in the logits' dtype, as transformers) summed over them, and their number. Counts of
// several layers add up.
struct RoutingCounts {
  at::Tensor picks, probabilities, rows;  // (E), (E), () fp32
  RoutingCounts& operator+=(const RoutingCounts& other);
};
RoutingCounts routing_counts(const at::Tensor& router_logits, int64_t top_k, const at::Tensor& real = {},
                             const at::Tensor& chosen = {});

// transformers' load-balancing loss from counts pooled over every layer: the share of picks each
// expert got and its mean routing probability, then E * sum_e share_e * probability_e.
at::Tensor load_balancing_loss(const RoutingCounts& pooled);
// The same over every MoE layer's router logits (T, E), every token counted.
at::Tensor load_balancing_loss(const std::vector<at::Tensor>& router_logits, int64_t top_k);

// Context parallelism: how each kind of layer runs over this rank's shard of the tokens.
struct ContextParallelPass {
  parallel::ContextAttention attention;  // the full-attention layers'
  LinearContextParallel linear;          // the linear-attention layers'
};

// Generation's state of one layer: its linear-attention or full-attention part's.
struct LayerDecoding {
  LinearDecoding linear;
  AttentionDecoding attention;
};

class DecoderLayer : public torch::nn::Module {
 public:
  DecoderLayer(const TextConfig& config, size_t index, const parallel::ParamOptions& options);
  // x (1, T, hidden) -> (1, T, hidden); `cp`: x is this rank's context-parallel shard.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                     const std::vector<int64_t>& cu_seqlens, bool fused, RouterOutput* router,
                     const ContextParallelPass* cp = nullptr, LayerDecoding* decoding = nullptr) const;
  bool linear() const { return static_cast<bool>(linear_attn); }
  std::shared_ptr<ZeroCentredRMSNorm> input_layernorm, post_attention_layernorm;
  std::shared_ptr<GatedDeltaNet> linear_attn;
  std::shared_ptr<GatedAttention> self_attn;
  std::shared_ptr<Mlp> mlp;
  std::shared_ptr<SparseMoeBlock> moe;  // registered as "mlp" in a MoE model
};

class TextModel : public torch::nn::Module {
 public:
  TextModel(const TextConfig& config, const parallel::ParamOptions& options);
  // input_ids (1, T), positions (3, T) -> the final norm's output (1, T, hidden). Under a MoE model,
  // `router_logits` (when given) receives every layer's.
  at::Tensor forward(const at::Tensor& input_ids, const at::Tensor& positions,
                     const std::vector<int64_t>& cu_seqlens, bool fused = true,
                     std::vector<at::Tensor>* router_logits = nullptr) const;
  TextConfig config;
  std::shared_ptr<parallel::VocabParallelEmbedding> embed_tokens;
  std::vector<std::shared_ptr<DecoderLayer>> layers;
  std::shared_ptr<ZeroCentredRMSNorm> norm;
};

}  // namespace loom::models::qwen3_5
