#include "loom/models/text/decoder.h"

#include "loom/dist/mappings.h"
#include "loom/nn/activation.h"
#include "loom/nn/attention.h"
#include "loom/nn/module_list.h"
#include "loom/nn/rope.h"
#include "loom/util/errors.h"

namespace loom::models {

namespace {

// Packed text rows are (1, L, hidden): the sequence is dimension 1.
constexpr int64_t kSequenceDim = 1;

}  // namespace

TextAttention::TextAttention(const TextConfig& c, const parallel::ParamOptions& options)
    : num_heads(parallel::heads_per_rank(c.num_heads, options.tp.size(), "tp", "the language model's",
                                         "attention heads")),
      num_kv_heads(parallel::kv_heads_per_rank(c.num_kv_heads, options.tp.size(), "the language model's")),
      head_dim(c.head_dim()) {
  const bool bias = c.attention_bias;
  q_proj = register_module("q_proj", std::make_shared<parallel::ColumnParallelLinear>(
                                         c.hidden_size, c.num_heads * head_dim, bias, options));
  const int64_t kv_slices = std::min(c.num_kv_heads, options.tp.size());
  k_proj =
      register_module("k_proj", std::make_shared<parallel::ColumnParallelLinear>(
                                    c.hidden_size, c.num_kv_heads * head_dim, bias, options, 1, kv_slices));
  v_proj =
      register_module("v_proj", std::make_shared<parallel::ColumnParallelLinear>(
                                    c.hidden_size, c.num_kv_heads * head_dim, bias, options, 1, kv_slices));
  o_proj = register_module("o_proj", std::make_shared<parallel::RowParallelLinear>(
                                         c.num_heads * head_dim, c.hidden_size, false, options));
  if (c.qk_norm) {
    // Whole on every rank, each applied to this rank's heads: their gradients are partial sums over
    // the tensor-parallel group, as a sequence-parallel norm's are.
    parallel::ParamOptions heads = options;
    heads.tp.sequence_parallel = true;
    q_norm = register_module("q_norm", std::make_shared<nn::RMSNorm>(head_dim, c.rms_norm_eps, heads));
    k_norm = register_module("k_norm", std::make_shared<nn::RMSNorm>(head_dim, c.rms_norm_eps, heads));
  }
}

at::Tensor TextAttention::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                  const std::vector<int64_t>& cu_seqlens, const CachedPass* cached,
                                  size_t layer, const parallel::ContextAttention* context_parallel) const {
  const auto whole = q_proj->group().enter(x, kSequenceDim);  // shared by q, k and v
  const int64_t b = whole.size(0), l = whole.size(1);
  auto q = q_proj->forward(whole).view({b, l, num_heads, head_dim});
  auto k = k_proj->forward(whole).view({b, l, num_kv_heads, head_dim});
  if (q_norm) {
    q = q_norm->forward(q);
    k = k_norm->forward(k);
  }
  q = nn::apply_rotary(q, cos, sin);
  k = nn::apply_rotary(k, cos, sin);
  auto v = v_proj->forward(whole).view({b, l, num_kv_heads, head_dim});
  at::Tensor out;  // (B, L, H, D)
  if (cached) {
    KVCache& cache = *cached->cache;
    if (cache.keys.size() <= layer) {
      cache.keys.resize(layer + 1);
      cache.values.resize(layer + 1);
    }
    at::Tensor& keys = cache.keys[layer];
    at::Tensor& values = cache.values[layer];
    const auto kept_k = k.narrow(1, 0, cached->appended), kept_v = v.narrow(1, 0, cached->appended);
    keys = keys.defined() ? at::cat({keys, kept_k}, 1) : kept_k;
    values = values.defined() ? at::cat({values, kept_v}, 1) : kept_v;
    out = nn::masked_attention(q, keys, values, cached->allowed);
  } else if (context_parallel) {
    if (b != 1)
      throw ModelError(
          fmt::format("context parallelism shards the tokens into one row, got a batch of {}", b));
    out = nn::context_attention(q[0], k[0], v[0], *context_parallel).unsqueeze(0);
  } else if (cu_seqlens.empty()) {
    out = nn::causal_attention(q, k, v);
  } else {
    if (b != 1)
      throw ModelError(fmt::format("packed sequences come as one row of tokens, got a batch of {}", b));
    out = nn::segment_attention(q[0], k[0], v[0], cu_seqlens, /*causal=*/true).unsqueeze(0);
  }
  return o_proj->forward(out.reshape({b, l, num_heads * head_dim}), kSequenceDim);
}

