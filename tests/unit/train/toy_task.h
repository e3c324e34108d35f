// A model and a task that are nothing like a vision-language model, for showing that the trainer,
// the parallel plan and the schedule assume no model family: a 4-layer tanh MLP (three hidden
// layers that are the model's layers, passing "hidden" in the carry, and an output head the task
// applies) regressing a closed-form
// target y = sum_j c_j x_j^2 of inputs x_ij = sin(0.37 i + 1.1 j), the loss the mean squared error
// over the samples of the global batch (the count that normalises it is samples, not tokens).
#pragma once
#include <fmt/format.h>
#include <torch/nn/modules/linear.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "loom/core/layout.h"
#include "loom/core/model.h"
#include "loom/core/task.h"

namespace loom::testing {

// The micro-batch's inputs, read by the first layer.
struct ToyContext : core::Context {
  at::Tensor x;  // (B, kInputs)
};

// hidden = tanh(linear(x)), x the inputs for the first layer and the carry's hidden after it.
class ToyLayer : public core::Layer {
 public:
  ToyLayer(std::string name, torch::nn::Linear linear, bool first)
      : core::Layer(std::move(name), linear.ptr()), linear_(std::move(linear)), first_(first) {}
  bool block() const override { return true; }
  core::Carry forward(core::Carry carry, const core::Context& context) const override {
    const at::Tensor& x = first_ ? static_cast<const ToyContext&>(context).x : carry.get("hidden");
    carry.set("hidden", at::tanh(linear_.ptr()->forward(x)));
    return carry;
  }

 private:
  torch::nn::Linear linear_;
  bool first_;
};

class ToyMlp : public torch::nn::Module, public core::Model {
 public:
  static constexpr int64_t kInputs = 8, kWidth = 16, kHidden = 3;

  ToyMlp() {
    for (int64_t i = 0; i < kHidden; ++i) {
      const std::string name = fmt::format("layers_{}", i);
      auto linear = register_module(name, torch::nn::Linear(i == 0 ? kInputs : kWidth, kWidth));
      layers_.push_back(std::make_shared<ToyLayer>(name, linear, i == 0));
    }
    head = register_module("head", torch::nn::Linear(kWidth, 1));
  }

  // The head on the last layer's hidden: (B, kWidth) -> (B).
  at::Tensor predict(const at::Tensor& hidden) { return head->forward(hidden).squeeze(-1); }
  // x (B, kInputs) -> (B), every layer run directly.
  at::Tensor forward(const at::Tensor& x) {
    ToyContext context;
    context.x = x;
    return predict(core::run_layers(layers_, {}, context).get("hidden"));
  }

  torch::nn::Module& module() override { return *this; }
  core::Layers layers() const override { return layers_; }
  nlohmann::json hf_config() const override {
    return {
        {"model_type", "loom_toy_mlp"}, {"inputs", kInputs}, {"width", kWidth}, {"hidden_layers", kHidden}};
  }
  std::vector<std::string> freeze_examples() const override { return {"layers_0", "head"}; }

  torch::nn::Linear head{nullptr};

 private:
  core::Layers layers_;
};

struct ToyBatch : core::MicroBatch {
  at::Tensor x, y;  // (B, kInputs), (B)
};

class ToyRegression : public core::Task {
 public:
  ToyRegression(std::shared_ptr<ToyMlp> model, const core::Layout& layout, int64_t global_batch,
                int64_t micro_batch)
      : model_(std::move(model)), layout_(layout), global_(global_batch), micro_(micro_batch) {}

  // Samples [begin, end): the inputs and their closed-form targets.
  static ToyBatch samples(int64_t begin, int64_t end) {
    ToyBatch b;
    b.x = at::empty({end - begin, ToyMlp::kInputs}, at::kFloat);
    b.y = at::zeros({end - begin}, at::kFloat);
    auto x = b.x.accessor<float, 2>();
    auto y = b.y.accessor<float, 1>();
    for (int64_t i = begin; i < end; ++i)
      for (int64_t j = 0; j < ToyMlp::kInputs; ++j) {
        x[i - begin][j] =
            static_cast<float>(std::sin(0.37 * static_cast<double>(i) + 1.1 * static_cast<double>(j)));
        y[i - begin] +=
            static_cast<float>(0.1 * static_cast<double>(j + 1)) * x[i - begin][j] * x[i - begin][j];
      }
    return b;
  }

  // This rank's equal, contiguous share of the step's samples, in micro-batches.
  int64_t epoch_samples() const override { return 0; }  // drawn afresh every step
  core::StepData step_data(int64_t step) const override {
    const int64_t share = global_ / layout_.data_parallel();
    const int64_t begin = step * global_ + layout_.data_rank() * share;
    core::StepData out;
    for (int64_t m = begin; m < begin + share; m += micro_) {
      auto batch = std::make_shared<ToyBatch>(samples(m, std::min(m + micro_, begin + share)));
      out.loss_count += static_cast<double>(batch->x.size(0));
      out.micro_batches.push_back(std::move(batch));
    }
    return out;
  }
  std::string loss_count_name() const override { return "samples"; }
  core::ForwardResult forward(const core::MicroBatch& micro, const core::Stage& stage,
                              core::Carry input) override {
    const auto& batch = static_cast<const ToyBatch&>(micro);
    auto context = std::make_shared<ToyContext>();
    context->x = batch.x;
    core::ForwardResult out;
    core::Carry carry = stage.forward(std::move(input), context);
    if (stage.last)
      out.loss_sum = (model_->predict(carry.get("hidden")) - batch.y).pow(2).sum();
    else
      out.output = std::move(carry);
    out.samples = batch.x.size(0);
    out.tokens = out.samples;
    return out;
  }
  // Mean squared error on 64 held-out samples (past every training step's).
  core::Evaluation evaluate(int64_t) override {
    at::NoGradGuard no_grad;
    const ToyBatch held_out = samples(1000000, 1000064);
    const double mse = (model_->forward(held_out.x) - held_out.y).pow(2).mean().item<double>();
    core::Evaluation e;
    e.samples = 64;
    e.metrics.emplace_back("eval_mse", mse);
    e.summary = fmt::format("eval mse {:.6f} on 64 held-out samples", mse);
    e.report = fmt::format("eval: mse {:.6f}\n", mse);
    return e;
  }
  void save_artifacts(const std::string&) const override {}  // the weights are the whole model

 private:
  std::shared_ptr<ToyMlp> model_;
  core::Layout layout_;
  int64_t global_, micro_;
};

}  // namespace loom::testing
