// Training a latent codec (task: vae) where no pretrained one exists: clips through
// its layers (encode, sample the posterior, decode), the loss per pixel the reconstruction error (squared, or
// absolute under training.reconstruction_loss: l1) plus kl_weight x the posterior's KL divergence from N(0,
// I); evaluation by the held-out loss and PSNR; and every checkpoint's config.json carrying the per-channel
// statistics of its latents (what a flow-matching job normalises them by).
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "loom/config/config.h"
#include "loom/core/layout.h"
#include "loom/core/task.h"
#include "loom/models/generator.h"
#include "loom/tasks/video/clips.h"

namespace loom::tasks {

struct VaeMicroBatch : core::MicroBatch {
  at::Tensor video;  // [B, 3, T, H, W] in [-1, 1]
  at::Tensor noise;  // [B, z, T', h, w]: each sample's draws, from (seed, its place in the run)
  std::vector<at::Tensor*> device_inputs() override { return {&video, &noise}; }
};

class VaeTask : public core::Task {
 public:
  // ConfigError when the clips do not fit the codec (its frames rule, sides multiples of its spatial
  // factor).
  VaeTask(const config::JobConfig& job, std::shared_ptr<models::LatentCodec> model,
          const core::Layout& layout);

  core::StepData step_data(int64_t step) const override;
  std::string loss_count_name() const override { return "pixels"; }
  core::ForwardResult forward(const core::MicroBatch& batch, const core::Stage& stage,
                              core::Carry input) override;
  // The evaluation's held-out clips (VideoClips::eval_samples) through the posterior mean (no sampling),
  // dealt over the data-parallel ranks: eval_loss, eval_mse (per pixel, on [-1, 1]), eval_psnr (dB, on [0,
  // 1]); then the first training.eval_videos held-out clips reconstructed into
  // <output_dir>/samples/step-NNNNNNNN (samples/eval outside training) as the flow-matching task writes its
  // samples, with captions.json.
  core::Evaluation evaluate(int64_t step) override;
  // config.json again, with latents_mean / latents_std: each latent channel's mean and standard
  // deviation of the posterior mean over the run's first kStatisticsClips usable training samples.
  void save_artifacts(const std::string& dir) const override;
  int64_t epoch_samples() const override { return clips_.train_size(); }

  static constexpr int64_t kStatisticsClips = 64;

 private:
  // The usable clips among `indices` (training samples of one frame count), or nullopt when none is;
  // unusable ones are added to *skipped.
  std::optional<VaeMicroBatch> micro_batch(const std::vector<int64_t>& indices, bool with_noise,
                                           int64_t* skipped) const;

  config::JobConfig job_;
  std::shared_ptr<models::LatentCodec> model_;
  core::Layout layout_;
  VideoClips clips_;
  uint64_t seed_;
};

}  // namespace loom::tasks
