#include "loom/parallel/context/shard.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "loom/dist/mappings.h"
#include "loom/util/errors.h"

namespace loom::parallel {
namespace {

int64_t round_up(int64_t n, int64_t multiple) { return (n + multiple - 1) / multiple * multiple; }

// The chunks a sequence is cut into over the ring.
int64_t chunks_per_sequence(int64_t ring, bool causal) {
  if (ring == 1) return 1;
  return causal ? 2 * ring : ring;
}

}  // namespace

ContextParallelGroup context_parallel_group(std::shared_ptr<dist::Comm> cp, int64_t ulysses) {
  ContextParallelGroup group;
  const int64_t size = cp ? cp->size() : 1;
  if (ulysses < 1 || size % ulysses != 0)
    throw ConfigError(
        fmt::format("parallel.cp_ulysses={} does not divide parallel.cp={}: the cp ranks form Ulysses groups "
                    "of cp_ulysses ranks and rings across them",
                    ulysses, size));
  if (size == 1) return group;
  group.cp = cp;
  group.ulysses_size = ulysses;
  group.ring_size = size / ulysses;
  group.ulysses_rank = cp->rank() % ulysses;
  group.ring_rank = cp->rank() / ulysses;
  // Each rank forms the two subgroups it is a member of (a degree of 1 needs none; the whole cp
  // group needs no second one).
  std::vector<int64_t> ulysses_members, ring_members;
  for (int64_t u = 0; u < ulysses; ++u) ulysses_members.push_back(group.ring_rank * ulysses + u);
  for (int64_t r = 0; r < group.ring_size; ++r) ring_members.push_back(r * ulysses + group.ulysses_rank);
  if (ulysses == size)
    group.ulysses = cp;
  else if (ulysses > 1)
    group.ulysses = cp->subgroup(fmt::format("ulysses.{}", group.ring_rank), ulysses_members);
  if (group.ring_size == size)
    group.ring = cp;
  else if (group.ring_size > 1)
    group.ring = cp->subgroup(fmt::format("ring.{}", group.ulysses_rank), ring_members);
  return group;
}

std::vector<std::pair<int64_t, int64_t>> ContextShard::held(size_t i, int64_t r) const {
  const Sequence& s = sequences[i];
  const int64_t ring = group.ring_size;
  if (ring == 1) return {{0, s.chunk}};
  if (causal) return {{r * s.chunk, s.chunk}, {(2 * ring - 1 - r) * s.chunk, s.chunk}};
  return {{r * s.chunk, s.chunk}};
}

ContextShard context_shard(const ContextParallelGroup& group, const std::vector<int64_t>& lengths,
                           bool causal, int64_t align) {
  ContextShard shard;
  shard.group = group;
  shard.causal = causal;
  const int64_t ring = group.ring_size, chunks = chunks_per_sequence(ring, causal);
  int64_t offset = 0;
  for (int64_t length : lengths) {
    if (length < 0) throw ModelError(fmt::format("context parallelism: a sequence of {} tokens", length));
    ContextShard::Sequence s;
    s.begin = shard.tokens;
    s.length = length;
    s.chunk = round_up(length, chunks) / chunks;
    s.offset = offset;
    offset += s.chunk * (chunks / ring);
    shard.tokens += length;
    shard.sequences.push_back(s);
  }
  shard.ring_length = round_up(std::max<int64_t>(offset, 1), group.ulysses_size * align);
  shard.local_length = shard.ring_length / group.ulysses_size;
  // Every ring shard's token index, padding pointing past the last token.
  std::vector<int64_t> all(static_cast<size_t>(ring * shard.ring_length), shard.tokens);
  for (int64_t r = 0; r < ring; ++r) {
    int64_t* slots = all.data() + r * shard.ring_length;
    for (size_t i = 0; i < shard.sequences.size(); ++i) {
      const auto& s = shard.sequences[i];
      int64_t at = s.offset;
      for (const auto& [first, length] : shard.held(i, r))
        for (int64_t j = 0; j < length; ++j, ++at)
          if (first + j < s.length) slots[at] = s.begin + first + j;
    }
  }
  const int64_t mine = group.rank() * shard.local_length;
  shard.local_index = at::tensor(
      std::vector<int64_t>(all.begin() + mine, all.begin() + mine + shard.local_length), at::kLong);
  std::vector<int64_t> restore(static_cast<size_t>(shard.tokens));
  for (size_t slot = 0; slot < all.size(); ++slot)
    if (all[slot] < shard.tokens) restore[static_cast<size_t>(all[slot])] = static_cast<int64_t>(slot);
  shard.restore = at::tensor(restore, at::kLong);
  return shard;
}

at::Tensor ContextShard::scatter(const at::Tensor& x, double fill) const {
  if (x.size(0) != tokens)
    throw ModelError(
        fmt::format("context parallelism: {} rows to shard, the layout has {} tokens", x.size(0), tokens));
  std::vector<int64_t> pad_shape = x.sizes().vec();
  pad_shape[0] = 1;
  return at::cat({x, at::full(pad_shape, fill, x.options())}).index_select(0, local_index.to(x.device()));
}

at::Tensor ContextShard::gather(const at::Tensor& x) const {
  if (x.size(0) != local_length)
    throw ModelError(
        fmt::format("context parallelism: {} rows to gather, this rank holds {}", x.size(0), local_length));
  return dist::gather_from_sequence_region(x, group.cp, 0).index_select(0, restore.to(x.device()));
}

ContextAttention context_attention_plan(const ContextShard& shard, const std::vector<int64_t>& segments) {
  ContextAttention plan;
  plan.group = shard.group;
  plan.causal = shard.causal;
  if (segments.empty() || segments.front() != 0 || segments.back() != shard.tokens)
    throw ModelError(
        fmt::format("context parallelism: attention segments must run from 0 to {} tokens, got [{}]",
                    shard.tokens, fmt::join(segments, ", ")));
  // The sequence each non-empty segment lies in (segments do not decrease, so neither does it).
  std::vector<size_t> within(segments.size(), 0);
  std::vector<std::pair<int64_t, int64_t>> nonempty_segments, nonempty_sequences;
  size_t i = 0;
  for (size_t j = 0; j + 1 < segments.size(); ++j) {
    const int64_t a = segments[j], b = segments[j + 1];
    if (b < a)
      throw ModelError(fmt::format("context parallelism: segments must not decrease, got {} then {}", a, b));
    if (a == b) continue;
    nonempty_segments.emplace_back(a, b);
    while (shard.sequences[i].begin + shard.sequences[i].length <= a) ++i;  // the last one ends at `tokens`
    const auto& s = shard.sequences[i];
    if (b > s.begin + s.length)
      throw ModelError(
          fmt::format("context parallelism: the attention segment [{}, {}) crosses the end of a sequence of "
                      "the layout at {}",
                      a, b, s.begin + s.length));
    within[j] = i;
  }
  for (const auto& s : shard.sequences)
    if (s.length > 0) nonempty_sequences.emplace_back(s.begin, s.begin + s.length);
  if (shard.causal && nonempty_segments != nonempty_sequences)
    throw ModelError("context parallelism: causal attention's segments must be the layout's sequences");
  const int64_t ring = shard.group.ring_size;
  if (ring == 1) {
    // The ring shard is the axis itself, its padding at the end.
    plan.cu_seqlens = segments;
    if (shard.ring_length > shard.tokens) plan.cu_seqlens.push_back(shard.ring_length);
    return plan;
  }
  const int64_t r = shard.group.ring_rank;
  plan.blocks.resize(static_cast<size_t>(ring));
  if (shard.causal) {
    // Zig-zag: the queries' two chunks against a source's first chunk (it comes before both), the
    // later chunk against both of a source with a later first chunk, and causal over its own.
    for (const auto& s : shard.sequences) {
      if (s.length == 0) continue;
      for (int64_t source = 0; source < ring; ++source) {
        auto& blocks = plan.blocks[static_cast<size_t>(source)];
        if (source == r)
          blocks.push_back({s.offset, 2 * s.chunk, s.offset, 2 * s.chunk});
        else if (source < r)
          blocks.push_back({s.offset, 2 * s.chunk, s.offset, s.chunk});
        else
          blocks.push_back({s.offset + s.chunk, s.chunk, s.offset, 2 * s.chunk});
      }
    }
    return plan;
  }
  // Bidirectional: each segment's tokens held by this rank against those held by the source.
  auto part = [&](const ContextShard::Sequence& s, int64_t a, int64_t b, int64_t rank) {
    const int64_t first = std::max(a, rank * s.chunk), last = std::min(b, (rank + 1) * s.chunk);
    return std::pair<int64_t, int64_t>{s.offset + first - rank * s.chunk, std::max<int64_t>(0, last - first)};
  };
  for (size_t j = 0; j + 1 < segments.size(); ++j) {
    if (segments[j] == segments[j + 1]) continue;
    const auto& s = shard.sequences[within[j]];
    const int64_t a = segments[j] - s.begin, b = segments[j + 1] - s.begin;
    const auto [q_begin, q_length] = part(s, a, b, r);
    if (q_length == 0) continue;
    for (int64_t source = 0; source < ring; ++source) {
      const auto [k_begin, k_length] = part(s, a, b, source);
      if (k_length > 0)
        plan.blocks[static_cast<size_t>(source)].push_back({q_begin, q_length, k_begin, k_length});
    }
  }
  return plan;
}

}  // namespace loom::parallel
