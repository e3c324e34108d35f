#include "loom/tasks/vae/task.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include <cmath>
#include <vector>

#include "loom/checkpoint/checkpoint_dir.h"
#include "loom/models/weights.h"
#include "loom/util/errors.h"

namespace loom::tasks {

namespace {

constexpr double kFps = 8;  // reconstructed clips play at this rate

}  // namespace

VaeTask::VaeTask(const config::JobConfig& job, std::shared_ptr<models::LatentCodec> model,
                 const core::Layout& layout)
    : job_(job),
      model_(std::move(model)),
      layout_(layout),
      clips_(job.data, models::derive_seed(static_cast<uint64_t>(job.training.seed), "data")),
      seed_(static_cast<uint64_t>(job.training.seed)) {
  if (!job.data.features.empty())
    throw ConfigError(
        "data.features: is read by task flow_matching only (a VAE trains on the clips themselves)");
  const int64_t frames = clips_.frames();
  if (!model_->encodes_frames(frames))
    throw ConfigError(
        fmt::format("data.frames: the latent codec encodes {}, got {}", model_->frames_rule(), frames));
  if (clips_.height() % model_->spatial_factor() != 0)
    throw ConfigError(
        fmt::format("data.video_size: the latent codec takes sides that are multiples of {}, got {}",
                    model_->spatial_factor(), clips_.height()));
}

std::optional<VaeMicroBatch> VaeTask::micro_batch(const std::vector<int64_t>& indices, bool with_noise,
                                                  int64_t* skipped) const {
  const models::LatentCodec& c = *model_;
  std::vector<at::Tensor> videos, noises;
  for (int64_t i : indices) {
    const std::optional<data::VideoClip> clip = clips_.train(i);
    if (!clip) {
      ++*skipped;
      continue;
    }
    videos.push_back(video_tensor(*clip));
    if (!with_noise) continue;
    const std::vector<int64_t> latent = {c.latent_channels(), c.latent_frames(clip->frames),
                                         clip->height / c.spatial_factor(), clip->width / c.spatial_factor()};
    auto generator =
        at::make_generator<at::CPUGeneratorImpl>(models::derive_seed(seed_, fmt::format("vae/noise/{}", i)));
    noises.push_back(at::randn(latent, generator, at::kFloat));
  }
  if (videos.empty()) return std::nullopt;
  VaeMicroBatch out;
  out.video = at::stack(videos);
  if (with_noise) out.noise = at::stack(noises);
  return out;
}

core::StepData VaeTask::step_data(int64_t step) const {
  const auto& t = job_.training;
  const int64_t share = t.global_batch_size / layout_.data_parallel();
  const int64_t begin = step * t.global_batch_size + layout_.data_shard() * share;
  core::StepData out;
  for (const auto& indices : same_shape_batches(begin, begin + share, t.micro_batch_size,
                                                [this](int64_t i) { return clips_.train_frames(i); })) {
    std::optional<VaeMicroBatch> batch = micro_batch(indices, true, &out.skipped);
    if (!batch) continue;
    out.loss_count += static_cast<double>(batch->video.numel());
    out.micro_batches.push_back(std::make_shared<VaeMicroBatch>(std::move(*batch)));
  }
  return out;
}

namespace {

// The posterior's KL divergence from N(0, I), summed over the elements.
at::Tensor kl_sum(const at::Tensor& mu, const at::Tensor& log_var) {
  const at::Tensor lv = log_var.to(at::kFloat).clamp(-30.0, 20.0);
  return 0.5 * (mu.to(at::kFloat).pow(2) + lv.exp() - 1.0 - lv).sum();
}

// The reconstruction error summed over the pixels: squared (mse) or absolute (l1).
at::Tensor reconstruction_sum(const at::Tensor& error, const std::string& kind) {
  return kind == "l1" ? error.abs().sum() : error.pow(2).sum();
}

}  // namespace

core::ForwardResult VaeTask::forward(const core::MicroBatch& micro, const core::Stage& stage,
                                     core::Carry input) {
  const auto& batch = static_cast<const VaeMicroBatch&>(micro);
  auto context = std::make_shared<models::LatentCodecContext>();
  const at::TensorOptions inputs = model_->input_options();
  context->video = batch.video.to(inputs.device(), inputs.dtype());
  context->noise = batch.noise.to(inputs.device(), inputs.dtype());
  core::ForwardResult out;
  core::Carry carry = stage.forward(std::move(input), context);
  if (stage.last) {
    const at::Tensor error = carry.get("hidden").to(at::kFloat) - context->video.to(at::kFloat);
    out.loss_sum = reconstruction_sum(error, job_.training.reconstruction_loss) +
                   job_.training.kl_weight * kl_sum(carry.get("mu"), carry.get("log_var"));
  } else {
    out.output = std::move(carry);
  }
  out.samples = batch.video.size(0);
  out.tokens = batch.video.numel() / 3;  // pixels of every frame
  return out;
}

core::Evaluation VaeTask::evaluate(int64_t step) {
  at::NoGradGuard no_grad;
  const int64_t samples = clips_.eval_samples();
  core::Evaluation e;
  if (samples == 0) {
    e.summary = "eval: no held-out clips (data.eval_datasets)";
    e.report = e.summary + "\n";
    return e;
  }
  const int64_t ranks = layout_.data() ? layout_.data()->size() : 1, rank = layout_.data_rank();
  // Sums of the squared error, the KL, the pixels and the training loss's reconstruction error, over
  // this rank's batches.
  at::Tensor sums = at::zeros({4}, at::kDouble);
  const auto& layers = model_->layers();
  const auto batches = same_shape_batches(0, samples, job_.training.micro_batch_size,
                                          [this](int64_t i) { return clips_.eval_frames(i); });
  for (size_t index = 0; index < batches.size(); ++index) {
    if (static_cast<int64_t>(index) % ranks != rank) continue;
    std::vector<at::Tensor> videos;
    for (int64_t i : batches[index]) videos.push_back(video_tensor(clips_.eval(i)));
    models::LatentCodecContext context;
    const at::TensorOptions inputs = model_->input_options();
    context.video = at::stack(videos).to(inputs.device(), inputs.dtype());
    const core::Carry carry = core::run_layers(layers, {}, context);
    const at::Tensor error = carry.get("hidden").to(at::kFloat) - context.video.to(at::kFloat);
    const double squared = error.pow(2).sum().item<double>();
    sums[0] += squared;
    sums[1] += kl_sum(carry.get("mu"), carry.get("log_var")).item<double>();
    sums[2] += static_cast<double>(context.video.numel());
    sums[3] += job_.training.reconstruction_loss == "l1" ? error.abs().sum().item<double>() : squared;
  }
  if (layout_.data()) layout_.data()->all_reduce_sum({sums});
  const double pixels = sums[2].item<double>(), mse = sums[0].item<double>() / pixels;
  const double loss = (sums[3].item<double>() + job_.training.kl_weight * sums[1].item<double>()) / pixels;
  // PSNR on [0, 1] pixels: the error on [-1, 1] is twice as large, its square four times.
  const double psnr = 10.0 * std::log10(4.0 / std::max(mse, 1e-12));
  e.samples = samples;
  e.metrics = {{"eval_loss", loss}, {"eval_mse", mse}, {"eval_psnr", psnr}};
  e.summary = fmt::format("eval: held-out loss {:.6f}, reconstruction PSNR {:.2f} dB on {} clips", loss, psnr,
                          samples);
  const int64_t videos = std::min<int64_t>(job_.training.eval_videos, clips_.eval_size());
  if (videos > 0) {
    // Each clip reconstructed through the posterior mean.
    const std::string dir = write_eval_clips(
        job_.training.output_dir, step, videos, layout_,
        [this](int64_t i) {
          return nlohmann::json{{"caption", clips_.eval_caption(i)}};
        },
        [&](int64_t i) {
          models::LatentCodecContext context;
          const at::TensorOptions inputs = model_->input_options();
          context.video = video_tensor(clips_.eval(i)).unsqueeze(0).to(inputs.device(), inputs.dtype());
          return core::run_layers(layers, {}, context).get("hidden")[0];
        },
        kFps);
    e.summary += fmt::format("; {} held-out clips reconstructed into {}", videos, dir);
  }
  e.report = e.summary + "\n";
  return e;
}

void VaeTask::save_artifacts(const std::string& dir) const {
  at::NoGradGuard no_grad;
  // The first kStatisticsClips usable training samples, a frame count at a time, each sample's
  // latents flattened per channel.
  std::vector<at::Tensor> means;  // [z, n] per batch
  int64_t taken = 0, skipped = 0, next = 0;
  while (taken < kStatisticsClips) {
    if (next >= 64 * kStatisticsClips)
      throw DataError(fmt::format(
          "fewer than {} of the first {} training samples are usable: no latent statistics for {}",
          kStatisticsClips, next, dir));
    const int64_t end = next + (kStatisticsClips - taken);
    for (const auto& indices : same_shape_batches(next, end, job_.training.micro_batch_size,
                                                  [this](int64_t i) { return clips_.train_frames(i); })) {
      const std::optional<VaeMicroBatch> batch = micro_batch(indices, false, &skipped);
      if (!batch) continue;
      taken += batch->video.size(0);
      const at::Tensor mu = model_->encode_clips(batch->video, /*chunked=*/false).mu.to(at::kDouble);
      means.push_back(mu.transpose(0, 1).reshape({model_->latent_channels(), -1}));
    }
    next = end;
  }
  // Per channel, over the clips, frames and positions.
  const at::Tensor all = at::cat(means, 1);
  const at::Tensor mean = all.mean(1).cpu(), deviation = all.std(1).clamp_min(1e-6).cpu();
  const nlohmann::json hf = model_->hf_config_with_latent_statistics(
      {mean.data_ptr<double>(), mean.data_ptr<double>() + mean.numel()},
      {deviation.data_ptr<double>(), deviation.data_ptr<double>() + deviation.numel()});
  checkpoint::write_text_file_durable(dir + "/config.json", hf.dump(2) + "\n");
}

}  // namespace loom::tasks
