#include "loom/parallel/context/ring.h"

#include <ATen/core/ivalue.h>
#include <torch/csrc/autograd/custom_function.h>

#include <chrono>
#include <memory>
#include <vector>

#include "loom/kernels/attention.h"

namespace loom::parallel {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using Clock = std::chrono::steady_clock;

// Each call's messages take tags [base, base + 4 x ring): four per step (keys, values and, in the
// backward pass, their gradients), below 2^30.
constexpr int64_t kTagSpace = int64_t{1} << 30;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

RingStats& stats() {
  static RingStats process;
  return process;
}

// Messages in flight; wait() adds the time spent blocked to the ring's wait figure.
class InFlight {
 public:
  void send(const at::Tensor& t, int64_t peer, int64_t tag, dist::Comm& ring) {
    works_.push_back(ring.start_send(t, peer, tag));
    stats().bytes += t.numel() * static_cast<int64_t>(t.element_size());
    ++stats().messages;
  }
  void receive(const at::Tensor& t, int64_t peer, int64_t tag, dist::Comm& ring) {
    works_.push_back(ring.start_recv(t, peer, tag));
  }
  void wait() {
    const auto start = Clock::now();
    for (auto& work : works_) work->wait();
    works_.clear();
    stats().wait_s += seconds_since(start);
  }

 private:
  std::vector<std::unique_ptr<dist::PendingWork>> works_;
};

struct RingCall : torch::CustomClassHolder {
  explicit RingCall(ContextAttention p) : plan(std::move(p)) {}
  ContextAttention plan;
  int64_t source(int64_t step) const {
    const int64_t ring = plan.group.ring_size;
    return (plan.group.ring_rank - step + ring) % ring;
  }
  kernels::AttentionOptions options(int64_t source) const {
    return {plan.causal && source == plan.group.ring_rank};
  }
  const std::vector<kernels::AttentionBlock>& blocks(int64_t source) const {
    return plan.blocks[static_cast<size_t>(source)];
  }
  int64_t next() const { return (plan.group.ring_rank + 1) % plan.group.ring_size; }
  int64_t previous() const {
    return (plan.group.ring_rank - 1 + plan.group.ring_size) % plan.group.ring_size;
  }
  // Starts passing this step's keys and values on to the next rank, and receiving the next step's
  // from the previous one (none after the last step); returns the receive buffers.
  std::pair<at::Tensor, at::Tensor> pass_on(InFlight& messages, const at::Tensor& keys,
                                            const at::Tensor& values, int64_t step, int64_t steps,
                                            int64_t base) const {
    if (step + 1 == steps) return {};
    dist::Comm& ring = *plan.group.ring;
    at::Tensor next_keys = at::empty_like(keys), next_values = at::empty_like(values);
    messages.receive(next_keys, previous(), base + 4 * step, ring);
    messages.receive(next_values, previous(), base + 4 * step + 1, ring);
    messages.send(keys, next(), base + 4 * step, ring);
    messages.send(values, next(), base + 4 * step + 1, ring);
    return {next_keys, next_values};
  }
  int64_t tag_base() const {
    stats().ring = plan.group.ring;
    const int64_t per_call = 4 * plan.group.ring_size;
    return ((*plan.group.ring_calls)++ % (kTagSpace / per_call)) * per_call;
  }
};

// out, lse := the merge of the partial result `part` into them.
void merge(at::Tensor& out, at::Tensor& lse, kernels::AttentionResult part) {
  if (!out.defined()) {
    out = std::move(part.out);
    lse = std::move(part.lse);
    return;
  }
  const at::Tensor merged = at::logaddexp(lse, part.lse);  // -inf where neither saw a key
  auto weight = [&](const at::Tensor& l) {
    // A part that saw no key weighs 0 (exp(-inf - -inf) would be NaN); a NaN stays NaN.
    return at::exp(l - merged).masked_fill(at::isinf(l), 0.0).transpose(0, 1).unsqueeze(-1);  // (S, H, 1)
  };
  out = out * weight(lse) + part.out * weight(part.lse);
  lse = merged;
}

class RingAttentionFunction : public torch::autograd::Function<RingAttentionFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                               const at::Tensor& v, const c10::intrusive_ptr<RingCall>& call) {
    const int64_t steps = call->plan.group.ring_size, base = call->tag_base();
    at::Tensor keys = k.contiguous(), values = v.contiguous(), out, lse;
    for (int64_t step = 0; step < steps; ++step) {
      InFlight messages;
      auto [next_keys, next_values] = call->pass_on(messages, keys, values, step, steps, base);
      const auto start = Clock::now();
      const int64_t source = call->source(step);
      merge(out, lse,
            kernels::attention_forward(q, keys, values, call->blocks(source), call->options(source)));
      stats().compute_s += seconds_since(start);
      messages.wait();
      keys = next_keys;
      values = next_values;
    }
    ctx->saved_data["call"] = c10::IValue::make_capsule(call);
    ctx->save_for_backward({q, k, v, out, lse});
    return {out.to(q.scalar_type())};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto holder = ctx->saved_data["call"].toCapsule();
    const auto& call = *static_cast<RingCall*>(holder.get());
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3], &lse = saved[4];
    dist::Comm& ring = *call.plan.group.ring;
    const int64_t steps = call.plan.group.ring_size, base = call.tag_base();
    const at::Tensor dout = grads[0].to(at::kFloat).contiguous();
    at::Tensor dq = at::zeros(q.sizes(), q.options().dtype(at::kFloat));
    at::Tensor keys = k.contiguous(), values = v.contiguous();
    // The gradients of the block held now travel one hop behind it: each rank adds its share and
    // passes them on; after the last step they reach the block's owner.
    at::Tensor incoming_dk, incoming_dv;
    InFlight gradient_receives, gradient_sends;
    for (int64_t step = 0; step < steps; ++step) {
      InFlight messages;
      auto [next_keys, next_values] = call.pass_on(messages, keys, values, step, steps, base);
      const auto start = Clock::now();
      const int64_t source = call.source(step);
      kernels::AttentionGrads g = kernels::attention_backward(dout, q, keys, values, out, lse,
                                                              call.blocks(source), call.options(source));
      dq += g.dq;
      stats().compute_s += seconds_since(start);
      if (step > 0) {
        gradient_receives.wait();
        g.dk += incoming_dk;
        g.dv += incoming_dv;
      }
      gradient_sends.wait();  // the previous step's, whose buffers are about to go
      incoming_dk = at::empty_like(g.dk);
      incoming_dv = at::empty_like(g.dv);
      gradient_receives.receive(incoming_dk, call.previous(), base + 4 * step + 2, ring);
      gradient_receives.receive(incoming_dv, call.previous(), base + 4 * step + 3, ring);
      gradient_sends.send(g.dk, call.next(), base + 4 * step + 2, ring);
      gradient_sends.send(g.dv, call.next(), base + 4 * step + 3, ring);
      messages.wait();
      keys = next_keys;
      values = next_values;
    }
    gradient_receives.wait();  // this rank's own block's, complete
    gradient_sends.wait();
    return {dq.to(q.scalar_type()), incoming_dk.to(k.scalar_type()), incoming_dv.to(v.scalar_type()),
            at::Tensor()};
  }
};

}  // namespace

