// Wan2.1's flow matching: the shift's closed forms and training draws inside (0, 1); the sampling
// schedules and DiT timesteps against upstream's formula evaluated in Python; every solver exact on
// straight paths; convergence orders on a Gaussian's curved flow; DPM-Solver++(2M) and UniPC
// trajectories against an independent float64 implementation (itself checked against Wan's own
// scheduler classes); guidance; errors that name the option.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "loom/tasks/flow_matching/sampler.h"
#include "loom/tasks/flow_matching/schedule.h"
#include "loom/util/errors.h"
#include "loom/util/random.h"

namespace loom::tasks::flow_matching {
namespace {

constexpr Solver kSolvers[] = {Solver::euler, Solver::dpmpp_2m, Solver::unipc};

double max_abs(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

// The message of the ConfigError fn throws ("" if none).
template <typename Fn>
std::string config_error(Fn fn) {
  try {
    fn();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

// ---- schedule.h ----------------------------------------------------------------------------------

TEST(FlowSchedule, ShiftSigmaClosedForms) {
  for (double s : {0.0, 0.1, 0.25, 0.5, 0.9, 1.0}) EXPECT_EQ(shift_sigma(s, 1.0), s);
  for (double shift : {0.5, 1.0, 3.0, 5.0, 8.0}) {
    EXPECT_EQ(shift_sigma(0.0, shift), 0.0);
    EXPECT_EQ(shift_sigma(1.0, shift), 1.0);
    double previous = 0;
    for (int k = 1; k <= 100; ++k) {
      const double s = k / 100.0, shifted = shift_sigma(s, shift);
      EXPECT_GT(shifted, previous) << "shift " << shift << " s " << s;  // strictly increasing
      // shift > 1 moves every level towards noise; the shift 1/k undoes the shift k.
      if (shift > 1 && k < 100) {
        EXPECT_GT(shifted, s);
      }
      EXPECT_NEAR(shift_sigma(shifted, 1 / shift), s, 1e-14);
      previous = shifted;
    }
  }
  EXPECT_DOUBLE_EQ(shift_sigma(0.5, 5.0), 5.0 / 6.0);  // 2.5 / 3
  EXPECT_DOUBLE_EQ(shift_sigma(0.2, 3.0), 0.6 / 1.4);
  EXPECT_NE(config_error([] { shift_sigma(0.5, 0.0); }).find("shift"), std::string::npos);
  EXPECT_NE(config_error([] { shift_sigma(0.5, -1.0); }), "");
}

TEST(FlowSchedule, SampledSigmasLieInsideTheUnitInterval) {
  constexpr int kDraws = 20000;
  TimestepSampling uniform;  // shift 1: s itself, uniform on (0, 1)
  TimestepSampling logit;
  logit.kind = TimestepSampling::logit_normal;  // mean 0, std 1: sigmoid(N(0, 1))
  double uniform_sum = 0;
  int logit_below_half = 0, logit_below_sigmoid_1 = 0;
  for (int i = 0; i < kDraws; ++i) {
    CounterRng a(11, 1, static_cast<uint64_t>(i)), b(11, 2, static_cast<uint64_t>(i));
    const double u = sample_sigma(uniform, a), l = sample_sigma(logit, b);
    ASSERT_TRUE(u > 0 && u < 1 && l > 0 && l < 1);
    uniform_sum += u;
    logit_below_half += l < 0.5;
    logit_below_sigmoid_1 += l < 1 / (1 + std::exp(-1.0));  // P(n < 1) = 0.8413
  }
  EXPECT_NEAR(uniform_sum / kDraws, 0.5, 0.01);
  EXPECT_NEAR(static_cast<double>(logit_below_half) / kDraws, 0.5, 0.015);
  EXPECT_NEAR(static_cast<double>(logit_below_sigmoid_1) / kDraws, 0.8413, 0.015);

  // The shift applies after the draw: the median of the shifted uniform is shift_sigma(0.5).
  TimestepSampling shifted;
  shifted.shift = 5;
  int below = 0;
  for (int i = 0; i < kDraws; ++i) {
    CounterRng rng(3, 0, static_cast<uint64_t>(i));
    below += sample_sigma(shifted, rng) < shift_sigma(0.5, 5);
  }
  EXPECT_NEAR(static_cast<double>(below) / kDraws, 0.5, 0.015);

  // The same (seed, stream, index) draws the same sigma; a sigmoid that would round to 0 or 1 is held
  // inside, shifted or not.
  CounterRng first(5, 9, 42), again(5, 9, 42);
  EXPECT_EQ(sample_sigma(logit, first), sample_sigma(logit, again));
  for (double mean : {-1000.0, 1000.0}) {
    TimestepSampling extreme = logit;
    extreme.mean = mean;
    for (double shift : {1.0, 5.0, 1e-3}) {
      extreme.shift = shift;
      CounterRng rng(1, 1, 1);
      const double sigma = sample_sigma(extreme, rng);
      EXPECT_TRUE(sigma > 0 && sigma < 1) << "mean " << mean << " shift " << shift << ": " << sigma;
    }
  }
  TimestepSampling bad = logit;
  bad.std = 0;
  CounterRng rng(1, 1, 1);
  EXPECT_NE(config_error([&] { sample_sigma(bad, rng); }).find("training.logit_std"), std::string::npos);
  bad = uniform;
  bad.shift = -2;
  EXPECT_NE(config_error([&] { sample_sigma(bad, rng); }).find("training.flow_shift"), std::string::npos);
  EXPECT_EQ(parse_timestep_sampling("logit_normal"), TimestepSampling::logit_normal);
  EXPECT_NE(config_error([] { parse_timestep_sampling("cosine"); }).find("uniform, logit_normal"),
            std::string::npos);
}

TEST(FlowSchedule, NoisedSamplesAndTheirTarget) {
  // x0, eps [B=3, 2, 2]; sigma [3] = 0 (data), 0.25, 1 (noise).
  const at::Tensor x0 = at::arange(12, at::kFloat).view({3, 2, 2});
  const at::Tensor eps = -at::ones({3, 2, 2}, at::kFloat);
  const at::Tensor sigma = at::tensor({0.0, 0.25, 1.0}, at::kDouble);
  const at::Tensor x = noised(x0, eps, sigma);
  ASSERT_EQ(x.scalar_type(), at::kFloat);
  EXPECT_TRUE(at::equal(x[0], x0[0]));
  EXPECT_TRUE(at::equal(x[2], eps[2]));
  EXPECT_TRUE(at::allclose(x[1], 0.75 * x0[1] - 0.25));
  // The target is the path's derivative in sigma, constant along it.
  const at::Tensor v = velocity_target(x0, eps);
  EXPECT_TRUE(at::allclose(noised(x0, eps, sigma + 0.5) - noised(x0, eps, sigma), 0.5 * v));
  EXPECT_EQ(timestep_of(0.25), 250.0);
  EXPECT_EQ(timestep_of(1.0), 1000.0);
  EXPECT_THROW(noised(x0, eps, at::zeros({2})), ModelError);
  EXPECT_THROW(noised(x0, eps.view({3, 4}), sigma), ModelError);
}

// ---- sampler.h: schedules ------------------------------------------------------------------------

// Upstream's sigmas (float32) and DiT timesteps for shift 5, from Wan's formula
// (wan/utils/fm_solvers.py get_sampling_sigmas + set_timesteps for dpm++; fm_solvers_unipc.py
// __init__ + set_timesteps for unipc), evaluated with /usr/bin/python3 (numpy 1.24):
//
//   import numpy as np
//   def wan(steps, shift, unipc):
//       start = float(np.float32(1 - 1 / 1000)) if unipc else 1.0  # unipc: sigma_max of the 1000-step table
//       s = np.linspace(start, 0, steps + 1)[:steps]
//       s = shift * s / (1 + (shift - 1) * s)
//       return np.append(s, 0).astype(np.float32), (s * 1000).astype(np.int64)
//   # printed with np.format_float_positional(v, unique=True) (shortest float32 round trip)
//
// The same values came out of Wan's FlowDPMSolverMultistepScheduler and FlowUniPCMultistepScheduler
// themselves (at commit 9737cba, imported with a stub of the few diffusers names they use, which only
// stores the config) for steps 1, 2, 10, 25, 50 and shift 1, 3, 5, 8, bit for bit.
const std::vector<float> kDpmSigmas10 = {1.f,         0.9782609f,  0.95238096f, 0.92105263f,
                                         0.88235295f, 0.8333333f,  0.7692308f,  0.6818182f,
                                         0.5555556f,  0.35714287f, 0.f};
const std::vector<int64_t> kDpmTimesteps10 = {1000, 978, 952, 921, 882, 833, 769, 681, 555, 357};
const std::vector<float> kDpmSigmas25 = {
    1.f,         0.9917355f, 0.982906f,   0.9734513f,  0.96330273f, 0.95238096f, 0.9405941f,
    0.92783505f, 0.9139785f, 0.8988764f,  0.88235295f, 0.86419755f, 0.84415585f, 0.82191783f,
    0.79710144f, 0.7692308f, 0.73770493f, 0.7017544f,  0.6603774f,  0.6122449f,  0.5555556f,
    0.4878049f,  0.4054054f, 0.3030303f,  0.1724138f,  0.f};
const std::vector<int64_t> kDpmTimesteps25 = {1000, 991, 982, 973, 963, 952, 940, 927, 913,
                                              898,  882, 864, 844, 821, 797, 769, 737, 701,
                                              660,  612, 555, 487, 405, 303, 172};
const std::vector<float> kDpmSigmas50 = {
    1.f,         0.99593496f, 0.9917355f,  0.9873949f,  0.982906f,   0.9782609f,  0.9734513f,  0.9684685f,
    0.96330273f, 0.9579439f,  0.95238096f, 0.9466019f,  0.9405941f,  0.93434346f, 0.92783505f, 0.92105263f,
    0.9139785f,  0.9065934f,  0.8988764f,  0.8908046f,  0.88235295f, 0.87349397f, 0.86419755f, 0.8544304f,
    0.84415585f, 0.8333333f,  0.82191783f, 0.80985916f, 0.79710144f, 0.7835821f,  0.7692308f,  0.75396824f,
    0.73770493f, 0.720339f,   0.7017544f,  0.6818182f,  0.6603774f,  0.6372549f,  0.6122449f,  0.5851064f,
    0.5555556f,  0.5232558f,  0.4878049f,  0.44871795f, 0.4054054f,  0.35714287f, 0.3030303f,  0.24193548f,
    0.1724138f,  0.09259259f, 0.f};
const std::vector<int64_t> kDpmTimesteps50 = {
    1000, 995, 991, 987, 982, 978, 973, 968, 963, 957, 952, 946, 940, 934, 927, 921, 913,
    906,  898, 890, 882, 873, 864, 854, 844, 833, 821, 809, 797, 783, 769, 753, 737, 720,
    701,  681, 660, 637, 612, 585, 555, 523, 487, 448, 405, 357, 303, 241, 172, 92};
const std::vector<float> kUniPCSigmas10 = {0.99979985f, 0.978048f,  0.95215404f, 0.9208101f,
                                           0.88209325f, 0.8330554f, 0.7689347f,  0.6815081f,
                                           0.5552468f,  0.3568877f, 0.f};
const std::vector<int64_t> kUniPCTimesteps10 = {999, 978, 952, 920, 882, 833, 768, 681, 555, 356};
const std::vector<float> kUniPCSigmas25 = {
    0.99979985f, 0.9915305f,  0.9826958f, 0.9732358f,  0.96308166f, 0.95215404f, 0.9403611f,
    0.92759573f, 0.91373265f, 0.8986237f, 0.88209325f, 0.86393064f, 0.8438816f,  0.82163614f,
    0.7968125f,  0.7689347f,  0.7374024f, 0.7014464f,  0.6600657f,  0.6119324f,  0.5552468f,
    0.4875073f,  0.4051314f,  0.3028007f, 0.17226514f, 0.f};
const std::vector<int64_t> kUniPCTimesteps25 = {999, 991, 982, 973, 963, 952, 940, 927, 913,
                                                898, 882, 863, 843, 821, 796, 768, 737, 701,
                                                660, 611, 555, 487, 405, 302, 172};
const std::vector<float> kUniPCSigmas50 = {
    0.99979985f, 0.99573237f,  0.9915305f,  0.9871874f,  0.9826958f,  0.978048f,   0.9732358f,  0.96825016f,
    0.96308166f, 0.9577199f,   0.95215404f, 0.94637203f, 0.9403611f,  0.9341073f,  0.92759573f, 0.9208101f,
    0.91373265f, 0.9063442f,   0.8986237f,  0.89054847f, 0.88209325f, 0.8732307f,  0.86393064f, 0.85415983f,
    0.8438816f,  0.8330554f,   0.82163614f, 0.8095738f,  0.7968125f,  0.78328955f, 0.7689347f,  0.7536689f,
    0.7374024f,  0.7200336f,   0.7014464f,  0.6815081f,  0.6600657f,  0.6369424f,  0.6119324f,  0.584795f,
    0.5552468f,  0.5229515f,   0.4875073f,  0.4484302f,  0.4051314f,  0.3568877f,  0.3028007f,  0.24174035f,
    0.17226514f, 0.092506856f, 0.f};
const std::vector<int64_t> kUniPCTimesteps50 = {
    999, 995, 991, 987, 982, 978, 973, 968, 963, 957, 952, 946, 940, 934, 927, 920, 913,
    906, 898, 890, 882, 873, 863, 854, 843, 833, 821, 809, 796, 783, 768, 753, 737, 720,
    701, 681, 660, 636, 611, 584, 555, 522, 487, 448, 405, 356, 302, 241, 172, 92};

void expect_schedule(Solver solver, int64_t steps, const std::vector<float>& sigmas,
                     const std::vector<int64_t>& timesteps) {
  SCOPED_TRACE(solver_name(solver) + " " + std::to_string(steps) + " steps");
  const std::vector<double> got = sampling_sigmas(steps, 5.0, solver);
  ASSERT_EQ(got.size(), static_cast<size_t>(steps + 1));
  ASSERT_EQ(sigmas.size(), got.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], static_cast<double>(sigmas[i])) << "sigma " << i;
  EXPECT_EQ(sampling_timesteps(steps, 5.0, solver), timesteps);
}

TEST(FlowSampler, SchedulesAreWans) {
  // Each path: sigma_0, a final 0, steps + 1 values, strictly decreasing; the DiT's timesteps are
  // 1000 sigma of the steps (the final 0 has no model call), truncated from the float64 sigma, so
  // one below the float32 sigma's 1000 sigma where that rounded up to a whole number (see below).
  for (Solver solver : kSolvers)
    for (int64_t steps : {1, 2, 10, 25, 50})
      for (double shift : {1.0, 5.0, 8.0}) {
        const std::vector<double> sigmas = sampling_sigmas(steps, shift, solver);
        const std::vector<int64_t> timesteps = sampling_timesteps(steps, shift, solver);
        ASSERT_EQ(sigmas.size(), static_cast<size_t>(steps + 1));
        ASSERT_EQ(timesteps.size(), static_cast<size_t>(steps));
        EXPECT_EQ(sigmas.back(), 0.0);
        for (size_t i = 1; i < sigmas.size(); ++i) EXPECT_LT(sigmas[i], sigmas[i - 1]);
        for (size_t i = 0; i < timesteps.size(); ++i)
          EXPECT_NEAR(timesteps[i] + 0.5, 1000 * sigmas[i], 0.5001);
        if (solver == Solver::unipc) {
          const double sigma_max = static_cast<float>(0.999);  // 0.99900001287...
          EXPECT_EQ(sigmas.front(), static_cast<double>(static_cast<float>(shift_sigma(sigma_max, shift))));
          EXPECT_LT(sigmas.front(), 1.0);
        } else {
          EXPECT_EQ(sigmas.front(), 1.0);
          EXPECT_EQ(timesteps.front(), 1000);
        }
      }
  // Euler shares the dpm++ schedule.
  EXPECT_EQ(sampling_sigmas(25, 5.0, Solver::euler), sampling_sigmas(25, 5.0, Solver::dpmpp_2m));
  // Upstream's truncation quirk, kept: with shift 1, linspace's 1 - 6 * 0.1 = 0.3999999999999999
  // gives timestep 399 (float32 sigma 0.40000001), and so on down (the same script, shift 1).
  EXPECT_EQ(sampling_timesteps(10, 1.0, Solver::dpmpp_2m),
            (std::vector<int64_t>{1000, 900, 800, 700, 600, 500, 399, 299, 199, 99}));
  EXPECT_EQ(sampling_sigmas(10, 1.0, Solver::dpmpp_2m)[6], static_cast<double>(0.4f));
  expect_schedule(Solver::dpmpp_2m, 10, kDpmSigmas10, kDpmTimesteps10);
  expect_schedule(Solver::dpmpp_2m, 25, kDpmSigmas25, kDpmTimesteps25);
  expect_schedule(Solver::dpmpp_2m, 50, kDpmSigmas50, kDpmTimesteps50);
  expect_schedule(Solver::unipc, 10, kUniPCSigmas10, kUniPCTimesteps10);
  expect_schedule(Solver::unipc, 25, kUniPCSigmas25, kUniPCTimesteps25);
  expect_schedule(Solver::unipc, 50, kUniPCSigmas50, kUniPCTimesteps50);
}

// ---- sampler.h: solvers --------------------------------------------------------------------------

// Every solver on the straight path through x0: the exact velocity there is (x - x0) / sigma (the
// data prediction x - sigma v is x0 at every step), which Euler follows exactly along a line and the
// exponential integrators exactly (their first-order step is exact for a constant data prediction,
// and the multistep differences vanish). Each run must land on x0 whatever the schedule.
TEST(FlowSampler, EverySolverIsExactOnStraightPaths) {
  const at::Tensor x0 = at::tensor({-1.25, 0.5, 2.0, 0.0, -0.3, 1.7}, at::kFloat).view({2, 3});   // [2, 3]
  const at::Tensor eps = at::tensor({0.4, -1.1, 0.9, 2.2, -0.6, 0.05}, at::kFloat).view({2, 3});  // [2, 3]
  for (Solver solver : kSolvers)
    for (Solver schedule : kSolvers)  // also UniPC from sigma_0 = 1 (lambda = -inf) on dpm++'s schedule
      for (int64_t steps : {1, 2, 3, 7, 10, 25, 50})
        for (double shift : {1.0, 5.0}) {
          FlowSolver flow(solver, sampling_sigmas(steps, shift, schedule));
          const double sigma_0 = flow.sigmas().front();
          at::Tensor x = (1 - sigma_0) * x0 + sigma_0 * eps;
          for (int64_t i = 0; i < steps; ++i) {
            const double sigma = flow.sigmas()[static_cast<size_t>(i)];
            x = flow.step(x, (x - x0) / sigma, i);
            ASSERT_TRUE(x.isfinite().all().item<bool>());
          }
          EXPECT_EQ(x.scalar_type(), at::kFloat);
          EXPECT_LT(max_abs(x, x0), 1e-5) << solver_name(solver) << " on the " << solver_name(schedule)
                                          << " schedule, " << steps << " steps, shift " << shift;
        }
}

// sample() runs the loop: the model sees the DiT timesteps of the schedule in order, and a model
// whose velocity is constant (the straight line through the noise) ends at noise - sigma_0 v on every
// solver: x0 where sigma_0 = 1 (dpm++, euler), and 1 - sigma_0 short of it for unipc.
TEST(FlowSampler, SampleRunsTheWholeLoop) {
  const at::Tensor x0 = at::tensor({0.5, -2.0, 1.0, 0.25}, at::kFloat).view({1, 4});  // [1, 4]
  const at::Tensor noise = at::tensor({1.0, 0.3, -0.7, -1.9}, at::kFloat).view({1, 4});
  for (Solver solver : kSolvers) {
    SamplingOptions options;
    options.steps = 12;
    options.solver = solver;
    std::vector<int64_t> seen;
    const at::Tensor out = sample(
        [&](const at::Tensor& x, double timestep) {
          EXPECT_EQ(x.sizes(), noise.sizes());
          seen.push_back(static_cast<int64_t>(timestep));
          EXPECT_EQ(static_cast<double>(seen.back()), timestep);  // whole numbers, as upstream's int64
          return noise - x0;
        },
        noise, options);
    EXPECT_EQ(seen, sampling_timesteps(12, 5.0, solver)) << solver_name(solver);
    const double sigma_0 = sampling_sigmas(12, 5.0, solver).front();
    EXPECT_LT(max_abs(out, noise - sigma_0 * (noise - x0)), 1e-5) << solver_name(solver);
    if (solver != Solver::unipc) {
      EXPECT_LT(max_abs(out, x0), 1e-5) << solver_name(solver);
    }
  }
}

// A curved flow with a known solution: data x0 ~ N(mean, sd^2) per element, eps ~ N(0, 1). Then
// x_sigma = a x0 + sigma eps (a = 1 - sigma) is N(a mean, V), V = a^2 sd^2 + sigma^2, and the exact
// flow-matching velocity E[eps - x0 | x_sigma = x] is ((sigma - a sd^2) / V) (x - a mean) - mean.
// Its ODE carries each quantile z along: x(sigma) = a mean + sqrt(V) z, so from x at sigma_0 the
// exact end is mean + sd (x - a_0 mean) / sqrt(V_0).
struct GaussianFlow {
  double mean, sd;
  at::Tensor velocity(const at::Tensor& x, double sigma) const {
    const double a = 1 - sigma, variance = a * a * sd * sd + sigma * sigma;
    return ((sigma - a * sd * sd) / variance) * (x - a * mean) - mean;
  }
  at::Tensor end(const at::Tensor& x, double sigma_0) const {
    const double a = 1 - sigma_0;
    return mean + sd * (x - a * mean) / std::sqrt(a * a * sd * sd + sigma_0 * sigma_0);
  }
};

// The largest error at sigma = 0 over a few starting points (float64 tensors, so that rounding stays
// far below the discretisation error).
double final_error(Solver solver, int64_t steps, double shift, const GaussianFlow& flow) {
  FlowSolver solve(solver, steps, shift);
  const at::Tensor start = at::tensor({-2.0, -0.7, 0.3, 1.5}, at::kDouble);  // [4]
  at::Tensor x = start;
  for (int64_t i = 0; i < steps; ++i)
    x = solve.step(x, flow.velocity(x, solve.sigmas()[static_cast<size_t>(i)]), i);
  return max_abs(x, flow.end(start, solve.sigmas().front()));
}

// Error ratios when the step count doubles: ~2 for a first-order solver, ~4 for second order (the
// multistep ratios near 4 only slowly: at both ends of the schedule lambda runs off to -inf or +inf
// and the steps there do not shrink in lambda as the count grows). With shift 1 the asymptotic regime
// starts by 10 steps. Shift 5 (Wan's) spends 5x fewer steps on the low-noise end where this flow
// bends, so it starts later there: 10 -> 20 -> 40 steps give dpm++ ratios 7.5 and 0.9, 80 -> 160 ->
// 320 give 3.1 and 3.3, and the check uses 160 -> 320 -> 640.
TEST(FlowSampler, ConvergenceOrdersOnACurvedFlow) {
  const GaussianFlow flow{0.5, 1.5};
  struct Case {
    double shift;
    std::vector<int64_t> steps;
  };
  for (const Case& c : {Case{1.0, {10, 20, 40}}, Case{5.0, {160, 320, 640}}}) {
    std::printf("Gaussian flow (mean 0.5, sd 1.5), shift %g: max error at sigma = 0\n", c.shift);
    std::printf("  solver   %10lld %10lld %10lld   ratios\n", static_cast<long long>(c.steps[0]),
                static_cast<long long>(c.steps[1]), static_cast<long long>(c.steps[2]));
    for (Solver solver : kSolvers) {
      std::vector<double> errors;
      for (int64_t steps : c.steps) errors.push_back(final_error(solver, steps, c.shift, flow));
      const double r1 = errors[0] / errors[1], r2 = errors[1] / errors[2];
      std::printf("  %-6s   %10.3e %10.3e %10.3e   %.2f %.2f\n", solver_name(solver).c_str(), errors[0],
                  errors[1], errors[2], r1, r2);
      const double least = solver == Solver::euler ? 1.6 : 3.0;
      EXPECT_GT(r1, least) << solver_name(solver) << " shift " << c.shift;
      EXPECT_GT(r2, least) << solver_name(solver) << " shift " << c.shift;
      if (solver == Solver::euler) {
        EXPECT_LT(r2, 2.5);  // and no better than first order
      }
    }
  }
}

// DPM-Solver++(2M) and UniPC over 10 steps of shift 5 on their own schedules, for the nonlinear
// field v(x, sigma) = x cos(3 sigma) - sin(x) / 2 + sigma from x = (-1.5, -0.3, 0.2, 1.1): the sample
// after each step. Wan's scheduler classes compute in float32 and import diffusers (not installed
// here), so the expected numbers come from this standalone float64 implementation, written from the formulas
// of Lu et al. 2022 (arXiv:2211.01095, DPM-Solver++(2M)) and Zhao et al. 2023 (arXiv:2302.04867, UniPC bh2)
// and the order rules stated in sampler.h, run with /usr/bin/python3:
//
//   import math, numpy as np
//   def sigmas(steps, shift, unipc):  # as in the schedule test above
//       start = float(np.float32(1 - 1 / 1000)) if unipc else 1.0
//       s = np.linspace(start, 0, steps + 1)[:steps]
//       return np.append(shift * s / (1 + (shift - 1) * s), 0).astype(np.float32).astype(np.float64)
//   def lam(s):  # log(alpha / sigma), alpha = 1 - sigma
//       return (math.log(1 - s) if s < 1 else -math.inf) - (math.log(s) if s > 0 else -math.inf)
//   def solve(unipc, sig, x, vel):
//       n, ms, out = len(sig) - 1, [], []
//       for i in range(n):
//           s, t = sig[i], sig[i + 1]
//           m = x - s * vel(x, s)  # data prediction
//           if not unipc:  # DPM-Solver++(2M): first order at the first and last step
//               h = lam(t) - lam(s)
//               x = (t / s) * x - (1 - t) * math.expm1(-h) * m
//               if 0 < i < n - 1:
//                   x = x - 0.5 * (1 - t) * math.expm1(-h) * (m - ms[-1]) * h / (lam(s) - lam(sig[i - 1]))
//           else:  # UniPC bh2: corrector (UniC, order of the last predictor), then predictor (UniP)
//               if i > 0:
//                   h = lam(s) - lam(sig[i - 1]); p1 = math.expm1(-h)
//                   if order == 1:
//                       rd, rt, D = 0.0, 0.5, 0
//                   else:
//                       r = (lam(sig[i - 2]) - lam(sig[i - 1])) / h
//                       g1 = p1 / -h - 1; g2 = g1 / -h - 0.5
//                       rd = (g1 / p1 - 2 * g2 / p1) / (1 - r); rt = g1 / p1 - rd
//                       D = (ms[-2] - ms[-1]) / r
//                   x = (s / sig[i - 1]) * last - (1 - s) * p1 * (ms[-1] + rd * D + rt * (m - ms[-1]))
//               order = 1 if i == 0 or i == n - 1 else 2
//               h = lam(t) - lam(s); p1 = math.expm1(-h); last = x
//               x = (t / s) * x - (1 - t) * p1 * m
//               if order == 2:
//                   x = x - (1 - t) * p1 * 0.5 * (ms[-1] - m) * h / (lam(sig[i - 1]) - lam(s))
//           ms.append(m); out.append(x)
//       return out
//   vel = lambda x, s: x * np.cos(3 * s) - 0.5 * np.sin(x) + s
//   for unipc in [False, True]:
//       for x in solve(unipc, sigmas(10, 5.0, unipc), np.array([-1.5, -0.3, 0.2, 1.1]), vel):
//           print(', '.join('%.17g' % v for v in x))
//
// As a check of that implementation (not of Loom's): Wan's FlowDPMSolverMultistepScheduler and
// FlowUniPCMultistepScheduler (commit 9737cba, imported with a stub of the few diffusers names they
// use, which only stores the config; their arithmetic runs in float32) give the same trajectories
// within 3.9e-7 (dpm++) and 2.4e-7 (unipc) at 10 steps, 5.3e-7 and 8.7e-7 at 20 steps.
const std::vector<std::vector<double>> kDpmTrajectory = {
    {-1.5648638158005335, -0.33140777190986281, 0.1847246376575315, 1.111621636931168},
    {-1.6427564233010055, -0.36932946040623793, 0.16646287052668104, 1.1260595890568172},
    {-1.7378013305695346, -0.41615587600512544, 0.1441843467453553, 1.1444515775066446},
    {-1.8550410627961074, -0.47494921770971971, 0.11641779506112865, 1.167868403667162},
    {-2.001097673068652, -0.550342580724278, 0.080884957812539515, 1.1977370648945003},
    {-2.1830452716372526, -0.64901759530382008, 0.034001074718244442, 1.2352425981272861},
    {-2.4023847320686595, -0.77947121457784574, -0.029828844683271984, 1.2789988480509802},
    {-2.627571139193007, -0.94567337856300959, -0.11806438231552635, 1.3152026945885},
    {-2.6664124667353026, -1.1013785512818193, -0.22920136398993596, 1.2738371786329796},
    {-2.4196359386205919, -1.1998217666318798, -0.35812458133679581, 1.0991833694813062},
};
const std::vector<std::vector<double>> kUniPCTrajectory = {
    {-1.5648945724246632, -0.3314212064553822, 0.18471970101541185, 1.1116307459599977},
    {-1.6431459133625241, -0.36961534137054908, 0.16641537945218088, 1.1263708813453692},
    {-1.7384320547143457, -0.41673394020259086, 0.14407883499858265, 1.1450412742891141},
    {-1.8555802125579712, -0.47570896515960709, 0.11625817914097428, 1.1685634865152843},
    {-2.0010766927641432, -0.55118752725488307, 0.080671742731309337, 1.198368826488446},
    {-2.1814780244348215, -0.64971197119008128, 0.033759829520143114, 1.2354771917087009},
    {-2.3970485579962277, -0.77930729441684887, -0.02995976571476025, 1.278052204753491},
    {-2.6138695260253986, -0.9426236442327679, -0.11754007759224033, 1.3113291333046138},
    {-2.6394726492111222, -1.0910134472020423, -0.22637074640889773, 1.2645813004103503},
    {-2.400997066244777, -1.1899598517495189, -0.35504820774690138, 1.0909313705235661},
};

TEST(FlowSampler, TrajectoriesMatchAnIndependentImplementation) {
  const auto field = [](const at::Tensor& x, double sigma) {
    return x * std::cos(3 * sigma) - 0.5 * at::sin(x) + sigma;
  };
  for (Solver solver : {Solver::dpmpp_2m, Solver::unipc}) {
    const auto& expected = solver == Solver::unipc ? kUniPCTrajectory : kDpmTrajectory;
    // float64 tensors: the same formulas, so agreement to rounding; float32 (production): to 2e-6.
    for (at::ScalarType dtype : {at::kDouble, at::kFloat}) {
      FlowSolver flow(solver, 10, 5.0);
      at::Tensor x = at::tensor({-1.5, -0.3, 0.2, 1.1}, at::kDouble).to(dtype);  // [4]
      for (int64_t i = 0; i < 10; ++i) {
        x = flow.step(x, field(x, flow.sigmas()[static_cast<size_t>(i)]), i);
        ASSERT_EQ(x.scalar_type(), dtype);
        const at::Tensor want = at::tensor(expected[static_cast<size_t>(i)], at::kDouble);
        EXPECT_LT(max_abs(x.to(at::kDouble), want), dtype == at::kDouble ? 1e-12 : 2e-6)
            << solver_name(solver) << " step " << i << (dtype == at::kDouble ? " float64" : " float32");
      }
    }
  }
}

TEST(FlowSampler, SolverStepsComeInOrder) {
  FlowSolver flow(Solver::unipc, 4, 5.0);
  const at::Tensor x = at::zeros({2, 2});
  EXPECT_THROW(flow.step(x, x, 1), ModelError);  // step 0 first
  flow.step(x, x, 0);
  EXPECT_THROW(flow.step(x, x, 0), ModelError);
  EXPECT_THROW(flow.step(x, at::zeros({4}), 1), ModelError);
  // A schedule that does not end at 0, rises, or starts above 1 is refused.
  EXPECT_NE(config_error([] { FlowSolver(Solver::euler, {1.0, 0.5}); }).find("sigmas"), std::string::npos);
  EXPECT_NE(config_error([] { FlowSolver(Solver::euler, {0.5, 0.7, 0.0}); }), "");
  EXPECT_NE(config_error([] { FlowSolver(Solver::euler, {1.5, 0.0}); }), "");
  EXPECT_NE(config_error([] { FlowSolver(Solver::euler, {0.0}); }), "");
}

// ---- guidance, options ---------------------------------------------------------------------------

TEST(FlowSampler, GuidanceCombinesTheTwoVelocities) {
  const at::Tensor u = at::randn({2, 3, 4}), c = at::randn({2, 3, 4});  // [2, 3, 4]
  EXPECT_TRUE(at::equal(guided(u, c, 0.0), u));
  EXPECT_TRUE(at::allclose(guided(u, c, 1.0), c, 0, 1e-6));
  EXPECT_TRUE(at::allclose(guided(u, c, 5.0), 5 * c - 4 * u, 1e-5, 1e-5));
  // Exactly representable values: 1 + 1 * (3 - 1) is 3 to the bit.
  const at::Tensor one = at::ones({3}), three = at::full({3}, 3.0);
  EXPECT_TRUE(at::equal(guided(one, three, 1.0), three));
  EXPECT_TRUE(at::equal(guided(one, three, 5.0), at::full({3}, 11.0)));
  EXPECT_THROW(guided(u, c.view({6, 4}), 5.0), ModelError);
}

TEST(FlowSampler, BadOptionsAreNamed) {
  EXPECT_EQ(parse_solver("euler"), Solver::euler);
  EXPECT_EQ(parse_solver("dpm++"), Solver::dpmpp_2m);
  EXPECT_EQ(parse_solver("unipc"), Solver::unipc);
  for (Solver solver : kSolvers) EXPECT_EQ(parse_solver(solver_name(solver)), solver);
  const std::string unknown = config_error([] { parse_solver("ddim"); });
  EXPECT_NE(unknown.find("--solver"), std::string::npos) << unknown;
  EXPECT_NE(unknown.find("'ddim'"), std::string::npos) << unknown;
  EXPECT_NE(unknown.find("euler, dpm++, unipc"), std::string::npos) << unknown;
  EXPECT_NE(config_error([] { parse_solver("dpmpp", "sample_solver"); }).find("sample_solver"),
            std::string::npos);

  SamplingOptions options;  // Wan's defaults
  EXPECT_EQ(options.steps, 50);
  EXPECT_EQ(options.shift, 5.0);
  EXPECT_EQ(options.solver, Solver::unipc);
  options.steps = 0;
  EXPECT_NE(config_error([&] { check_sampling(options); }).find("--steps"), std::string::npos);
  options.steps = 10;
  options.shift = 0;
  EXPECT_NE(config_error([&] { check_sampling(options); }).find("--shift"), std::string::npos);
  const auto zero = [](const at::Tensor& x, double) { return at::zeros_like(x); };
  EXPECT_NE(config_error([&] { sample(zero, at::zeros({2}), options); }).find("--shift"), std::string::npos);
  EXPECT_NE(config_error([] { sampling_sigmas(0, 5.0, Solver::unipc); }).find("--steps"), std::string::npos);
}

}  // namespace
}  // namespace loom::tasks::flow_matching
