// The reference text-to-video pipeline's samplers (docs/models.md) for the flow ODE dx/dsigma = v(x, sigma)
// from noise (sigma ~ 1) to data (sigma = 0): the step schedules and DiT timesteps of its dpm++ and unipc
// paths, Euler, DPM-Solver++(2M) and UniPC (bh2), classifier-free guidance, and the whole loop around a
// velocity model (loom generate's video path).
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace loom::tasks::flow_matching {

enum class Solver {
  euler,     // x <- x + (sigma_t - sigma_s) v; first order, on the dpm++ schedule
  dpmpp_2m,  // "dpm++": DPM-Solver++(2M), multistep, second order (Lu et al. 2022)
  unipc,  // "unipc": UniPC bh2, predictor + corrector of order 2 (Zhao et al. 2023); the reference's default
};

// "euler" | "dpm++" | "unipc" (the reference's --sample_solver names, plus euler); ConfigError naming
// `option` and the valid names.
Solver parse_solver(const std::string& name, const std::string& option = "--solver");
std::string solver_name(Solver solver);

// The noise levels of a run of `steps` steps, steps + 1 values from sigma_0 down to sigma_steps = 0,
// exactly as the reference's schedulers hold them (float32 values, returned as double):
//   dpm++ and euler: shift_sigma(linspace(1, 0, steps + 1)[:steps], shift), then 0; sigma_0 = 1.
//   unipc: shift_sigma(linspace(sigma_max, 0, steps + 1)[:steps], shift), then 0, where
//     sigma_max = float32(1 - 1/1000) = 0.99900001287... is the first noise level of the 1000-step
//     training table (fm_solvers_unipc.py __init__ / set_timesteps); sigma_0 < 1.
// linspace is numpy's: start + i * ((stop - start) / steps). ConfigError unless steps >= 1 and shift > 0.
std::vector<double> sampling_sigmas(int64_t steps, double shift, Solver solver);

// The timestep the DiT is given at each of the `steps` steps: int64(1000 * sigma_i), truncated, with
// sigma_i the float64 value before it is rounded to float32 (upstream's set_timesteps). So the model
// sees whole numbers (1000, 978, ... for dpm++; 999, 978, ... for unipc, 10 steps, shift 5) while the
// solver uses the float sigmas.
std::vector<int64_t> sampling_timesteps(int64_t steps, double shift, Solver solver);

// One solver over one schedule. step(x, v, i) must be called for i = 0, 1, ..., steps - 1 in order:
// the multistep solvers keep the data predictions m_i = x_i - sigma_i v_i of the last steps (and UniPC
// the sample before its last prediction). Coefficients are float64; tensors are float32 (float64 if
// x is float64, which the tests use to measure convergence below float32 rounding).
//   Euler: x_{i+1} = x_i + (sigma_{i+1} - sigma_i) v_i.
//   DPM-Solver++(2M) (Lu et al. 2022, arXiv:2211.01095, Algorithm 2 with the midpoint form), with
//     alpha = 1 - sigma, lambda = log(alpha / sigma), h = lambda_{i+1} - lambda_i:
//     x_{i+1} = (sigma_{i+1}/sigma_i) x_i - alpha_{i+1} (e^-h - 1) (m_i + (m_i - m_{i-1}) / (2 r)),
//     r = (lambda_i - lambda_{i-1}) / h; first order (the D term dropped) at the first step (no history)
//     and at the last step (upstream's final_sigmas_type "zero": it lands on m_i). Upstream's
//     lower_order_final rule for steps < 15 also lowers the second-to-last step, but only from order 3
//     to 2, so for 2M it changes nothing.
//   UniPC (Zhao et al. 2023, arXiv:2302.04867; B(h) = e^-h - 1, data prediction): at step i > 0 the
//     corrector UniC first recomputes x_i from x_{i-1} with the new m_i (order of the previous
//     predictor), then the predictor UniP of order min(2, i + 1, steps - i) gives x_{i+1}. The final
//     sample is never corrected (no model call follows it).
// sigma_0 = 1 is allowed: lambda_0 = -inf, and the IEEE limits give the exact first-order step
// (x_1 = sigma_1 x_0 + alpha_1 m_0) and a zero second-order term next.
class FlowSolver {
 public:
  // sigmas: steps + 1 values, strictly decreasing, sigma_0 <= 1, sigma_steps = 0 (as sampling_sigmas
  // gives them). ConfigError otherwise.
  FlowSolver(Solver solver, std::vector<double> sigmas);
  FlowSolver(Solver solver, int64_t steps, double shift);  // sampling_sigmas(steps, shift, solver)

  Solver solver() const { return solver_; }
  int64_t steps() const { return static_cast<int64_t>(sigmas_.size()) - 1; }
  const std::vector<double>& sigmas() const { return sigmas_; }

  // x at sigma_i [...] and the (guided) velocity there [same shape] -> x at sigma_{i+1} [same shape].
  // ModelError if i is not the next step or the shapes differ.
  at::Tensor step(const at::Tensor& x, const at::Tensor& velocity, int64_t i);

 private:
  at::Tensor dpmpp_2m_step(const at::Tensor& x, const at::Tensor& m, int64_t i) const;
  at::Tensor unipc_correct(const at::Tensor& m, int64_t i) const;
  at::Tensor unipc_predict(const at::Tensor& x, const at::Tensor& m, int64_t i, int order) const;

  Solver solver_;
  std::vector<double> sigmas_;
  std::vector<double> lambdas_;  // log((1 - sigma) / sigma): -inf at sigma = 1, +inf at 0
  int64_t next_ = 0;             // the step step() expects next
  at::Tensor m_prev_, m_prev2_;  // m_{i-1}, m_{i-2} (undefined until there)
  at::Tensor last_sample_;       // UniPC: x_{i-1}, the sample its last predictor started from
  int last_order_ = 0;           // UniPC: the order of the last predictor
};

// Classifier-free guidance: v_u + g (v_c - v_u), both at the same x and timestep.
// unconditional, conditional [...] (the same shape) -> [...]. g = 1 gives v_c, g = 0 gives v_u.
at::Tensor guided(const at::Tensor& unconditional, const at::Tensor& conditional, double guidance);

// The reference's defaults (generate.py): 50 steps, shift 5, unipc.
struct SamplingOptions {
  int64_t steps = 50;             // >= 1
  double shift = 5.0;             // > 0
  Solver solver = Solver::unipc;  // euler | dpm++ | unipc
};

// ConfigError naming the option (as loom generate spells it) for a value out of range.
void check_sampling(const SamplingOptions& options);

// The sample at sigma = 0 from `noise` [...] taken as the sample at sigma_0 (not rescaled, as upstream):
// velocity(x, t) gets x [...] (float32, or float64 if noise is) and the DiT timestep t of the step
// (sampling_timesteps: a whole number, as double) and returns the velocity there [same shape], already
// guided. Runs without gradients.
at::Tensor sample(const std::function<at::Tensor(const at::Tensor& x, double timestep)>& velocity,
                  at::Tensor noise, const SamplingOptions& options);

}  // namespace loom::tasks::flow_matching
