#include "loom/parallel/pipeline/order.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "loom/util/errors.h"

namespace loom::parallel::pipeline {
namespace {

using Kind = Action::Kind;

void check(const Shape& shape, int64_t rank) {
  if (shape.stages < 1 || shape.virtual_stages < 1 || shape.micro_batches < 0 || rank < 0 ||
      rank >= shape.stages)
    throw ModelError(
        fmt::format("a pipeline order for rank {} of {} stages x {} virtual stages and {} micro-batches",
                    rank, shape.stages, shape.virtual_stages, shape.micro_batches));
}

// The (micro-batch, chunk) pairs in the order forwards take them on every rank: micro-batches in
// groups of `stages`, each group through chunk 0, then chunk 1, ... (a single group through one
// chunk without virtual stages). Backwards take them in the same order with the chunks reversed.
std::vector<std::pair<int64_t, int64_t>> forward_table(const Shape& shape) {
  std::vector<std::pair<int64_t, int64_t>> table;
  const int64_t group = shape.virtual_stages > 1 ? shape.stages : std::max<int64_t>(1, shape.micro_batches);
  for (int64_t first = 0; first < shape.micro_batches; first += group) {
    const int64_t end = std::min(first + group, shape.micro_batches);
    for (int64_t chunk = 0; chunk < shape.virtual_stages; ++chunk)
      for (int64_t m = first; m < end; ++m) table.emplace_back(m, chunk);
  }
  return table;
}

// The compute actions in `computes`, each with the receive before it and the send after it that its
// global stage needs.
std::vector<Action> with_communication(const std::vector<Action>& computes, const Shape& shape,
                                       int64_t rank) {
  const int64_t last = shape.global_stages() - 1;
  std::vector<Action> order;
  for (const Action& a : computes) {
    const int64_t stage = global_stage(shape, rank, a.chunk);
    if (a.kind == Kind::forward) {
      if (stage > 0) order.push_back({Kind::receive_forward, a.micro_batch, a.chunk});
      order.push_back(a);
      if (stage < last) order.push_back({Kind::send_forward, a.micro_batch, a.chunk});
    } else {
      if (stage < last) order.push_back({Kind::receive_backward, a.micro_batch, a.chunk});
      order.push_back(a);
      if (stage > 0) order.push_back({Kind::send_backward, a.micro_batch, a.chunk});
    }
  }
  return order;
}

}  // namespace

std::vector<Action> gpipe_order(const Shape& shape, int64_t rank) {
  check(shape, rank);
  const auto table = forward_table(shape);
  std::vector<Action> computes;
  for (const auto& [m, chunk] : table) computes.push_back({Kind::forward, m, chunk});
  for (const auto& [m, chunk] : table)
    computes.push_back({Kind::backward, m, shape.virtual_stages - 1 - chunk});
  return with_communication(computes, shape, rank);
}

std::vector<Action> one_f_one_b_order(const Shape& shape, int64_t rank) {
  check(shape, rank);
  if (shape.virtual_stages > 1 && shape.micro_batches % shape.stages != 0)
    throw ConfigError(
        fmt::format("parallel.virtual_stages={}: the interleaved schedule takes micro-batches in groups of "
                    "parallel.pp={}, "
                    "and a step has {} (make global_batch_size / (micro_batch_size x dp) a multiple of pp)",
                    shape.virtual_stages, shape.stages, shape.micro_batches));
  const auto table = forward_table(shape);
  const int64_t total = static_cast<int64_t>(table.size());
  // Forwards run ahead of backwards by enough to fill the pipeline: the last stage none, each stage
  // before it one more (two more between chunks' passes with virtual stages, as a forward and a
  // backward go round the ring), plus one group per chunk after the first.
  int64_t warmup = shape.stages - rank - 1;
  if (shape.virtual_stages > 1) warmup = warmup * 2 + (shape.virtual_stages - 1) * shape.stages;
  warmup = std::min(warmup, total);
  auto forward = [&](int64_t k) { return Action{Kind::forward, table[k].first, table[k].second}; };
  auto backward = [&](int64_t k) {
    return Action{Kind::backward, table[k].first, shape.virtual_stages - 1 - table[k].second};
  };
  std::vector<Action> computes;
  for (int64_t k = 0; k < warmup; ++k) computes.push_back(forward(k));
  for (int64_t k = 0; k + warmup < total; ++k) {
    computes.push_back(forward(k + warmup));
    computes.push_back(backward(k));
  }
  for (int64_t k = total - warmup; k < total; ++k) computes.push_back(backward(k));
  return with_communication(computes, shape, rank);
}

std::vector<Action> recompute_in_bubbles(const std::vector<Action>& order, const Shape& shape, int64_t rank) {
  const int64_t last = shape.global_stages() - 1;
  std::vector<std::pair<int64_t, int64_t>>
      warmup;  // (micro-batch, chunk) of the forwards before the first rB
  for (const Action& a : order) {
    if (a.kind == Kind::receive_backward) break;
    if (a.kind == Kind::forward && global_stage(shape, rank, a.chunk) != last)
      warmup.emplace_back(a.micro_batch, a.chunk);
  }
  bool any_backward_receive = false;
  for (const Action& a : order) any_backward_receive |= a.kind == Kind::receive_backward;
  if (!warmup.empty() && any_backward_receive) warmup.pop_back();  // the forward the first backward follows
  std::vector<Action> out;
  for (const Action& a : order) {
    if (a.kind == Kind::receive_backward &&
        std::find(warmup.begin(), warmup.end(), std::make_pair(a.micro_batch, a.chunk)) != warmup.end())
      out.push_back({Kind::recompute, a.micro_batch, a.chunk});
    out.push_back(a);
  }
  return out;
}

std::string describe(const std::vector<Action>& order, const Shape& shape) {
  std::string out;
  for (const Action& a : order) {
    const char* prefix = "";
    char pass = 'F';
    switch (a.kind) {
      case Kind::receive_forward:
        prefix = "r";
        break;
      case Kind::forward:
        break;
      case Kind::send_forward:
        prefix = "s";
        break;
      case Kind::receive_backward:
        prefix = "r", pass = 'B';
        break;
      case Kind::backward:
        pass = 'B';
        break;
      case Kind::send_backward:
        prefix = "s", pass = 'B';
        break;
      case Kind::recompute:
        pass = 'R';
        break;
    }
    out += fmt::format("{}{}{}{}", out.empty() ? "" : " ", prefix, pass, a.micro_batch);
    if (shape.virtual_stages > 1) out += fmt::format(".{}", a.chunk);
  }
  return out;
}

}  // namespace loom::parallel::pipeline
