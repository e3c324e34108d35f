#include "loom/models/qwen3_5/text.h"

#include <fmt/format.h>

#include "loom/kernels/grouped_mm.h"
#include "loom/nn/module_list.h"
#include "loom/parallel/expert.h"
#include "loom/util/errors.h"

namespace loom::models::qwen3_5 {

Mlp::Mlp(int64_t hidden, int64_t intermediate, const parallel::ParamOptions& options) {
  gate_proj = register_module(
      "gate_proj", std::make_shared<parallel::ColumnParallelLinear>(hidden, intermediate, false, options));
  up_proj = register_module(
      "up_proj", std::make_shared<parallel::ColumnParallelLinear>(hidden, intermediate, false, options));
  down_proj = register_module(
      "down_proj", std::make_shared<parallel::RowParallelLinear>(intermediate, hidden, false, options));
}

at::Tensor Mlp::forward(const at::Tensor& x) const {
  const at::Tensor whole = gate_proj->group().enter(x, 0);
  return down_proj->forward(at::silu(gate_proj->forward(whole)) * up_proj->forward(whole), 0);
}

Experts::Experts(int64_t experts, int64_t hidden, int64_t intermediate, const parallel::ParamOptions& options)
    : group_(options.tp),
      ep_(options.ep && options.ep->size() > 1 ? options.ep : nullptr),
      replicate_above_(options.replicate_above),
      total_(experts) {
  const int64_t ranks = ep_ ? ep_->size() : 1;
  if (experts % ranks != 0)
    throw ConfigError(
        fmt::format("parallel.ep={} does not divide the model's {} experts (num_experts)", ranks, experts));
  const int64_t local = experts / ranks;
  gate_up_proj = register_parameter("gate_up_proj",
                                    at::empty({local, 2 * intermediate, hidden}, options.tensor_options()));
  down_proj =
      register_parameter("down_proj", at::empty({local, hidden, intermediate}, options.tensor_options()));
}

std::map<std::string, parallel::ShardLayout> Experts::layouts() const {
  if (!ep())
    return {{"gate_up_proj", parallel::whole_layout(group_)}, {"down_proj", parallel::whole_layout(group_)}};
  // Under sequence parallelism each tensor-parallel rank routes its chunk of the tokens, as for a
  // whole parameter (whole_layout).
  parallel::ShardLayout layout = parallel::expert_layout(ep_);
  layout.partial_grad = parallel::whole_layout(group_).partial_grad;
  return {{"gate_up_proj", layout}, {"down_proj", layout}};
}

at::Tensor Experts::compute(const at::Tensor& rows, const at::Tensor& ends,
                            const std::vector<at::Tensor>& weights) {
  const at::Tensor& gate_up = weights.at(0);
  const at::Tensor& down = weights.at(1);
  const int64_t intermediate = down.size(2);
  const at::Tensor both = kernels::grouped_mm(rows, gate_up, ends);
  return kernels::grouped_mm(
      at::silu(both.narrow(-1, 0, intermediate)) * both.narrow(-1, intermediate, intermediate), down, ends);
}

SparseMoeBlock::SparseMoeBlock(const TextConfig& c, const parallel::ParamOptions& options)
    : top_k(c.num_experts_per_tok), capacity_factor(c.capacity_factor), expert_bias_rate(c.expert_bias_rate) {
  if (top_k < 1 || top_k > c.num_experts)
    throw ConfigError(
        fmt::format("num_experts_per_tok {} must be between 1 and num_experts {}", top_k, c.num_experts));
  const parallel::ShardLayout whole = parallel::whole_layout(options.tp);
  gate = register_module("gate", std::make_shared<parallel::ShardedWeight>(
                                     at::IntArrayRef{c.num_experts, c.hidden_size}, whole, options));
  experts = register_module(
      "experts", std::make_shared<Experts>(c.num_experts, c.hidden_size, c.moe_intermediate_size, options));
  shared_expert = register_module(
      "shared_expert", std::make_shared<Mlp>(c.hidden_size, c.shared_expert_intermediate_size, options));
  shared_expert_gate = register_module(
      "shared_expert_gate",
      std::make_shared<parallel::ShardedWeight>(at::IntArrayRef{1, c.hidden_size}, whole, options));
  if (expert_bias_rate > 0)
    expert_bias = register_parameter(
        "expert_bias", at::zeros({c.num_experts}, options.tensor_options().dtype(at::kFloat)), false);
}

at::Tensor SparseMoeBlock::forward(const at::Tensor& x, RouterOutput* router) const {
  const at::Tensor logits = at::linear(x, gate->weight);  // (T, E), the model's dtype
  const at::Tensor probabilities = at::softmax(logits, -1, at::kFloat);
  at::Tensor weights, chosen;
  if (expert_bias.defined()) {
    // Auxiliary-loss-free balance: the bias moves which experts a token picks, not their weights.
    chosen = std::get<1>((probabilities.detach() + expert_bias).topk(top_k, -1));
    weights = probabilities.gather(-1, chosen);
  } else {
    std::tie(weights, chosen) = probabilities.topk(top_k, -1);
  }
  at::Tensor kept;
  if (capacity_factor > 0)
    kept = parallel::within_capacity(
        chosen, weights.detach(), experts->total(),
        parallel::expert_capacity(capacity_factor, x.size(0), top_k, experts->total()));
  if (router) *router = {logits, chosen, kept, {}};
  weights = (weights / weights.sum(-1, true)).to(x.scalar_type());
  // The tokens' picks as rows grouped by expert, every expert over its rows in one grouped
  // product (under expert parallelism on the rank holding it), each row weighted and added back at
  // its token.
  const parallel::ExpertDispatch dispatch = parallel::dispatch_by_expert(chosen, experts->total(), kept);
  // The shared expert needs no routing: it computes while the rows travel to the experts.
  at::Tensor shared;
  const at::Tensor out = parallel::exchange_with_experts(
      dispatch, parallel::dispatch_rows(dispatch, x), experts->exchange(),
      {experts->gate_up_proj, experts->down_proj}, &Experts::compute,
      [&] { shared = at::sigmoid(at::linear(x, shared_expert_gate->weight)) * shared_expert->forward(x); },
      router ? &router->load : nullptr);
  const at::Tensor routed = parallel::combine_rows(dispatch, out, weights);
  return routed + shared;
}

void SparseMoeBlock::update_expert_bias(const at::Tensor& picks) {
  // Under pipeline parallelism another stage's layer has no storage here: its stage updates it.
  if (!expert_bias.defined() || expert_bias.storage().nbytes() == 0) return;
  at::NoGradGuard no_grad;
  const at::Tensor load = picks.to(expert_bias.device(), at::kFloat);
  expert_bias.add_(at::sign(load.mean() - load) * expert_bias_rate);
}

RoutingCounts& RoutingCounts::operator+=(const RoutingCounts& other) {
  picks = picks + other.picks;
  probabilities = probabilities + other.probabilities;
  rows = rows + other.rows;
  return *this;
}

RoutingCounts routing_counts(const at::Tensor& logits, int64_t top_k, const at::Tensor& real,
                             const at::Tensor& picked) {
  const int64_t experts = logits.size(-1);
  const at::Tensor probabilities = at::softmax(logits, -1);
  const at::Tensor chosen = picked.defined() ? picked : std::get<1>(probabilities.topk(top_k, -1));
  const at::Tensor mask =
      (real.defined() ? real : at::ones({logits.size(0)}, logits.options().dtype(at::kBool)))
          .to(at::kFloat)
          .unsqueeze(-1);  // (T, 1)
  return {(at::one_hot(chosen, experts).sum(1).to(at::kFloat) * mask).sum(0),
          (probabilities.to(at::kFloat) * mask).sum(0), mask.sum()};
}

at::Tensor load_balancing_loss(const RoutingCounts& pooled) {
  const at::Tensor rows = pooled.rows.clamp_min(1);
  const int64_t experts = pooled.picks.size(0);
  return experts * (pooled.picks / rows * (pooled.probabilities / rows)).sum();
}

at::Tensor load_balancing_loss(const std::vector<at::Tensor>& router_logits, int64_t top_k) {
  if (router_logits.empty()) throw ModelError("load_balancing_loss: no router logits");
  RoutingCounts pooled = routing_counts(router_logits.front(), top_k);
  for (size_t l = 1; l < router_logits.size(); ++l) pooled += routing_counts(router_logits[l], top_k);
  return load_balancing_loss(pooled);
}

DecoderLayer::DecoderLayer(const TextConfig& c, size_t index, const parallel::ParamOptions& options) {
  input_layernorm = register_module(
      "input_layernorm", std::make_shared<ZeroCentredRMSNorm>(c.hidden_size, c.rms_norm_eps, options));
  post_attention_layernorm =
      register_module("post_attention_layernorm",
                      std::make_shared<ZeroCentredRMSNorm>(c.hidden_size, c.rms_norm_eps, options));
  const std::string& type = c.layer_types.at(index);
  if (type == "linear_attention")
    linear_attn = register_module("linear_attn", std::make_shared<GatedDeltaNet>(c.linear, options));
  else if (type == "full_attention")
    self_attn = register_module("self_attn", std::make_shared<GatedAttention>(c.attention, options));
  else
    throw ConfigError(
        fmt::format("layer_types[{}] is '{}'; Qwen3.5's layers are linear_attention or "
                    "full_attention",
                    index, type));
  if (c.moe())
    moe = register_module("mlp", std::make_shared<SparseMoeBlock>(c, options));
  else
    mlp = register_module("mlp", std::make_shared<Mlp>(c.hidden_size, c.intermediate_size, options));
}

at::Tensor DecoderLayer::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                 const std::vector<int64_t>& cu_seqlens, bool fused, RouterOutput* router,
                                 const ContextParallelPass* cp, LayerDecoding* decoding) const {
  const at::Tensor normed = input_layernorm->forward(x);
  const at::Tensor h =
      x + (linear_attn ? linear_attn->forward(normed, cu_seqlens, fused, cp ? &cp->linear : nullptr,
                                              decoding ? &decoding->linear : nullptr)
                       : self_attn->forward(normed, cos, sin, cu_seqlens, cp ? &cp->attention : nullptr,
                                            decoding ? &decoding->attention : nullptr));
  const at::Tensor rows = post_attention_layernorm->forward(h).squeeze(0);
  const at::Tensor out = moe ? moe->forward(rows, router) : mlp->forward(rows);
  return h + out.unsqueeze(0);
}

