// Recompute's mechanics on small layers of known arithmetic: how often a layer's forward runs, that
// gradients and random draws replay the plain run's exactly, what the node takes in and gives out.
#include "loom/memory/recompute.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>

#include <memory>
#include <string>
#include <thread>

#include "loom/memory/counting_allocator.h"
#include "loom/util/errors.h"

namespace loom::memory {
namespace {

struct NoContext : core::Context {};

// hidden = tanh(linear(hidden)) * (dropout mask when `drop` > 0) + shared, counting its forwards;
// `fail_after` forwards it throws.
class CountingLayer : public core::Layer {
 public:
  CountingLayer(std::string name, torch::nn::Linear linear, double drop)
      : core::Layer(std::move(name), linear.ptr()), linear_(std::move(linear)), drop_(drop) {}
  bool block() const override { return true; }
  core::Carry forward(core::Carry carry, const core::Context&) const override {
    ++runs;
    if (fail_after >= 0 && runs > fail_after) throw ModelError(name() + " failed on purpose");
    at::Tensor h = at::tanh(at::linear(carry.get("hidden"), linear_->weight, linear_->bias));
    if (drop_ > 0) h = at::dropout(h, drop_, /*train=*/true);
    if (carry.has("shared")) h = h + carry.get("shared");
    carry.set("hidden", h);
    return carry;
  }
  mutable int runs = 0;
  int fail_after = -1;

