#include "loom/parallel/context/shard.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <numeric>

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

std::map<int64_t, ContextParallelGroup> context_parallel_degrees(std::shared_ptr<dist::Comm> cp,
                                                                 int64_t ulysses, bool every_divisor) {
  const int64_t size = cp ? cp->size() : 1;
  std::map<int64_t, ContextParallelGroup> groups;
  groups.emplace(size, context_parallel_group(cp, ulysses));
  for (int64_t d = 1; every_divisor && d < size; ++d) {
    if (size % d != 0) continue;
    std::shared_ptr<dist::Comm> comm;
    if (d > 1) {
      const int64_t group = cp->rank() / d;
      std::vector<int64_t> members(static_cast<size_t>(d));
      std::iota(members.begin(), members.end(), group * d);
      comm = cp->subgroup(fmt::format("degree{}.{}", d, group), members);
    }
    groups.emplace(d, context_parallel_group(std::move(comm), std::gcd(d, ulysses)));
  }
  return groups;
}

std::vector<std::pair<int64_t, int64_t>> ContextShard::held(size_t i, int64_t r) const {
  const Sequence& s = sequences[i];
  const int64_t ring = group.ring_size;
  if (ring == 1) return {{0, s.chunk}};
  if (causal) return {{r * s.chunk, s.chunk}, {(2 * ring - 1 - r) * s.chunk, s.chunk}};
  return {{r * s.chunk, s.chunk}};
}

namespace {

// The sequences' chunks and where they start in every ring shard (the shard's fields but the indexes).
ContextShard layout_of(const ContextParallelGroup& group, const std::vector<int64_t>& lengths, bool causal,
                       int64_t chunk_multiple) {
  ContextShard shard;
  shard.group = group;
  shard.causal = causal;
  const int64_t chunks = chunks_per_sequence(group.ring_size, causal);
  int64_t offset = 0;
  for (int64_t length : lengths) {
    if (length < 0) throw ModelError(fmt::format("context parallelism: a sequence of {} tokens", length));
    ContextShard::Sequence s;
    s.begin = shard.tokens;
    s.length = length;
    s.chunk = round_up(round_up(length, chunks) / chunks, chunk_multiple);
    s.offset = offset;
    offset += s.chunk * (chunks / group.ring_size);
    shard.tokens += length;
    shard.sequences.push_back(s);
  }
  shard.ring_length = offset;
  return shard;
}

// The tokens of sequence i in ring shard r, in order; `tokens` for padding.
std::vector<int64_t> ring_part(const ContextShard& shard, size_t i, int64_t r) {
  const auto& s = shard.sequences[i];
  std::vector<int64_t> slots;
  for (const auto& [first, length] : shard.held(i, r))
    for (int64_t j = 0; j < length; ++j)
      slots.push_back(first + j < s.length ? s.begin + first + j : shard.tokens);
  return slots;
}

// Fills local_index and restore from every rank's slots (`slots_of(r, u)`), in cp rank order.
template <class Slots>
void index_slots(ContextShard& shard, Slots slots_of) {
  const auto& group = shard.group;
  std::vector<int64_t> all;
  for (int64_t r = 0; r < group.ring_size; ++r)
    for (int64_t u = 0; u < group.ulysses_size; ++u) {
      std::vector<int64_t> slots = slots_of(r, u);
      if (r == group.ring_rank && u == group.ulysses_rank) shard.local_index = at::tensor(slots, at::kLong);
      all.insert(all.end(), slots.begin(), slots.end());
    }
  std::vector<int64_t> restore(static_cast<size_t>(shard.tokens));
  for (size_t slot = 0; slot < all.size(); ++slot)
    if (all[slot] < shard.tokens) restore[static_cast<size_t>(all[slot])] = static_cast<int64_t>(slot);
  shard.restore = at::tensor(restore, at::kLong);
}

}  // namespace

ContextShard context_shard(const ContextParallelGroup& group, const std::vector<int64_t>& lengths,
                           bool causal, int64_t align) {
  ContextShard shard = layout_of(group, lengths, causal, 1);
  shard.ring_length = round_up(std::max<int64_t>(shard.ring_length, 1), group.ulysses_size * align);
  shard.local_length = shard.ring_length / group.ulysses_size;
  index_slots(shard, [&shard](int64_t r, int64_t u) {
    std::vector<int64_t> ring_shard;
    for (size_t i = 0; i < shard.sequences.size(); ++i) {
      const auto part = ring_part(shard, i, r);
      ring_shard.insert(ring_shard.end(), part.begin(), part.end());
    }
    ring_shard.resize(static_cast<size_t>(shard.ring_length), shard.tokens);
    const auto begin = ring_shard.begin() + u * shard.local_length;
    return std::vector<int64_t>(begin, begin + shard.local_length);
  });
  return shard;
}

ContextShard context_row_shard(const ContextParallelGroup& group, int64_t rows, int64_t length, bool causal,
                               int64_t align) {
  ContextShard shard = layout_of(group, std::vector<int64_t>(static_cast<size_t>(rows), length), causal,
                                 group.ulysses_size * align);
  shard.rows = rows;
  shard.local_length = shard.ring_length / group.ulysses_size;
  const int64_t per_row = rows > 0 ? shard.local_length / rows : 0;
  index_slots(shard, [&](int64_t r, int64_t u) {
    std::vector<int64_t> slots;
    for (size_t i = 0; i < shard.sequences.size(); ++i) {
      const auto part = ring_part(shard, i, r);
      slots.insert(slots.end(), part.begin() + u * per_row, part.begin() + (u + 1) * per_row);
    }
    return slots;
  });
  // Every row's slots hold the same positions of it: row 0's tokens are those positions.
  const at::Tensor first_row = shard.local_index.narrow(0, 0, per_row);
  shard.row_index = at::where(first_row < shard.tokens, first_row, at::full_like(first_row, length));
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

at::Tensor ContextShard::scatter_rows(const at::Tensor& x, double fill) const {
  if (rows == 0 || x.size(0) != rows || x.size(1) * rows != tokens)
    throw ModelError(
        fmt::format("context parallelism: a [{}, {}, ...] tensor to shard by rows, the layout has "
                    "{} rows of {} tokens",
                    x.size(0), x.dim() > 1 ? x.size(1) : 0, rows, rows > 0 ? tokens / rows : 0));
  std::vector<int64_t> pad_shape = x.sizes().vec();
  pad_shape[1] = 1;
  return at::cat({x, at::full(pad_shape, fill, x.options())}, 1).index_select(1, row_index.to(x.device()));
}

ContextAttention context_attention_plan(const ContextShard& shard, const std::vector<int64_t>& segments) {
  ContextAttention plan;
  plan.group = shard.group;
  plan.causal = shard.causal;
  plan.rows = shard.rows;
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
    // The ring shard holds every sequence whole, each followed by its padding (a segment of its own),
    // and the shard's padding at the end.
    plan.cu_seqlens = {0};
    size_t next = 0;
    for (const auto& s : shard.sequences) {
      for (; next < nonempty_segments.size() && nonempty_segments[next].first < s.begin + s.length; ++next)
        plan.cu_seqlens.push_back(s.offset + nonempty_segments[next].second - s.begin);
      if (s.chunk > s.length) plan.cu_seqlens.push_back(s.offset + s.chunk);
    }
    if (shard.ring_length > plan.cu_seqlens.back()) plan.cu_seqlens.push_back(shard.ring_length);
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
