// A model and a task that are nothing like a vision-language model, for showing that the trainer,
// the parallel plan and the schedule assume no model family: a 4-layer tanh MLP (three hidden
// layers that are the model's layers, and an output head outside them) regressing a closed-form
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
#include "loom/nn/block_runner.h"

namespace loom::testing {

class ToyMlp : public torch::nn::Module, public core::Model {
 public:
  static constexpr int64_t kInputs = 8, kWidth = 16, kHidden = 3;

  ToyMlp() {
    for (int64_t i = 0; i < kHidden; ++i)
      layers_.push_back(
          register_module(fmt::format("layers_{}", i), torch::nn::Linear(i == 0 ? kInputs : kWidth, kWidth)));
    head = register_module("head", torch::nn::Linear(kWidth, 1));
  }

  // x (B, kInputs) -> (B)
  at::Tensor forward(at::Tensor x) {
    for (auto& layer : layers_)
      x = nn::run_block(runner_.get(), *layer, x,
                        [&layer](const at::Tensor& h) { return at::tanh(layer->forward(h)); });
    return head->forward(x).squeeze(-1);
  }

  torch::nn::Module& module() override { return *this; }
  core::Layers layers() const override {
    core::Layers out;
    for (size_t i = 0; i < layers_.size(); ++i)
      out.emplace_back(fmt::format("layers_{}", i), layers_[i].ptr());
    return out;
  }
  void set_layer_runner(std::shared_ptr<nn::BlockRunner> runner) override { runner_ = std::move(runner); }
  nlohmann::json hf_config() const override {
    return {
        {"model_type", "loom_toy_mlp"}, {"inputs", kInputs}, {"width", kWidth}, {"hidden_layers", kHidden}};
  }
  std::vector<std::string> freeze_examples() const override { return {"layers_0", "head"}; }

  torch::nn::Linear head{nullptr};

 private:
  std::vector<torch::nn::Linear> layers_;
  std::shared_ptr<nn::BlockRunner> runner_;
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
  core::StepData step_data(int64_t step) const override {
    const int64_t share = global_ / layout_.data_parallel;
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
  core::ForwardResult forward(const core::MicroBatch& micro) override {
    const auto& batch = static_cast<const ToyBatch&>(micro);
    core::ForwardResult out;
    out.loss_sum = (model_->forward(batch.x) - batch.y).pow(2).sum();
    out.samples = batch.x.size(0);
    out.tokens = out.samples;
    return out;
  }
  // Mean squared error on 64 held-out samples (past every training step's).
  core::Evaluation evaluate() override {
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
