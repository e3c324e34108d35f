// A post-hook for a parameter's gradient accumulator: it runs once backward has added the pass's
// gradient into .grad, which is when the gradient reductions (data parallel, FSDP) learn that a
// parameter's gradient is ready.
#pragma once
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>

#include <functional>
#include <utility>

namespace loom::dist {

class GradientReadyHook : public torch::autograd::FunctionPostHook {
 public:
  explicit GradientReadyHook(std::function<void()> on_ready) : on_ready_(std::move(on_ready)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                            const torch::autograd::variable_list& /*inputs*/) override {
    on_ready_();
    return outputs;
  }

 private:
  std::function<void()> on_ready_;
};

}  // namespace loom::dist
