#include "loom/train/forward_backward.h"

#include <ATen/record_function.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <utility>

#include "loom/memory/counting_allocator.h"
#include "loom/parallel/pipeline/exchange.h"
#include "loom/parallel/pipeline/order.h"
#include "loom/util/errors.h"
#include "loom/util/timer.h"

namespace loom::train {

void ScheduleResult::add_expert_tokens(const at::Tensor& tokens) {
  if (!tokens.defined()) return;
  const at::Tensor counts = tokens.detach().to(at::kDouble).cpu().contiguous();
  if (expert_tokens.empty()) expert_tokens.assign(static_cast<size_t>(counts.numel()), 0.0);
  const double* data = counts.data_ptr<double>();
  for (size_t e = 0; e < expert_tokens.size(); ++e) expert_tokens[e] += data[e];
}

ScheduleResult forward_backward_no_pipelining(const ForwardStep& forward_step,
                                              const std::vector<core::Stage>& stages,
                                              const std::vector<std::shared_ptr<core::MicroBatch>>& batches,
                                              size_t passes, double scale, GradientSync& sync) {
  if (stages.size() != 1 || !stages.front().first || !stages.front().last)
    throw ModelError(fmt::format("forward_backward_no_pipelining runs one stage holding every layer, not {}",
                                 stages.size()));
  const core::Stage& stage = stages.front();
  const memory::CountingAllocator* counter = memory::CountingAllocator::installed();
  ScheduleResult r;
  for (size_t m = 0; m < passes; ++m) {
    sync.begin_pass();
    if (m >= batches.size()) {  // this rank's share had fewer micro-batches
      r.sync_s += sync.end_pass();
      continue;
    }
    const auto forward_begin = Clock::now();
    const int64_t allocated_before = counter ? counter->live_bytes() : 0;
    core::ForwardResult out;
    {
      RECORD_USER_SCOPE("forward");  // a range in loom bench --profile's trace
      out = forward_step(*batches[m], stage, {});
    }
    if (counter) r.activation_bytes = std::max(r.activation_bytes, counter->live_bytes() - allocated_before);
    r.forward_s += seconds_since(forward_begin);
    sync.before_backward(m + 1 == batches.size());
    const auto backward_begin = Clock::now();
    {
      RECORD_USER_SCOPE("backward");
      (out.loss_sum * scale).backward();
    }
    r.backward_s += seconds_since(backward_begin);
    r.loss_sum += out.loss_sum.item<double>();
    r.tokens += out.tokens;
    r.samples += out.samples;
    r.flops += out.flops;
    r.add_expert_tokens(out.expert_tokens);
    r.sync_s += sync.end_pass();
  }
  return r;
}

ScheduleResult forward_backward_pipelined(const ForwardStep& forward_step,
                                          const std::vector<core::Stage>& stages,
                                          const std::vector<std::shared_ptr<core::MicroBatch>>& batches,
                                          const dist::Comm& group, const PipelineRun& pipeline, double scale,
                                          GradientSync& sync) {
  namespace pp = parallel::pipeline;
  using Kind = pp::Action::Kind;
  const int64_t rank = group.rank(), ranks = group.size();
  const pp::Shape shape{ranks, static_cast<int64_t>(stages.size()), static_cast<int64_t>(batches.size())};
  std::vector<pp::Action> order =
      pipeline.schedule == "gpipe" ? pp::gpipe_order(shape, rank) : pp::one_f_one_b_order(shape, rank);
  if (pipeline.recompute_in_bubbles) order = pp::recompute_in_bubbles(order, shape, rank);
  // The passes run again before their backward keep only their input after the forward's send.
  std::set<std::pair<int64_t, int64_t>> recomputed;
  for (const pp::Action& a : order)
    if (a.kind == Kind::recompute) recomputed.emplace(a.micro_batch, a.chunk);
  const int64_t next = (rank + 1) % ranks, previous = (rank + ranks - 1) % ranks;
  pp::CarryExchange& exchange = *pipeline.exchange;
  // Each forward's header receive starts once the forward before it has its input.
  std::vector<const pp::Action*> receives;
  for (const pp::Action& a : order)
    if (a.kind == Kind::receive_forward) receives.push_back(&a);
  size_t next_receive = 0;
  auto start_next_receive = [&] {
    if (next_receive < receives.size()) {
      const pp::Action& a = *receives[next_receive++];
      exchange.start_receive_forward(previous, a.micro_batch, pp::global_stage(shape, rank, a.chunk));
    }
  };
  start_next_receive();
  size_t last_backward = 0;
  for (size_t i = 0; i < order.size(); ++i)
    if (order[i].kind == Kind::backward) last_backward = i;

  // What a micro-batch's pass through one chunk holds from its forward to its backward.
  struct InFlight {
    core::Carry input, output;
    std::map<std::string, at::Tensor> output_grads;
    at::Tensor loss;
    int64_t bytes = 0;  // the live bytes its forward (and recompute) added, under a counting allocator
  };
  std::map<std::pair<int64_t, int64_t>, InFlight> in_flight;
  // The activations the passes in flight hold: each forward's growth of the live bytes, given back when
  // its backward is done (the parameters' gradients, which stay, are not counted).
  const memory::CountingAllocator* counter = memory::CountingAllocator::installed();
  auto live = [counter] { return counter ? counter->live_bytes() : int64_t{0}; };
  int64_t held = 0;
  ScheduleResult r;
  auto grown = [&](InFlight& pass, int64_t before) {
    const int64_t bytes = live() - before;
    pass.bytes += bytes;
    held += bytes;
    r.activation_bytes = std::max(r.activation_bytes, held);
  };
  sync.begin_pass();
  for (size_t i = 0; i < order.size(); ++i) {
    const pp::Action& a = order[i];
    const int64_t stage = pp::global_stage(shape, rank, a.chunk);
    const core::Stage& chunk = stages[static_cast<size_t>(a.chunk)];
    const core::MicroBatch& batch = *batches[static_cast<size_t>(a.micro_batch)];
    InFlight& pass = in_flight[{a.micro_batch, a.chunk}];
    switch (a.kind) {
      case Kind::receive_forward: {
        const int64_t before = live();
        pass.input = exchange.receive_forward(previous, a.micro_batch, stage);
        start_next_receive();
        grown(pass, before);
        break;
      }
      case Kind::forward: {
        const auto begin = Clock::now();
        const int64_t before = live();
        core::ForwardResult out = forward_step(batch, chunk, pass.input);
        if (chunk.last) {
          pass.loss = out.loss_sum;
          r.loss_sum += out.loss_sum.item<double>();
          r.tokens += out.tokens;
          r.samples += out.samples;
          r.flops += out.flops;
          r.add_expert_tokens(out.expert_tokens);
        } else {
          pass.output = std::move(out.output);
        }
        grown(pass, before);
        r.forward_s += seconds_since(begin);
        break;
      }
      case Kind::send_forward:
        exchange.send_forward(pass.output, next, a.micro_batch, stage);
        exchange.start_receive_backward(pass.output, next, a.micro_batch, stage);
        if (recomputed.count({a.micro_batch, a.chunk})) {  // the output and its graph go
          const int64_t before = live();
          pass.output = core::Carry();
          grown(pass, before);
        }
        break;
      case Kind::recompute: {
        // The first run's output goes once its receiver has it (before it can send the gradient back).
        int64_t before = live();
        exchange.wait_forward_send(a.micro_batch, stage);
        grown(pass, before);
        const auto begin = Clock::now();
        before = live();
        pass.output = forward_step(batch, chunk, pass.input).output;
        grown(pass, before);
        r.forward_s += seconds_since(begin);
        break;
      }
      case Kind::receive_backward: {
        const int64_t before = live();
        exchange.wait_forward_send(a.micro_batch, stage);  // taken: its gradient is on the way
        pass.output_grads = exchange.receive_backward(a.micro_batch, stage);
        grown(pass, before);
        break;
      }
      case Kind::backward: {
        sync.before_backward(i == last_backward);
        const auto begin = Clock::now();
        if (chunk.last) {
          (pass.loss * scale).backward();
        } else {
          // From the output entries that need a gradient, with the gradients the next stage sent back.
          std::vector<at::Tensor> outputs, grads;
          for (const auto& [name, grad] : pass.output_grads) {
            outputs.push_back(pass.output.get(name));
            grads.push_back(grad);
          }
          if (!outputs.empty()) torch::autograd::backward(outputs, grads);
        }
        r.backward_s += seconds_since(begin);
        pass.output = core::Carry();
        exchange.give_back(pass.output_grads);  // for the next receives of their shapes
        pass.loss = at::Tensor();
        held -= pass.bytes;  // (the input's gradient, sent back next, is the stage before's to count)
        if (stage == 0) in_flight.erase({a.micro_batch, a.chunk});
        break;
      }
      case Kind::send_backward:
        exchange.send_backward(pass.input, previous, a.micro_batch, stage);
        in_flight.erase({a.micro_batch, a.chunk});
        break;
    }
  }
  r.receive_wait_s = exchange.take_receive_wait();
  r.sync_s += exchange.wait_sends();
  r.sync_s += sync.end_pass();
  return r;
}

ScheduleResult forward_backward(const ForwardStep& forward_step, const AppliedPlan& plan,
                                const std::vector<std::shared_ptr<core::MicroBatch>>& batches, size_t passes,
                                double scale) {
  if (plan.pipelined())
    return forward_backward_pipelined(forward_step, plan.stages, batches, *plan.state->pp(), plan.pipeline,
                                      scale, *plan.gradients);
  return forward_backward_no_pipelining(forward_step, plan.stages, batches, passes, scale, *plan.gradients);
}

}  // namespace loom::train