TextMlp::TextMlp(const TextConfig& c, const parallel::ParamOptions& options) {
  gate_proj = register_module("gate_proj", std::make_shared<parallel::ColumnParallelLinear>(
                                               c.hidden_size, c.intermediate_size, false, options));
  up_proj = register_module("up_proj", std::make_shared<parallel::ColumnParallelLinear>(
                                           c.hidden_size, c.intermediate_size, false, options));
  down_proj = register_module("down_proj", std::make_shared<parallel::RowParallelLinear>(
                                               c.intermediate_size, c.hidden_size, false, options));
}

at::Tensor TextMlp::forward(const at::Tensor& x) const {
  const auto whole = gate_proj->group().enter(x, kSequenceDim);
  return down_proj->forward(nn::swiglu(gate_proj->forward(whole), up_proj->forward(whole)), kSequenceDim);
}

DecoderLayer::DecoderLayer(const TextConfig& c, const parallel::ParamOptions& options) {
  self_attn = register_module("self_attn", std::make_shared<TextAttention>(c, options));
  mlp = register_module("mlp", std::make_shared<TextMlp>(c, options));
  input_layernorm = register_module("input_layernorm",
                                    std::make_shared<nn::RMSNorm>(c.hidden_size, c.rms_norm_eps, options));
  post_attention_layernorm = register_module(
      "post_attention_layernorm", std::make_shared<nn::RMSNorm>(c.hidden_size, c.rms_norm_eps, options));
}

at::Tensor DecoderLayer::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                 const std::vector<int64_t>& cu_seqlens, const CachedPass* cached,
                                 size_t layer, const parallel::ContextAttention* context_parallel) const {
  auto h = x + self_attn->forward(input_layernorm->forward(x), cos, sin, cu_seqlens, cached, layer,
                                  context_parallel);
  return h + mlp->forward(post_attention_layernorm->forward(h));
}

TextModel::TextModel(const TextConfig& c, const parallel::ParamOptions& options) : config(c), tp(options.tp) {
  embed_tokens = register_module("embed_tokens", std::make_shared<parallel::VocabParallelEmbedding>(
                                                     c.vocab_size, c.hidden_size, options));
  auto list = register_module("layers", std::make_shared<nn::ModuleList>());
  for (int64_t i = 0; i < c.num_layers; ++i)
    layers.push_back(list->append(std::make_shared<DecoderLayer>(c, options)));
  // The final norm runs on whole sequences: sequence parallelism ends before it.
  parallel::ParamOptions whole = options;
  whole.tp.sequence_parallel = false;
  norm = register_module("norm", std::make_shared<nn::RMSNorm>(c.hidden_size, c.rms_norm_eps, whole));
}

std::shared_ptr<parallel::ColumnParallelLinear> make_lm_head(const TextConfig& c,
                                                             const parallel::ParamOptions& options) {
  if (c.tie_word_embeddings) return nullptr;
  parallel::ParamOptions head = options;  // after the final norm: whole sequences
  head.tp.sequence_parallel = false;
  return std::make_shared<parallel::ColumnParallelLinear>(c.hidden_size, c.vocab_size, false, head);
}

const at::Tensor& head_weight(const TextModel& text, const parallel::ColumnParallelLinear* lm_head) {
  return lm_head ? lm_head->weight : text.embed_tokens->weight;
}

at::Tensor head_logits(const TextModel& text, const parallel::ColumnParallelLinear* lm_head,
                       const at::Tensor& hidden) {
  const auto whole = dist::copy_to_region(hidden, text.tp.comm);
  if (lm_head) return lm_head->forward(whole);
  return at::linear(whole, text.embed_tokens->weight);
}

at::Tensor whole_head_logits(const TextModel& text, const parallel::ColumnParallelLinear* lm_head,
                             const at::Tensor& hidden) {
  return dist::gather_from_region(head_logits(text, lm_head, hidden), text.tp.comm, -1);
}

}  // namespace loom::models
