// Flow matching's training side as the reference text-to-video code defines it (docs/models.md): the shifted
// noise level sigma of a sample, the noised latent x_t = (1 - sigma) x0 + sigma eps, the velocity target eps
// - x0 and the DiT's timestep. sigma = 0 is data, sigma = 1 is noise; the samplers (sampler.h) integrate from
// 1 down to 0.
#pragma once
#include <ATen/ATen.h>

#include <string>

#include "loom/util/random.h"

namespace loom::tasks::flow_matching {

// The timestep shift s' = shift*s / (1 + (shift-1)*s) (the reference's utils/fm_solvers.py
// get_sampling_sigmas and set_timesteps): a bijection of [0, 1] fixing 0 and 1, the identity for shift 1;
// shift > 1 moves training draws and sampling steps towards noise, where large latents need more of them.
// ConfigError unless shift > 0 and finite.
double shift_sigma(double s, double shift);

// How a training sample's noise level is drawn: s uniform in (0, 1), or s = sigmoid(mean + std*n)
// with n ~ N(0, 1) (logit-normal, SD3's choice), then sigma = shift_sigma(s, shift).
struct TimestepSampling {
  enum Kind { uniform, logit_normal };
  Kind kind = uniform;
  double mean = 0;   // logit_normal only: training.logit_mean
  double std = 1;    // logit_normal only: training.logit_std, > 0
  double shift = 1;  // training.flow_shift, > 0 (the reference samples with 5)
};

// "uniform" | "logit_normal"; ConfigError naming training.timestep_sampling and the valid names.
TimestepSampling::Kind parse_timestep_sampling(const std::string& name);

// ConfigError naming the training.* key of a value out of range.
void check_timestep_sampling(const TimestepSampling& sampling);

// One draw of sigma from rng (which advances). The uniforms come from 52 random bits each, centred in
// their cells: (k + 0.5) / 2^52, so never exactly 0 or 1. Logit-normal uses Box-Muller,
// n = sqrt(-2 ln u1) cos(2 pi u2), one normal per draw (the sine half is dropped so that a draw
// always consumes exactly two numbers of the stream). The result lies in the open interval (0, 1):
// s and then sigma are held to [DBL_MIN, 1 - 2^-53], since a sigmoid or the shift can round to 0 or
// 1 in double, and a loss weight or log-SNR of the draw must stay finite. Checks `sampling`.
double sample_sigma(const TimestepSampling& sampling, CounterRng& rng);

// x_t = (1 - sigma) x0 + sigma eps, per sample.
// x0, eps [B, ...] (the same shape), sigma [B] (any floating dtype) -> [B, ...] in x0's dtype.
// ModelError if the shapes disagree.
at::Tensor noised(const at::Tensor& x0, const at::Tensor& eps, const at::Tensor& sigma);

// What the DiT learns to predict: d x_t / d sigma = eps - x0. x0, eps [B, ...] -> [B, ...].
at::Tensor velocity_target(const at::Tensor& x0, const at::Tensor& eps);

// The timestep the DiT is given in training: 1000 sigma, not rounded (the reference's num_train_timesteps
// is 1000; its sampler gives the DiT whole numbers instead, see sampling_timesteps in sampler.h).
double timestep_of(double sigma);

}  // namespace loom::tasks::flow_matching
