#include "loom/tasks/flow_matching/sampler.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "loom/tasks/flow_matching/schedule.h"
#include "loom/util/errors.h"

namespace loom::tasks::flow_matching {

namespace {

// The shifted noise levels of steps 0 .. steps-1 in float64, before upstream rounds them to float32:
// numpy's linspace(start, 0, steps + 1)[:steps] (start + i * step, step = (0 - start) / steps), shifted.
std::vector<double> shifted_grid(int64_t steps, double shift, Solver solver) {
  if (steps < 1) throw ConfigError(fmt::format("--steps: {} is not >= 1", steps));
  if (!(shift > 0) || !std::isfinite(shift))
    throw ConfigError(fmt::format("--shift: {} is not a finite number > 0", shift));
  // unipc starts from the 1000-step training table's first level 1 - 1/1000, held there as float32
  // (its sigma_max); dpm++ from get_sampling_sigmas' exact 1.
  const double start =
      solver == Solver::unipc ? static_cast<double>(static_cast<float>(1.0 - 1.0 / 1000)) : 1.0;
  const double step = (0.0 - start) / static_cast<double>(steps);
  std::vector<double> out(static_cast<size_t>(steps));
  for (int64_t i = 0; i < steps; ++i)
    out[static_cast<size_t>(i)] = shift_sigma(static_cast<double>(i) * step + start, shift);
  return out;
}

// log(alpha / sigma) with alpha = 1 - sigma, as two logs (upstream's form): -inf at 1, +inf at 0.
double lambda_of(double sigma) { return std::log(1 - sigma) - std::log(sigma); }

void check_sigmas(const std::vector<double>& sigmas) {
  if (sigmas.size() < 2)
    throw ConfigError(fmt::format("sigmas: {} values, not steps + 1 >= 2", sigmas.size()));
  if (!(sigmas.front() <= 1) || sigmas.back() != 0)
    throw ConfigError(fmt::format("sigmas: [{}] must start at most 1 and end at 0", fmt::join(sigmas, ", ")));
  for (size_t i = 1; i < sigmas.size(); ++i)
    if (!(sigmas[i] < sigmas[i - 1]))
      throw ConfigError(fmt::format("sigmas: [{}] are not strictly decreasing", fmt::join(sigmas, ", ")));
}

// The dtype the solver holds its tensors in: float64 stays, everything else (bf16 from a model
// under autocast, float16) is upcast to float32, as upstream does before each update.
at::ScalarType working_dtype(const at::Tensor& x) {
  return x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

}  // namespace

Solver parse_solver(const std::string& name, const std::string& option) {
  if (name == "euler") return Solver::euler;
  if (name == "dpm++") return Solver::dpmpp_2m;
  if (name == "unipc") return Solver::unipc;
  throw ConfigError(fmt::format("{}: '{}' is not one of euler, dpm++, unipc", option, name));
}

std::string solver_name(Solver solver) {
  switch (solver) {
    case Solver::euler:
      return "euler";
    case Solver::dpmpp_2m:
      return "dpm++";
    case Solver::unipc:
      return "unipc";
  }
  return "?";
}

std::vector<double> sampling_sigmas(int64_t steps, double shift, Solver solver) {
  std::vector<double> sigmas = shifted_grid(steps, shift, solver);
  sigmas.push_back(0);                                                      // final_sigmas_type "zero"
  for (double& s : sigmas) s = static_cast<double>(static_cast<float>(s));  // stored as float32
  return sigmas;
}

std::vector<int64_t> sampling_timesteps(int64_t steps, double shift, Solver solver) {
  const std::vector<double> sigmas = shifted_grid(steps, shift, solver);
  std::vector<int64_t> out;
  out.reserve(sigmas.size());
  for (double s : sigmas) out.push_back(static_cast<int64_t>(s * 1000));  // truncation, as .to(int64)
  return out;
}

FlowSolver::FlowSolver(Solver solver, std::vector<double> sigmas)
    : solver_(solver), sigmas_(std::move(sigmas)) {
  check_sigmas(sigmas_);
  for (double s : sigmas_) lambdas_.push_back(lambda_of(s));
}

FlowSolver::FlowSolver(Solver solver, int64_t steps, double shift)
    : FlowSolver(solver, sampling_sigmas(steps, shift, solver)) {}

at::Tensor FlowSolver::step(const at::Tensor& x_in, const at::Tensor& velocity, int64_t i) {
  if (i != next_ || i >= steps())
    throw ModelError(fmt::format("{} solver: step {} called, expected step {} of {}", solver_name(solver_), i,
                                 next_, steps()));
  if (x_in.sizes() != velocity.sizes())
    throw ModelError(fmt::format("{} solver: x [{}] and velocity [{}] differ in shape", solver_name(solver_),
                                 fmt::join(x_in.sizes(), ", "), fmt::join(velocity.sizes(), ", ")));
  const at::ScalarType dtype = working_dtype(x_in);
  const at::Tensor x = x_in.to(dtype), v = velocity.to(dtype);
  const size_t s = static_cast<size_t>(i);
  ++next_;
  if (solver_ == Solver::euler) return x + (sigmas_[s + 1] - sigmas_[s]) * v;

  const at::Tensor m = x - sigmas_[s] * v;  // the data prediction, E[x0 | x_i] for an exact model
  at::Tensor out;
  if (solver_ == Solver::dpmpp_2m) {
    out = dpmpp_2m_step(x, m, i);
  } else {
    // UniC: correct the previous predictor's result with the model's view of it (m), then UniP from
    // the corrected sample. The order of UniP warms up from 1 and falls back to 1 at the last step.
    const at::Tensor corrected = i > 0 ? unipc_correct(m, i) : x;
    const int order = static_cast<int>(std::min<int64_t>({2, i + 1, steps() - i}));
    out = unipc_predict(corrected, m, i, order);
    last_sample_ = corrected;
    last_order_ = order;
  }
  m_prev2_ = m_prev_;
  m_prev_ = m;
  return out;
}

// DPM-Solver++(2M), Lu et al. 2022 (arXiv:2211.01095), Algorithm 2, for alpha = 1 - sigma. The first-
// order step integrates the ODE exactly when the data prediction is constant over the step; the
// second-order term corrects for its slope in lambda, estimated from m_{i-1} (no extra model call).
at::Tensor FlowSolver::dpmpp_2m_step(const at::Tensor& x, const at::Tensor& m, int64_t i) const {
  const size_t s = static_cast<size_t>(i);
  const double sigma_s = sigmas_[s], sigma_t = sigmas_[s + 1], alpha_t = 1 - sigma_t;
  const double h = lambdas_[s + 1] - lambdas_[s];        // +inf into sigma = 0 or out of sigma = 1
  const double data_weight = -alpha_t * std::expm1(-h);  // alpha_t (1 - e^-h)
  at::Tensor out = (sigma_t / sigma_s) * x + data_weight * m;
  const bool first_order = i == 0 || i == steps() - 1;
  if (!first_order) {
    // r = h_{i-1} / h; from sigma_{i-1} = 1, r = inf and the slope term vanishes (0.5 / inf = 0).
    const double r = (lambdas_[s] - lambdas_[s - 1]) / h;
    out = out + (0.5 * data_weight / r) * (m - m_prev_);
  }
  return out;
}

// UniC-p of UniPC (Zhao et al. 2023, arXiv:2302.04867; bh2, B(h) = e^-h - 1, data prediction): x_i
// again from x_{i-1}, now also using m_i, the model's output at the predicted x_i. Order 1: the slope
// from m_{i-1} to m_i with rho = 1/2. Order 2: also the slope to m_{i-2}, rho from the 2x2 system
// R rho = b, R = [[1, 1], [r, 1]], b = [g1 / B, 2 g2 / B], g1 = phi1/hh - 1, g2 = g1/hh - 1/2.
at::Tensor FlowSolver::unipc_correct(const at::Tensor& m, int64_t i) const {
  const size_t s = static_cast<size_t>(i);  // corrects the step sigma_{i-1} -> sigma_i
  const double sigma_prev = sigmas_[s - 1], sigma_i = sigmas_[s], alpha_i = 1 - sigma_i;
  const double h = lambdas_[s] - lambdas_[s - 1], hh = -h;
  const double phi1 = std::expm1(hh), b_h = phi1;  // bh2: B(h) = e^{-h} - 1
  at::Tensor out = (sigma_i / sigma_prev) * last_sample_ - (alpha_i * phi1) * m_prev_;
  if (last_order_ == 1) return out - (alpha_i * b_h * 0.5) * (m - m_prev_);
  const double r = (lambdas_[s - 2] - lambdas_[s - 1]) / h;  // < 0: sigma_{i-2} lies on the noisy side
  const double g1 = phi1 / hh - 1, g2 = g1 / hh - 0.5;
  const double b0 = g1 / b_h, b1 = 2 * g2 / b_h;
  const double rho_history = (b0 - b1) / (1 - r), rho_new = b0 - rho_history;
  // D_1 = (m_{i-2} - m_{i-1}) / r; written with the coefficient of each m, r = -inf giving 0.
  const double history_weight = alpha_i * b_h * rho_history / r;
  return out - history_weight * (m_prev2_ - m_prev_) - (alpha_i * b_h * rho_new) * (m - m_prev_);
}

// UniP-p (bh2, data prediction): order 1 is DPM-Solver++'s first-order step; order 2 adds half the
// slope to m_{i-1} (rho = 1/2, upstream's simplification for order 2).
at::Tensor FlowSolver::unipc_predict(const at::Tensor& x, const at::Tensor& m, int64_t i, int order) const {
  const size_t s = static_cast<size_t>(i);
  const double sigma_s = sigmas_[s], sigma_t = sigmas_[s + 1], alpha_t = 1 - sigma_t;
  const double h = lambdas_[s + 1] - lambdas_[s], hh = -h;
  const double phi1 = std::expm1(hh), b_h = phi1;
  at::Tensor out = (sigma_t / sigma_s) * x - (alpha_t * phi1) * m;
  if (order == 1) return out;
  const double r = (lambdas_[s - 1] - lambdas_[s]) / h;  // D_1 = (m_{i-1} - m_i) / r
  return out - (alpha_t * b_h * 0.5 / r) * (m_prev_ - m);
}

at::Tensor guided(const at::Tensor& unconditional, const at::Tensor& conditional, double guidance) {
  if (unconditional.sizes() != conditional.sizes())
    throw ModelError(fmt::format("guided: unconditional [{}] and conditional [{}] differ in shape",
                                 fmt::join(unconditional.sizes(), ", "),
                                 fmt::join(conditional.sizes(), ", ")));
  return unconditional + guidance * (conditional - unconditional);
}

void check_sampling(const SamplingOptions& options) {
  if (options.steps < 1) throw ConfigError(fmt::format("--steps: {} is not >= 1", options.steps));
  if (!(options.shift > 0) || !std::isfinite(options.shift))
    throw ConfigError(fmt::format("--shift: {} is not a finite number > 0", options.shift));
}

at::Tensor sample(const std::function<at::Tensor(const at::Tensor& x, double timestep)>& velocity,
                  at::Tensor noise, const SamplingOptions& options) {
  check_sampling(options);
  at::NoGradGuard no_grad;
  FlowSolver solver(options.solver, options.steps, options.shift);
  const std::vector<int64_t> timesteps = sampling_timesteps(options.steps, options.shift, options.solver);
  at::Tensor x = noise.to(working_dtype(noise));
  for (int64_t i = 0; i < options.steps; ++i)
    x = solver.step(x, velocity(x, static_cast<double>(timesteps[static_cast<size_t>(i)])), i);
  return x;
}

}  // namespace loom::tasks::flow_matching
