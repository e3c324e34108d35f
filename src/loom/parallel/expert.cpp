#include "loom/parallel/expert.h"

#include <fmt/format.h>

#include <cmath>
#include <vector>

#include "loom/dist/mappings.h"
#include "loom/util/errors.h"
#include "loom/util/timer.h"

namespace loom::parallel {

ExpertDispatch dispatch_by_expert(const at::Tensor& chosen, int64_t experts, const at::Tensor& kept) {
  if (chosen.dim() != 2)
    throw ModelError(fmt::format("expert dispatch: the picks must be (tokens, k), got [{}]",
                                 fmt::join(chosen.sizes(), ", ")));
  if (kept.defined() && kept.sizes() != chosen.sizes())
    throw ModelError(fmt::format("expert dispatch: the kept picks are [{}], the picks [{}]",
                                 fmt::join(kept.sizes(), ", "), fmt::join(chosen.sizes(), ", ")));
  ExpertDispatch d;
  d.tokens = chosen.size(0);
  d.top_k = chosen.size(1);
  d.experts = experts;
  // The dispatched slots in token order (all, or the kept), then stably sorted by expert.
  at::Tensor slots = kept.defined() ? kept.flatten().nonzero().flatten()
                                    : at::arange(chosen.numel(), chosen.options().dtype(at::kLong));
  const at::Tensor flat = chosen.flatten().to(at::kLong).index_select(0, slots);
  d.slot = slots.index_select(
      0, std::get<1>(at::sort(flat, /*stable=*/std::optional<bool>(true), /*dim=*/0, /*descending=*/false)));
  d.token = at::floor_divide(d.slot, d.top_k);
  d.counts = at::bincount(flat, /*weights=*/{}, experts);
  if (d.counts.size(0) != experts)
    throw ModelError(
        fmt::format("expert dispatch: a pick names expert {} of {}", d.counts.size(0) - 1, experts));
  d.ends = d.counts.cumsum(0).to(at::kInt);
  return d;
}

at::Tensor within_capacity(const at::Tensor& chosen, const at::Tensor& priority, int64_t experts,
                           int64_t capacity) {
  const at::Tensor flat = chosen.flatten().to(at::kLong);
  // The slots by priority (highest first; stable: the earlier token first among equals), then stably
  // by expert: each expert's picks in the order they keep their place.
  const at::Tensor by_priority = std::get<1>(
      at::sort(priority.flatten(), /*stable=*/std::optional<bool>(true), /*dim=*/0, /*descending=*/true));
  const at::Tensor expert_of = flat.index_select(0, by_priority);
  const at::Tensor order =
      by_priority.index_select(0, std::get<1>(at::sort(expert_of, /*stable=*/std::optional<bool>(true),
                                                       /*dim=*/0, /*descending=*/false)));
  const at::Tensor counts = at::bincount(flat, /*weights=*/{}, experts);
  const at::Tensor starts = counts.cumsum(0) - counts;
  const at::Tensor place =
      at::arange(flat.numel(), flat.options()) - starts.index_select(0, flat.index_select(0, order));
  return at::zeros({flat.numel()}, chosen.options().dtype(at::kBool))
      .index_put_({order}, place.lt(capacity))
      .view(chosen.sizes());
}

int64_t expert_capacity(double factor, int64_t tokens, int64_t top_k, int64_t experts) {
  return static_cast<int64_t>(
      std::ceil(factor * static_cast<double>(tokens * top_k) / static_cast<double>(experts)));
}

at::Tensor dispatch_rows(const ExpertDispatch& d, const at::Tensor& x) { return x.index_select(0, d.token); }

at::Tensor combine_rows(const ExpertDispatch& d, const at::Tensor& rows, const at::Tensor& weights) {
  const at::Tensor scale = weights.flatten().index_select(0, d.slot).unsqueeze(1).to(rows.scalar_type());
  return at::zeros({d.tokens, rows.size(1)}, rows.options()).index_add(0, d.token, rows * scale);
}

namespace {

// Where each source rank's rows of each expert go for one pass (to its owner, or to a rank holding a
// copy of it), the copies, and the rows each rank computes: the same on every rank, from every
// rank's counts.
struct ExchangePlan {
  int64_t ranks = 0, local = 0;
  std::vector<std::vector<int64_t>> counts;  // [source][expert]: rows
  std::vector<std::vector<int64_t>> dest;    // [source][expert]: the rank computing them
  struct Copy {
    int64_t expert, from, to;
  };
  std::vector<Copy> copies;          // in the order they were made
  std::vector<int64_t> load_before;  // rows per rank with every expert at its owner
  std::vector<int64_t> load;         // rows per rank
  int64_t owner(int64_t expert) const { return expert / local; }
  // The copies rank `to` receives, in the order they travel (by the rank sending, then as made).
  std::vector<Copy> copies_to(int64_t to) const {
    std::vector<Copy> out;
    for (int64_t from = 0; from < ranks; ++from)
      for (const Copy& c : copies)
        if (c.to == to && c.from == from) out.push_back(c);
    return out;
  }
  // The group rank `r` computes expert e's rows in: its own experts first, then its copies.
  int64_t group(int64_t r, int64_t e) const {
    if (owner(e) == r) return e - r * local;
    const auto mine = copies_to(r);
    for (size_t j = 0; j < mine.size(); ++j)
      if (mine[j].expert == e) return local + static_cast<int64_t>(j);
    throw ModelError(fmt::format("expert exchange: rank {} holds no copy of expert {}", r, e));
  }
};

ExchangePlan plan_exchange(const at::Tensor& counts, int64_t ranks, double replicate_above) {
  ExchangePlan p;
  p.ranks = ranks;
  const int64_t experts = counts.size(1);
  p.local = experts / ranks;
  const at::Tensor c = counts.to(at::kLong).contiguous();  // on the host
  const int64_t* rows = c.data_ptr<int64_t>();
  p.counts.assign(ranks, std::vector<int64_t>(experts));
  p.dest.assign(ranks, std::vector<int64_t>(experts));
  p.load.assign(ranks, 0);
  for (int64_t s = 0; s < ranks; ++s)
    for (int64_t e = 0; e < experts; ++e) {
      p.counts[s][e] = rows[s * experts + e];
      p.dest[s][e] = p.owner(e);
      p.load[p.owner(e)] += p.counts[s][e];
    }
  p.load_before = p.load;
  if (replicate_above <= 0) return p;
  int64_t total = 0;
  for (int64_t l : p.load) total += l;
  const double mean = static_cast<double>(total) / static_cast<double>(ranks);
  // Greedy, at most one copy a rank pair per pass: while the most loaded rank is over the threshold,
  // copy its hottest expert (by the rows it still computes) to the least loaded rank, and send it
  // whole sources' rows of that expert (the receiving rank's own first, then the next ranks) up to
  // half the two ranks' difference.
  for (int64_t step = 0; step + 1 < ranks; ++step) {
    const int64_t o = std::max_element(p.load.begin(), p.load.end()) - p.load.begin();
    const int64_t u = std::min_element(p.load.begin(), p.load.end()) - p.load.begin();
    if (static_cast<double>(p.load[o]) <= replicate_above * mean || o == u) break;
    int64_t hot = -1, hottest = 0;
    for (int64_t e = o * p.local; e < (o + 1) * p.local; ++e) {
      int64_t rows = 0;
      for (int64_t s = 0; s < ranks; ++s)
        if (p.dest[s][e] == o) rows += p.counts[s][e];
      const bool copied = std::any_of(p.copies.begin(), p.copies.end(), [&](const ExchangePlan::Copy& x) {
        return x.expert == e && x.to == u;
      });
      if (rows > hottest && !copied) hot = e, hottest = rows;
    }
    if (hot < 0) break;
    const int64_t target = (p.load[o] - p.load[u]) / 2;
    int64_t moved = 0;
    for (int64_t i = 0; i < ranks; ++i) {
      const int64_t s = (u + i) % ranks;
      const int64_t rows = p.counts[s][hot];
      if (p.dest[s][hot] != o || rows == 0 || moved + rows > target) continue;
      p.dest[s][hot] = u;
      moved += rows;
    }
    if (moved == 0) break;
    p.copies.push_back({hot, o, u});
    p.load[o] -= moved;
    p.load[u] += moved;
  }
  return p;
}

ExpertStats stats;

// The experts' computation, timed and its FLOPs counted (each row through one expert's matrix of
// each weight).
at::Tensor computed(const ExpertCompute& experts, const at::Tensor& rows, const at::Tensor& ends,
                    const std::vector<at::Tensor>& weights) {
  const auto begin = Clock::now();
  at::Tensor out = experts(rows, ends, weights);
  stats.compute_s += seconds_since(begin);
  for (const at::Tensor& w : weights)
    if (w.size(0) > 0) stats.flops += 2.0 * static_cast<double>(rows.size(0) * (w.numel() / w.size(0)));
  stats.rows += rows.size(0);
  return out;
}

at::Tensor inverse_of(const at::Tensor& order) {
  return at::empty_like(order).scatter_(0, order, at::arange(order.numel(), order.options()));
}

}  // namespace

at::Tensor exchange_with_experts(const ExpertDispatch& d, const at::Tensor& rows,
                                 const ExpertExchange& exchange, const std::vector<at::Tensor>& weights,
                                 const ExpertCompute& experts, const std::function<void()>& in_flight,
                                 ExchangeLoad* load) {
  const std::shared_ptr<dist::Comm>& ep = exchange.ep;
  if (!ep || ep->size() == 1) {
    if (in_flight) in_flight();
    return computed(experts, rows, d.ends, weights);
  }
  const int64_t ranks = ep->size(), me = ep->rank(), local = d.experts / ranks;
  if (d.experts % ranks != 0)
    throw ModelError(fmt::format("expert parallelism: {} ranks do not split {} experts", ranks, d.experts));
  // Every rank's rows per expert (one small gather, to the host), from which every rank makes the
  // same plan.
  const at::Tensor mine = d.counts.to(at::kCPU).contiguous();
  at::Tensor every = at::empty({ranks * d.experts}, mine.options());
  ep->all_gather_flat(mine, every);
  const ExchangePlan plan = plan_exchange(every.view({ranks, d.experts}), ranks, exchange.replicate_above);
  if (load) {
    int64_t total = 0;
    for (int64_t l : plan.load) total += l;
    load->most_before =
        static_cast<double>(*std::max_element(plan.load_before.begin(), plan.load_before.end()));
    load->most = static_cast<double>(*std::max_element(plan.load.begin(), plan.load.end()));
    load->mean = static_cast<double>(total) / static_cast<double>(ranks);
  }
  // This rank's rows in order of the rank computing them (stable: by expert, then token, within a
  // rank), and the splits each way.
  std::vector<int64_t> send_splits(ranks, 0), receive_splits(ranks, 0);
  std::vector<int64_t> dest_of_expert(d.experts);
  for (int64_t e = 0; e < d.experts; ++e) {
    dest_of_expert[e] = plan.dest[me][e];
    send_splits[plan.dest[me][e]] += plan.counts[me][e];
    for (int64_t s = 0; s < ranks; ++s)
      if (plan.dest[s][e] == me) receive_splits[s] += plan.counts[s][e];
  }
  at::Tensor sent = rows, by_dest;
  if (!plan.copies.empty()) {
    const at::Tensor dest_of_row =
        at::tensor(dest_of_expert, at::kLong).repeat_interleave(mine).to(rows.device());
    by_dest = std::get<1>(
        at::sort(dest_of_row, /*stable=*/std::optional<bool>(true), /*dim=*/0, /*descending=*/false));
    sent = rows.index_select(0, by_dest);
  }
  // Started, then what does not need the rows (in_flight: the shared expert) runs before the wait.
  dist::StartedRows started = dist::start_all_to_all(sent, ep, receive_splits, send_splits);
  if (in_flight) in_flight();
  auto begin = Clock::now();
  if (started.work) started.work->wait();
  stats.wait_s += seconds_since(begin);
  const at::Tensor& received = started.rows;
  stats.ep = ep;
  stats.exchanges += 2;
  stats.bytes += (sent.numel() + received.numel()) * sent.element_size();
  // The rows received, each source's in expert order, regrouped by the group computing them here
  // (stable: by source, then token order, within a group): this rank's experts, then its copies.
  const auto copies = plan.copies_to(me);
  std::vector<int64_t> group_of_row;
  group_of_row.reserve(static_cast<size_t>(received.size(0)));
  std::vector<int64_t> group_rows(static_cast<size_t>(local) + copies.size(), 0);
  for (int64_t s = 0; s < ranks; ++s)
    for (int64_t e = 0; e < d.experts; ++e)
      if (plan.dest[s][e] == me && plan.counts[s][e] > 0) {
        const int64_t g = plan.group(me, e);
        group_of_row.insert(group_of_row.end(), plan.counts[s][e], g);
        group_rows[g] += plan.counts[s][e];
      }
  const at::Tensor order = std::get<1>(at::sort(at::tensor(group_of_row, at::kLong).to(rows.device()),
                                                /*stable=*/std::optional<bool>(true), /*dim=*/0,
                                                /*descending=*/false));
  const at::Tensor ends = at::tensor(group_rows, at::kLong).cumsum(0).to(at::kInt).to(rows.device());
  // The copies' weights from their owners (one exchange per weight; its backward sends each copy's
  // gradient back, where it adds to the owner's).
  std::vector<at::Tensor> held = weights;
  if (!plan.copies.empty()) {
    std::vector<int64_t> send_copies(ranks, 0), receive_copies(ranks, 0), sent_experts;
    for (int64_t to = 0; to < ranks; ++to)
      for (const auto& c : plan.copies_to(to)) {
        if (c.from == me) {
          ++send_copies[to];
          sent_experts.push_back(c.expert - me * local);
        }
        if (to == me) ++receive_copies[c.from];
      }
    const at::Tensor index = at::tensor(sent_experts, at::kLong).to(rows.device());
    for (at::Tensor& w : held)
      w = at::cat({w, dist::all_to_all(w.index_select(0, index), ep, receive_copies, send_copies)});
  }
  const at::Tensor out = computed(experts, received.index_select(0, order), ends, held);
  begin = Clock::now();
  const at::Tensor back =
      dist::all_to_all(out.index_select(0, inverse_of(order)), ep, send_splits, receive_splits);
  stats.wait_s += seconds_since(begin);  // nothing to hide the combine behind
  stats.bytes += (out.numel() + back.numel()) * out.element_size();
  return by_dest.defined() ? back.index_select(0, inverse_of(by_dest)) : back;
}

const ExpertStats& expert_stats() { return stats; }

void reset_expert_stats() { stats = ExpertStats{}; }

double time_expert_messages_alone() {
  const std::shared_ptr<dist::Comm> ep = stats.ep.lock();
  if (!ep || stats.exchanges == 0) return 0.0;
  // Each exchange's mean bytes sent over the ranks, split evenly, as fp32 rows of 256 (every rank
  // agrees on the size first).
  const int64_t ranks = ep->size();
  at::Tensor sizes =
      at::tensor({static_cast<double>(stats.bytes), static_cast<double>(stats.exchanges)}, at::kDouble);
  ep->all_reduce_sum({sizes});
  const double bytes = sizes[0].item<double>() / 2.0 / sizes[1].item<double>();
  const int64_t each =
      std::max<int64_t>(1, static_cast<int64_t>(bytes / 4.0 / 256.0 / static_cast<double>(ranks)));
  const at::Tensor sent = at::zeros({each * ranks, 256});
  at::Tensor received = at::empty_like(sent);
  const std::vector<int64_t> splits(static_cast<size_t>(ranks), each);
  ep->barrier();
  const auto begin = Clock::now();
  for (int64_t i = 0; i < stats.exchanges; ++i) ep->all_to_all(sent, received, splits, splits);
  return seconds_since(begin);
}

}  // namespace loom::parallel
