// Training a denoiser by flow matching (task: flow_matching): each clip encoded by
// the frozen latent codec to
// normalised latents x0, its caption by the frozen text encoder (replaced by the empty caption's with
// probability training.caption_dropout), a noise level sigma drawn per sample (training.flow_shift,
// timestep_sampling), x_t = (1 - sigma) x0 + sigma noise, and the loss the squared error of the
// predicted velocity against noise - x0 per latent element. Evaluation: the held-out loss at fixed
// noise levels, and clips sampled for held-out captions written under the run directory.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "loom/config/config.h"
#include "loom/core/layout.h"
#include "loom/core/task.h"
#include "loom/models/generator.h"
#include "loom/tasks/flow_matching/features.h"
#include "loom/tasks/flow_matching/pipeline.h"
#include "loom/tasks/flow_matching/schedule.h"
#include "loom/tasks/flow_matching/text_encoder.h"
#include "loom/tasks/video/clips.h"

namespace loom::tasks::flow_matching {

struct FlowMicroBatch : core::MicroBatch {
  // Clips to encode, or pre-extracted features (data.dataset: features).
  at::Tensor video;                   // [B, 3, T, H, W] in [-1, 1], or undefined
  std::vector<std::string> captions;  // "" where the caption was dropped
  at::Tensor x0;                      // [B, z, T', h, w] normalised latents, or undefined
  std::vector<at::Tensor> text;       // each caption's features (the empty caption's where dropped)
  at::Tensor sigma;                   // [B] float64, the noise levels
  at::Tensor noise;                   // [B, z, T', h, w]
  std::vector<at::Tensor*> device_inputs() override {
    std::vector<at::Tensor*> out{&video, &x0, &sigma, &noise};
    for (at::Tensor& t : text) out.push_back(&t);
    return out;
  }
};

// The frozen helpers of a flow-matching job, as model.vae and model.text_encoder name them: the latent
// codec (ConfigError naming model.vae when it lacks latent statistics or disagrees with the denoiser's
// channels) and the caption encoder (its width must be the denoiser's text_dim).
struct FlowHelpers {
  std::shared_ptr<models::LatentCodec> vae;
  std::shared_ptr<CaptionEncoder> captions;
};
FlowHelpers load_flow_helpers(const config::JobConfig& job, const models::Denoiser& dit,
                              std::shared_ptr<const data::Tokenizer> builtin_tokenizer,
                              const at::Device& device = at::kCPU);

class FlowMatchingTask : public core::Task {
 public:
  FlowMatchingTask(const config::JobConfig& job, std::shared_ptr<models::Denoiser> model,
                   const core::Layout& layout);

  core::StepData step_data(int64_t step) const override;
  std::string loss_count_name() const override { return "latent elements"; }
  core::ForwardResult forward(const core::MicroBatch& batch, const core::Stage& stage,
                              core::Carry input) override;
  // eval_loss over the evaluation's held-out clips (VideoClips::eval_samples; clip i at noise level
  // (i mod 5 + 0.5) / 5, its noise from the seed), dealt over the data-parallel ranks; then the first
  // training.eval_videos held-out captions, sampled (also dealt over the ranks) into
  // <output_dir>/samples/step-NNNNNNNN (samples/eval outside training), with captions.json naming each
  // clip's caption and seed.
  core::Evaluation evaluate(int64_t step) override;
  void save_artifacts(const std::string& dir) const override {}
  // The clips (or the extracted features' training rows) of one pass.
  int64_t epoch_samples() const override {
    return features_ ? features_->train_size() : clips_->train_size();
  }
  // x0 (normalised latents, encoded here when the job reads clips), text (caption features padded to
  // text_len, the empty caption's where dropped), sigma (float64) and noise: the step's loss is the
  // squared error of the DiT's velocity at ((1 - sigma) x0 + sigma noise, 1000 sigma, text) against
  // noise - x0, summed over every micro-batch and divided by the noise's element count.
  std::vector<std::pair<std::string, at::Tensor>> export_step(int64_t step) const override;

  const GenerationSettings& generation() const { return generation_; }

 private:
  // The usable clips among `indices` (training samples of one frame count) with their draws, or
  // nullopt when none is; unusable ones are added to *skipped.
  std::optional<FlowMicroBatch> micro_batch(const std::vector<int64_t>& indices, int64_t* skipped) const;
  std::vector<int64_t> latent_for(int64_t frames) const;  // [z, T', h, w] of a clip of `frames`
  // A micro-batch's x0 and padded caption features: its pre-extracted features, or its clips encoded.
  std::pair<at::Tensor, at::Tensor> latents_and_text(const FlowMicroBatch& batch) const;
  // The latents x0 of the clips and their padded caption features, without gradients.
  std::pair<at::Tensor, at::Tensor> encode(const at::Tensor& video,
                                           const std::vector<std::string>& captions) const;
  // The squared error of the velocity predicted through `stage`'s layers (all of them); `sharded`: a
  // training pass, whose tokens are split over the context-parallel ranks (this rank's share of it).
  at::Tensor velocity_error(const at::Tensor& x0, const at::Tensor& text, const at::Tensor& sigma,
                            const at::Tensor& noise, const core::Stage& stage, core::Carry input,
                            core::Carry* output, bool sharded) const;

  config::JobConfig job_;
  std::shared_ptr<models::Denoiser> model_;
  core::Layout layout_;
  // What a training sample of the run is: a pre-extracted row, in the order of the features' shards
  // for the first pass and a fresh seeded order for each later one.
  int64_t feature_row(int64_t index) const;
  int64_t train_frames(int64_t index) const;  // in video frames, either source
  int64_t eval_frames(int64_t index) const;

  std::shared_ptr<VideoClips> clips_;     // the clips, or
  std::shared_ptr<FeatureSet> features_;  // their pre-extracted features
  FlowHelpers helpers_;
  GenerationSettings generation_;
  TimestepSampling sampling_;  // the training samples' noise levels
  uint64_t seed_;
};

}  // namespace loom::tasks::flow_matching