 private:
  torch::nn::Linear linear_;
  double drop_;
};

struct Stack {
  std::vector<std::shared_ptr<CountingLayer>> counting;
  core::Layers layers;
  explicit Stack(int n, double drop = 0.0) {
    at::manual_seed(11);
    for (int i = 0; i < n; ++i) {
      counting.push_back(
          std::make_shared<CountingLayer>("layers." + std::to_string(i), torch::nn::Linear(6, 6), drop));
      layers.push_back(counting.back());
    }
  }
  std::vector<at::Tensor> parameters() const {
    std::vector<at::Tensor> out;
    for (const auto& layer : layers)
      for (const auto& p : layer->module().parameters()) out.push_back(p);
    return out;
  }
};

std::shared_ptr<RecomputeRunner> runner_over(const Stack& stack, int64_t first_n) {
  config::FeaturesSection features;
  features.recompute = "full";
  features.recompute_layers = first_n;
  return recompute_runner(features, stack.layers);
}

at::Tensor input() { return at::linspace(-1.0, 1.0, 24).view({4, 6}).requires_grad_(true); }

at::Tensor run(const Stack& stack, const core::RunnerChain& runners, const at::Tensor& x,
               const at::Tensor& shared = {}) {
  core::Carry carry;
  carry.set("hidden", x);
  if (shared.defined()) carry.set("shared", shared);
  const core::Stage stage{stack.layers, runners};
  return stage.forward(std::move(carry), std::make_shared<NoContext>()).get("hidden").pow(2).sum();
}

TEST(Recompute, ARecomputedLayerRunsForwardExactlyTwice) {
  const Stack stack(3);
  const auto runner = runner_over(stack, 2);  // layers 0 and 1
  const at::Tensor loss = run(stack, {runner}, input());
  for (const auto& layer : stack.counting) EXPECT_EQ(layer->runs, 1) << layer->name() << " after forward";
  loss.backward();
  EXPECT_EQ(stack.counting[0]->runs, 2);
  EXPECT_EQ(stack.counting[1]->runs, 2);
  EXPECT_EQ(stack.counting[2]->runs, 1);  // past recompute_layers: its saved tensors were kept
}

TEST(Recompute, WithoutGradModeTheLayerRunsOnce) {
  const Stack stack(2);
  const at::NoGradGuard no_grad;
  const at::Tensor loss = run(stack, {runner_over(stack, 0)}, input());
  EXPECT_FALSE(loss.requires_grad());
  for (const auto& layer : stack.counting) EXPECT_EQ(layer->runs, 1);
}

TEST(Recompute, GradientsAreBitIdenticalToThePlainRun) {
  const Stack plain(3), twice(3);
  const at::Tensor x = input(), y = input();
  run(plain, {}, x).backward();
  run(twice, {runner_over(twice, 0)}, y).backward();
  EXPECT_TRUE(y.grad().equal(x.grad()));
  const auto want = plain.parameters(), got = twice.parameters();
  for (size_t i = 0; i < want.size(); ++i) EXPECT_TRUE(got[i].grad().equal(want[i].grad())) << i;
}

// A layer drawing from the default generator (dropout) draws the same mask again when recomputed,
// and the draws after backward continue as if nothing had been recomputed.
TEST(Recompute, RandomDrawsReplayIdentically) {
  const Stack plain(2, 0.5), twice(2, 0.5);
  const at::Tensor x = input(), y = input();
  at::manual_seed(5);
  const at::Tensor plain_loss = run(plain, {}, x);
  const at::Tensor plain_between = at::rand({8});
  plain_loss.backward();
  const at::Tensor plain_after = at::rand({8});
  at::manual_seed(5);
  const at::Tensor loss = run(twice, {runner_over(twice, 0)}, y);
  const at::Tensor between = at::rand({8});
  loss.backward();
  const at::Tensor after = at::rand({8});
  EXPECT_TRUE(loss.equal(plain_loss));
  EXPECT_TRUE(between.equal(plain_between));
  EXPECT_TRUE(after.equal(plain_after));
  EXPECT_TRUE(y.grad().equal(x.grad()));
  const auto want = plain.parameters(), got = twice.parameters();
  for (size_t i = 0; i < want.size(); ++i) EXPECT_TRUE(got[i].grad().equal(want[i].grad())) << i;
}

// An entry every layer reads but none changes (as Wan's time modulation) is handed on as it was,
// not as an output of the layer's node, and still gets its gradient.
TEST(Recompute, PassThroughEntriesStayOutsideTheNode) {
  const Stack plain(2), twice(2), probed(2);
  const at::Tensor x = input(), y = input();
  const at::Tensor shared_plain = at::full({4, 6}, 0.25).requires_grad_(true);
  const at::Tensor shared = at::full({4, 6}, 0.25).requires_grad_(true);
  run(plain, {}, x, shared_plain).backward();
  const at::Tensor loss = run(twice, {runner_over(twice, 0)}, y, shared);
  loss.backward();
  EXPECT_TRUE(shared.grad().equal(shared_plain.grad()));
  EXPECT_TRUE(y.grad().equal(x.grad()));

  core::Carry carry;
  carry.set("hidden", y);
  carry.set("shared", shared);
  const core::Carry out = recomputed(
      std::move(carry), [&](core::Carry c) { return probed.layers[0]->forward(std::move(c), NoContext()); },
      true);
  EXPECT_TRUE(out.get("shared").is_same(shared));
  ASSERT_NE(out.get("hidden").grad_fn(), nullptr);
  EXPECT_EQ(out.get("hidden").grad_fn()->name(), "loom::RecomputeBackward");
  EXPECT_EQ(out.get("hidden").grad_fn()->num_inputs(), 1U);   // one output: hidden
  EXPECT_EQ(out.get("hidden").grad_fn()->num_outputs(), 2U);  // two inputs: hidden and shared
}

TEST(Recompute, AnErrorWhileRecomputingIsTheBackwardsError) {
  const Stack stack(2);
  stack.counting[1]->fail_after = 1;
  const at::Tensor loss = run(stack, {runner_over(stack, 0)}, input());
  try {
    loss.backward();
    FAIL() << "backward passed over the failed recompute";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("layers.1 failed on purpose"), std::string::npos) << e.what();
  }
}

// h = 2 tanh(x W^T + b): autograd keeps each layer's tanh output and its result (the next layer's
// input); recomputed, only the result, which the next node keeps as its input. Counted by the
// allocator: the forward of 3 layers over a 64 x 256 batch leaves at least 6 such tensors,
// recomputed exactly 3, with a copy of the CPU generator's state per layer, and with offload only
// the last output (the nodes' inputs are in the spill file).
class DoubledTanh : public core::Layer {
 public:
  explicit DoubledTanh(torch::nn::Linear linear)
      : core::Layer("block", linear.ptr()), linear_(std::move(linear)) {}
  bool block() const override { return true; }
  core::Carry forward(core::Carry carry, const core::Context&) const override {
    carry.set("hidden", at::tanh(at::linear(carry.get("hidden"), linear_->weight, linear_->bias)) * 2.0);
    return carry;
  }

