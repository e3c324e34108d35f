// Whether the parallel layout fits the model and the world, and whether this build can run it.
#include <fmt/format.h>

#include "loom/config/config.h"
#include "loom/util/errors.h"

namespace loom::config {
namespace {

std::string join_numbers(const std::vector<int64_t>& numbers) {
  std::string out;
  for (int64_t n : numbers) out += (out.empty() ? "" : ", ") + std::to_string(n);
  return out;
}

}  // namespace

int64_t data_parallel_size(const ParallelSection& p, int64_t world_size) {
  if (p.dp != 0) return p.dp;
  const int64_t model_parallel = p.tp * p.cp * p.pp;
  if (world_size % model_parallel != 0)
    throw ConfigError(
        fmt::format("parallel.dp=auto: world size {} is not divisible by tp*cp*pp = {}*{}*{} = {}",
                    world_size, p.tp, p.cp, p.pp, model_parallel));
  return world_size / model_parallel;
}

void validate_parallel(const JobConfig& config, const ModelDims& dims, int64_t world_size) {
  const ParallelSection& p = config.parallel;
  const TrainingSection& t = config.training;
  auto fail = [&config](const std::string& what) { throw ConfigError(config.source + ": " + what); };

  if (world_size < 1) fail(fmt::format("world size must be >= 1, got {}", world_size));
  if (dims.llm_heads < 1 || dims.llm_kv_heads < 1 || dims.vision_heads < 1 || dims.vocab_size < 1 ||
      dims.llm_layers < 1)
    fail(fmt::format(
        "model sizes must be positive (llm heads {}, kv heads {}, vision heads {}, vocab {}, layers {})",
        dims.llm_heads, dims.llm_kv_heads, dims.vision_heads, dims.vocab_size, dims.llm_layers));

  // Every tensor-parallel rank holds whole attention heads (kv heads may be replicated) and an equal
  // share of the vocabulary (Loom does not pad the vocabulary, so tp must divide it). The vision
  // tower splits over vision_tp: tp, or 1 (whole on every rank).
  const int64_t vision_tp = p.vision_tp == 0 ? p.tp : p.vision_tp;
  auto tp_fits = [&dims, &p](int64_t tp) {
    const int64_t vision = p.vision_tp == 1 ? 1 : tp;
    return dims.llm_heads % tp == 0 && dims.vision_heads % vision == 0 &&
           (dims.llm_kv_heads % tp == 0 || tp % dims.llm_kv_heads == 0) && dims.vocab_size % tp == 0;
  };
  std::vector<int64_t> valid_tp;
  for (int64_t tp = 1; tp <= std::max(dims.llm_heads, dims.vision_heads); ++tp)
    if (tp_fits(tp)) valid_tp.push_back(tp);
  if (dims.llm_heads % p.tp != 0 || dims.vision_heads % vision_tp != 0)
    fail(fmt::format("parallel.tp={} does not divide model heads (llm {}, vision {}{}); valid tp: {}", p.tp,
                     dims.llm_heads, dims.vision_heads,
                     vision_tp != p.tp ? fmt::format(" over vision_tp {}", vision_tp) : "",
                     join_numbers(valid_tp)));
  if (dims.llm_kv_heads % p.tp != 0 && p.tp % dims.llm_kv_heads != 0)
    fail(fmt::format(
        "parallel.tp={} neither divides the model's {} kv heads nor is a multiple of them; valid tp: {}",
        p.tp, dims.llm_kv_heads, join_numbers(valid_tp)));
  if (dims.vocab_size % p.tp != 0)
    fail(fmt::format("parallel.tp={} does not divide the vocabulary size {}; valid tp: {}", p.tp,
                     dims.vocab_size, join_numbers(valid_tp)));
  if (p.sequence_parallel && p.tp == 1)
    fail("parallel.sequence_parallel=true needs parallel.tp > 1 (it splits the sequence across tp ranks)");
  if (p.cp % p.cp_ulysses != 0)
    fail(
        fmt::format("parallel.cp_ulysses={} does not divide parallel.cp={} (the cp ranks form Ulysses groups "
                    "of cp_ulysses ranks and rings across them: 1 for a ring, cp for Ulysses alone)",
                    p.cp_ulysses, p.cp));
  if (p.cp_ulysses > 1) {
    // Each Ulysses rank attends with an equal share of every tensor-parallel rank's heads; key/value
    // heads fewer than the degree are repeated, so they must divide it then.
    const int64_t u = p.cp_ulysses, heads = dims.llm_heads / p.tp, vision = dims.vision_heads / vision_tp;
    const int64_t kv = dims.llm_kv_heads % p.tp == 0 ? dims.llm_kv_heads / p.tp : 1;
    if (heads % u != 0 || vision % u != 0 || (kv % u != 0 && u % kv != 0))
      fail(
          fmt::format("parallel.cp_ulysses={} does not split the attention heads per tensor-parallel rank "
                      "(llm {}, its key/value heads {}, vision {}) evenly over the Ulysses ranks",
                      u, heads, kv, vision));
  }
  if (p.dynamic_cp && p.cp == 1)
    fail("parallel.dynamic_cp=true needs parallel.cp > 1 (the largest degree a step may run at)");
  if (p.dynamic_cp && p.dynamic_cp_tokens < 1)
    fail(
        "parallel.dynamic_cp=true needs parallel.dynamic_cp_tokens >= 1 (the most tokens of one sample a "
        "rank "
        "holds: each step's degree is the smallest whose ranks hold its longest sample within it)");
  if (!p.dynamic_cp && p.dynamic_cp_tokens != 0)
    fail(fmt::format("parallel.dynamic_cp_tokens={}: only read with parallel.dynamic_cp=true",
                     p.dynamic_cp_tokens));
  const int64_t blocks = dims.blocks > 0 ? dims.blocks : dims.llm_layers;
  if (p.pp * p.virtual_stages > blocks)
    fail(
        fmt::format("parallel.pp={} x parallel.virtual_stages={} = {} pipeline stages exceeds the model's {} "
                    "blocks (each stage "
                    "holds at least one); valid pp: 1 to {}",
                    p.pp, p.virtual_stages, p.pp * p.virtual_stages, blocks, blocks / p.virtual_stages));
  if (p.pp == 1 && p.virtual_stages > 1)
    fail(fmt::format(
        "parallel.virtual_stages={} needs parallel.pp > 1 (it cuts each pipeline rank's layers into "
        "chunks)",
        p.virtual_stages));
  if (p.pp == 1 && p.pipeline_schedule != "1f1b")
    fail(fmt::format("parallel.pipeline_schedule={}: only read with parallel.pp > 1 (remove it, or set pp)",
                     p.pipeline_schedule));
  if (p.pp == 1 && config.features.recompute_in_bubbles)
    fail("features.recompute_in_bubbles: only read with parallel.pp > 1 (remove it, or set pp)");
  if (p.pp == 1 && !config.model.pipeline_layers.empty())
    fail("model.pipeline_layers: only read with parallel.pp > 1 (remove it, or set pp)");

  // Expert parallelism splits a mixture of experts' experts.
  if (p.ep > 1 && dims.experts == 0)
    fail(fmt::format(
        "parallel.ep={}: this model has no experts to split over expert-parallel ranks (use ep 1)", p.ep));
  if (p.ep > 1 && dims.experts % p.ep != 0)
    fail(fmt::format("parallel.ep={} does not divide the model's {} experts", p.ep, dims.experts));

  if (p.hot_expert_threshold > 0 && p.ep == 1)
    fail(
        fmt::format("parallel.hot_expert_threshold={}: only read with parallel.ep > 1 (remove it, or set ep)",
                    p.hot_expert_threshold));
  if (p.hot_expert_threshold > 0 && p.hot_expert_threshold < 1)
    fail(fmt::format(
        "parallel.hot_expert_threshold={}: a rank's rows over this many times the mean; the most loaded rank "
        "is always at least the mean, so use 0 (off) or a value >= 1 (for example 1.5)",
        p.hot_expert_threshold));
  for (const auto& [key, value] :
       {std::pair<const char*, double>{"moe_capacity_factor", t.moe_capacity_factor},
        {"moe_z_loss", t.moe_z_loss},
        {"moe_expert_bias_rate", t.moe_expert_bias_rate}})
    if (value > 0 && dims.experts == 0)
      fail(fmt::format("training.{}={}: this model has no experts to route to (remove it)", key, value));

  // What this build cannot run yet is refused rather than ignored.
  if (p.ep > 1 && p.zero == 3 && (p.tp > 1 || p.pp > 1 || p.cp > 1))
    fail(
        fmt::format("parallel.ep={} with parallel.zero=3 and parallel.{}: expert parallelism under FSDP runs "
                    "beside data parallelism only in this version of Loom",
                    p.ep,
                    p.tp > 1   ? fmt::format("tp={}", p.tp)
                    : p.pp > 1 ? fmt::format("pp={}", p.pp)
                               : fmt::format("cp={}", p.cp)));

  int64_t dp = 0;
  try {
    dp = data_parallel_size(p, world_size);
  } catch (const ConfigError& e) {
    fail(e.what());
  }
  if (p.tp * p.cp * p.pp * dp != world_size)
    fail(fmt::format("parallel: tp*cp*pp*dp = {}*{}*{}*{} = {} does not equal the world size {}", p.tp, p.cp,
                     p.pp, dp, p.tp * p.cp * p.pp * dp, world_size));
  if ((dp * p.cp) % p.ep != 0)
    fail(fmt::format("parallel.ep={} does not divide dp*cp = {}*{} = {} (expert ranks are carved from them)",
                     p.ep, dp, p.cp, dp * p.cp));
  if (t.global_batch_size % (t.micro_batch_size * dp) != 0)
    fail(fmt::format("training.global_batch_size={} is not divisible by micro_batch_size*dp = {}*{} = {}",
                     t.global_batch_size, t.micro_batch_size, dp, t.micro_batch_size * dp));

  const int64_t micro_batches = t.global_batch_size / (t.micro_batch_size * dp);
  if (p.virtual_stages > 1 && micro_batches % p.pp != 0)
    fail(
        fmt::format("parallel.virtual_stages={}: the interleaved schedule takes micro-batches in groups of "
                    "parallel.pp={}, "
                    "but a step has {} per rank (global_batch_size / (micro_batch_size*dp) = {} / ({}*{}))",
                    p.virtual_stages, p.pp, micro_batches, t.global_batch_size, t.micro_batch_size, dp));
}

}  // namespace loom::config
