#include "loom/tasks/flow_matching/schedule.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "loom/util/errors.h"

namespace loom::tasks::flow_matching {

namespace {

constexpr double kPi = 3.14159265358979323846;

// A uniform draw in the open interval (0, 1): cell k of 2^52 cells, taken at its centre. k + 0.5 fits
// the 53-bit mantissa exactly, so the extremes are 2^-53 and 1 - 2^-53, never 0 or 1.
double open_uniform(CounterRng& rng) { return (static_cast<double>(rng.next() >> 12) + 0.5) * 0x1.0p-52; }

// Held inside (0, 1): the smallest normal double and the largest double below 1.
double inside_unit_interval(double x) {
  return std::clamp(x, std::numeric_limits<double>::min(), 1.0 - 0x1.0p-53);
}

}  // namespace

double shift_sigma(double s, double shift) {
  if (!(shift > 0) || !std::isfinite(shift))
    throw ConfigError(fmt::format("shift: {} is not a finite number > 0", shift));
  // The operations in upstream's order (numpy, float64), so the sampling schedules match it bit for bit.
  return shift * s / (1 + (shift - 1) * s);
}

TimestepSampling::Kind parse_timestep_sampling(const std::string& name) {
  if (name == "uniform") return TimestepSampling::uniform;
  if (name == "logit_normal") return TimestepSampling::logit_normal;
  throw ConfigError(
      fmt::format("training.timestep_sampling: '{}' is not one of uniform, logit_normal", name));
}

void check_timestep_sampling(const TimestepSampling& sampling) {
  if (!(sampling.shift > 0) || !std::isfinite(sampling.shift))
    throw ConfigError(fmt::format("training.flow_shift: {} is not a finite number > 0", sampling.shift));
  if (sampling.kind != TimestepSampling::logit_normal) return;
  if (!std::isfinite(sampling.mean))
    throw ConfigError(fmt::format("training.logit_mean: {} is not finite", sampling.mean));
  if (!(sampling.std > 0) || !std::isfinite(sampling.std))
    throw ConfigError(fmt::format("training.logit_std: {} is not a finite number > 0", sampling.std));
}

double sample_sigma(const TimestepSampling& sampling, CounterRng& rng) {
  check_timestep_sampling(sampling);
  double s = 0;
  if (sampling.kind == TimestepSampling::uniform) {
    s = open_uniform(rng);
  } else {
    const double u1 = open_uniform(rng), u2 = open_uniform(rng);
    const double n = std::sqrt(-2 * std::log(u1)) * std::cos(2 * kPi * u2);  // Box-Muller, N(0, 1)
    s = 1 / (1 + std::exp(-(sampling.mean + sampling.std * n)));             // sigmoid
  }
  return inside_unit_interval(shift_sigma(inside_unit_interval(s), sampling.shift));
}

at::Tensor noised(const at::Tensor& x0, const at::Tensor& eps, const at::Tensor& sigma) {
  if (x0.sizes() != eps.sizes())
    throw ModelError(fmt::format("noised: x0 [{}] and eps [{}] differ in shape", fmt::join(x0.sizes(), ", "),
                                 fmt::join(eps.sizes(), ", ")));
  if (x0.dim() < 1 || sigma.dim() != 1 || sigma.size(0) != x0.size(0))
    throw ModelError(fmt::format("noised: sigma [{}] is not [B] for x0 [{}]", fmt::join(sigma.sizes(), ", "),
                                 fmt::join(x0.sizes(), ", ")));
  std::vector<int64_t> per_sample(static_cast<size_t>(x0.dim()), 1);  // [B, 1, ..., 1]
  per_sample[0] = x0.size(0);
  const at::Tensor s = sigma.to(x0.scalar_type()).view(per_sample);
  return (1 - s) * x0 + s * eps;
}

at::Tensor velocity_target(const at::Tensor& x0, const at::Tensor& eps) { return eps - x0; }

double timestep_of(double sigma) { return 1000 * sigma; }

}  // namespace loom::tasks::flow_matching