at::Tensor ring_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const ContextAttention& plan) {
  return RingAttentionFunction::apply(q, k, v, c10::make_intrusive<RingCall>(plan))[0];
}

const RingStats& ring_stats() { return stats(); }

void reset_ring_stats() {
  auto ring = stats().ring;
  stats() = {};
  stats().ring = ring;
}

double time_ring_messages_alone() {
  const RingStats& s = stats();
  const std::shared_ptr<dist::Comm> held = s.ring.lock();
  if (!held || s.messages == 0) return 0;
  // Two messages at a time each way, as a step sends its keys and values.
  dist::Comm& ring = *held;
  const int64_t next = (ring.rank() + 1) % ring.size(),
                previous = (ring.rank() - 1 + ring.size()) % ring.size();
  const at::Tensor out = at::zeros({2, std::max<int64_t>(1, s.bytes / s.messages)}, at::kByte),
                   in = at::empty_like(out);
  constexpr int64_t kTag = kTagSpace;  // above every ring attention call's tags
  const auto start = Clock::now();
  for (int64_t i = 0; i < (s.messages + 1) / 2; ++i) {
    std::vector<std::unique_ptr<dist::PendingWork>> works;
    for (int64_t j = 0; j < 2; ++j) {
      works.push_back(ring.start_recv(in[j], previous, kTag + j));
      works.push_back(ring.start_send(out[j], next, kTag + j));
    }
    for (auto& work : works) work->wait();
  }
  return seconds_since(start);
}

}  // namespace loom::parallel