TextModel::TextModel(const TextConfig& c, const parallel::ParamOptions& options) : config(c) {
  embed_tokens = register_module("embed_tokens", std::make_shared<parallel::VocabParallelEmbedding>(
                                                     c.vocab_size, c.hidden_size, options));
  auto list = register_module("layers", std::make_shared<nn::ModuleList>());
  for (size_t i = 0; i < c.layer_types.size(); ++i)
    layers.push_back(list->append(std::make_shared<DecoderLayer>(c, i, options)));
  // The final norm runs on whole sequences: sequence parallelism ends before it.
  parallel::ParamOptions whole = options;
  whole.tp.sequence_parallel = false;
  norm = register_module("norm", std::make_shared<ZeroCentredRMSNorm>(c.hidden_size, c.rms_norm_eps, whole));
}

at::Tensor TextModel::forward(const at::Tensor& input_ids, const at::Tensor& positions,
                              const std::vector<int64_t>& cu_seqlens, bool fused,
                              std::vector<at::Tensor>* router_logits) const {
  at::Tensor h = embed_tokens->forward(input_ids);
  const auto [cos, sin] = rotary_tables(positions, config.rotary, h.scalar_type());
  for (const auto& layer : layers) {
    RouterOutput router;
    h = layer->forward(h, cos, sin, cu_seqlens, fused, router_logits ? &router : nullptr);
    if (router_logits && router.logits.defined()) router_logits->push_back(router.logits);
  }
  return norm->forward(h);
}

}  // namespace loom::models::qwen3_5