 private:
  torch::nn::Linear linear_;
};

TEST(Recompute, ARecomputedLayerKeepsOnlyItsInputForBackward) {
  core::Layers layers;
  for (int i = 0; i < 3; ++i) layers.push_back(std::make_shared<DoubledTanh>(torch::nn::Linear(256, 256)));
  const at::Tensor x = at::randn({64, 256}).requires_grad_(true);
  CountingAllocator& counter = CountingAllocator::install();
  const CountingAllocator::Scope counted;
  const int64_t one = 64 * 256 * 4;
  const int64_t generator_state = at::detail::getDefaultCPUGenerator().get_state().nbytes();
  config::FeaturesSection full;
  full.recompute = "full";
  config::FeaturesSection offloaded = full;
  offloaded.offload = true;
  for (const config::FeaturesSection* features :
       {static_cast<config::FeaturesSection*>(nullptr), &full, &offloaded}) {
    core::RunnerChain runners;
    if (features) runners.push_back(recompute_runner(*features, layers));
    core::Carry carry;
    carry.set("hidden", x);
    const int64_t before = counter.live_bytes();
    core::Carry out = core::Stage{layers, runners}.forward(std::move(carry), std::make_shared<NoContext>());
    if (!features)
      EXPECT_GE(counter.live_bytes() - before, 6 * one);
    else if (!features->offload)
      EXPECT_EQ(counter.live_bytes() - before, 3 * (one + generator_state));
    else  // offloaded: the inputs of blocks 1 and 2 (blocks 0's and 1's outputs) left; the caller holds x
      EXPECT_EQ(counter.live_bytes() - before, one + 3 * generator_state);
    out.get("hidden").sum().backward();
  }
}

// checkpoint at operation granularity, as selective recompute uses it: QuickGELU's composite over a
// 64 x 256 input keeps its sigmoid and its product for backward (two tensors of the input's size);
// checkpointed, only its output is new (and the generator state), and the gradient is the same.
TEST(SelectiveRecompute, ACheckpointedOperationKeepsOnlyItsInputs) {
  auto quick_gelu = [](const std::vector<at::Tensor>& in) { return in[0] * at::sigmoid(1.702 * in[0]); };
  const at::Tensor x = at::randn({64, 256}).requires_grad_(true), y = x.detach().clone().requires_grad_(true);
  CountingAllocator& counter = CountingAllocator::install();
  const CountingAllocator::Scope counted;
  const int64_t one = 64 * 256 * 4;
  const int64_t generator_state = at::detail::getDefaultCPUGenerator().get_state().nbytes();
  int64_t before = counter.live_bytes();
  const at::Tensor plain = quick_gelu({x});
  EXPECT_GE(counter.live_bytes() - before, 2 * one);
  before = counter.live_bytes();
  const at::Tensor twice = checkpoint(quick_gelu, {y});
  EXPECT_EQ(counter.live_bytes() - before, one + generator_state);
  EXPECT_TRUE(twice.equal(plain));
  (plain * plain).sum().backward();
  (twice * twice).sum().backward();
  EXPECT_TRUE(y.grad().equal(x.grad()));
}

// hidden = linear(sin(hidden)): the linear saves sin's output, which selective recompute empties after
// the forward and makes again (from the input sin keeps) before the layer's backward.
class Refilling : public core::Layer {
 public:
  explicit Refilling(torch::nn::Linear linear)
      : core::Layer("block", linear.ptr()), linear_(std::move(linear)) {}
  bool block() const override { return true; }
  core::Carry forward(core::Carry carry, const core::Context&) const override {
    const at::Tensor x = carry.get("hidden");
    made = refilled_in_backward(at::sin(x), [x] { return at::sin(x); });
    carry.set("hidden", at::linear(made, linear_->weight, linear_->bias));
    return carry;
  }
  mutable at::Tensor made;

 private:
  torch::nn::Linear linear_;
};

TEST(SelectiveRecompute, ARefilledTensorIsEmptyAfterForwardAndBackBeforeItsBackward) {
  at::manual_seed(3);
  auto plain_layer = std::make_shared<Refilling>(torch::nn::Linear(32, 32));
  at::manual_seed(3);
  auto layer = std::make_shared<Refilling>(torch::nn::Linear(32, 32));
  const core::Layers plain{plain_layer}, layers{layer};
  config::FeaturesSection features;
  features.recompute = "selective";
  const auto runner = recompute_runner(features, layers);
  ASSERT_TRUE(runner->selective());
  const at::Tensor x = at::randn({16, 32}).requires_grad_(true), y = x.detach().clone().requires_grad_(true);
  auto run = [](const core::Layers& l, const core::RunnerChain& runners, const at::Tensor& input) {
    core::Carry carry;
    carry.set("hidden", input);
    return core::Stage{l, runners}.forward(std::move(carry), std::make_shared<NoContext>()).get("hidden");
  };
  const at::Tensor want = run(plain, {}, x);
  EXPECT_EQ(plain_layer->made.storage().nbytes(), 16U * 32 * 4);  // no scope: kept
  const at::Tensor got = run(layers, {runner}, y);
  EXPECT_EQ(layer->made.storage().nbytes(), 0U);
  EXPECT_TRUE(got.equal(want));
  (want * want).sum().backward();
  (got * got).sum().backward();
  EXPECT_EQ(layer->made.storage().nbytes(), 16U * 32 * 4);
  EXPECT_TRUE(layer->made.equal(plain_layer->made));
  EXPECT_TRUE(y.grad().equal(x.grad()));
  const auto want_params = plain_layer->module().parameters(), got_params = layer->module().parameters();
  for (size_t i = 0; i < want_params.size(); ++i)
    EXPECT_TRUE(got_params[i].grad().equal(want_params[i].grad()));
}

TEST(SelectiveRecompute, TheScopeIsThisThreadsAndEndsWithIt) {
  EXPECT_FALSE(selective());
  {
    const SelectiveScope scope;
    EXPECT_TRUE(selective());
    bool elsewhere = true;
    std::thread([&elsewhere] { elsewhere = selective(); }).join();
    EXPECT_FALSE(elsewhere);
  }
  EXPECT_FALSE(selective());
}

std::shared_ptr<RecomputeRunner> offloading_runner(const core::Layers& layers) {
  config::FeaturesSection features;
  features.recompute = "full";
  features.offload = true;
  auto runner = recompute_runner(features, layers);
  EXPECT_NE(runner->offloader(), nullptr);
  return runner;
}

// hidden = tanh(linear(hidden)), keeping a copy of every input it is given.
class RecordingLayer : public core::Layer {
 public:
  explicit RecordingLayer(torch::nn::Linear linear)
      : core::Layer("block", linear.ptr()), linear_(std::move(linear)) {}
  bool block() const override { return true; }
  core::Carry forward(core::Carry carry, const core::Context&) const override {
    seen.push_back(carry.get("hidden").detach().clone());
    carry.set("hidden", at::tanh(at::linear(carry.get("hidden"), linear_->weight, linear_->bias)));
    return carry;
  }
  mutable std::vector<at::Tensor> seen;

 private:
  torch::nn::Linear linear_;
};

TEST(Offload, AnOffloadedInputIsBackBeforeTheRecomputeReadsIt) {
  auto make = [] {
    at::manual_seed(13);
    std::vector<std::shared_ptr<RecordingLayer>> out;
    for (int i = 0; i < 3; ++i) out.push_back(std::make_shared<RecordingLayer>(torch::nn::Linear(8, 8)));
    return out;
  };
  const auto plain = make(), moved = make();
  const core::Layers plain_layers(plain.begin(), plain.end()), layers(moved.begin(), moved.end());
  const auto runner = offloading_runner(layers);
  const at::Tensor x = at::randn({5, 8}).requires_grad_(true), y = x.detach().clone().requires_grad_(true);
  auto run = [](const core::Layers& l, const core::RunnerChain& runners, const at::Tensor& input) {
    core::Carry carry;
    carry.set("hidden", input);
    return core::Stage{l, runners}.forward(std::move(carry), std::make_shared<NoContext>()).get("hidden");
  };
  const at::Tensor want = run(plain_layers, {}, x);
  const at::Tensor got = run(layers, {runner}, y);
  const int64_t one = 5 * 8 * 4;
  EXPECT_EQ(runner->offloader()->bytes_moved(), 3 * one);  // each block's input
  EXPECT_EQ(runner->offloader()->bytes_prefetched(), 0);
  (want * want).sum().backward();
  (got * got).sum().backward();
  // Backward reached blocks 2 and 1 with the inputs of blocks 1 and 0 read ahead (block 2's, the
  // first needed, is read when its node runs); each recompute saw the input its forward saw.
  EXPECT_EQ(runner->offloader()->bytes_prefetched(), 2 * one);
  for (const auto& layer : moved) {
    ASSERT_EQ(layer->seen.size(), 2U);
    EXPECT_TRUE(layer->seen[1].equal(layer->seen[0]));
  }
  EXPECT_TRUE(y.grad().equal(x.grad()));
  for (size_t i = 0; i < plain.size(); ++i) {
    const auto want_params = plain[i]->module().parameters(), got_params = moved[i]->module().parameters();
    for (size_t k = 0; k < want_params.size(); ++k)
      EXPECT_TRUE(got_params[k].grad().equal(want_params[k].grad()));
  }
}

TEST(Offload, PassThroughEntriesAreNeverMoved) {
  const Stack stack(2);
  const auto runner = offloading_runner(stack.layers);
  const at::Tensor shared = at::full({4, 6}, 0.25).requires_grad_(true);
  const at::Tensor loss = run(stack, {runner}, input(), shared);
  EXPECT_EQ(runner->offloader()->bytes_moved(), 2 * 4 * 6 * 4);  // the two hidden inputs, not shared
  loss.backward();
  EXPECT_TRUE(shared.grad().defined());
}

TEST(Recompute, NoneBuildsNoRunner) {
  const Stack stack(2);
  EXPECT_EQ(recompute_runner(config::FeaturesSection(), stack.layers), nullptr);
}

}  // namespace
}  // namespace loom::memory
