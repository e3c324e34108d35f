#include "loom/tasks/flow_matching/task.h"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include "loom/checkpoint/checkpoint_dir.h"
#include "loom/models/registry.h"
#include "loom/models/weights.h"
#include "loom/tasks/flow_matching/schedule.h"
#include "loom/util/errors.h"
#include "loom/util/random.h"

namespace loom::tasks::flow_matching {

namespace {

constexpr uint64_t kDropoutStream = 31, kSigmaStream = 32, kFeatureOrderStream = 33;
constexpr int64_t kEvalLevels = 5;
constexpr double kFps = 8;  // sampled clips play at this rate

}  // namespace

FlowHelpers load_flow_helpers(const config::JobConfig& job, const models::Denoiser& dit,
                              std::shared_ptr<const data::Tokenizer> builtin_tokenizer,
                              const at::Device& device) {
  FlowHelpers helpers;
  // "": an inline config, its weights drawn from the seed
  const std::string vae_dir = job.model.vae.empty() ? "" : checkpoint::resolve_model_directory(job.model.vae);
  helpers.vae = models::as_interface<models::LatentCodec>(
      models::load_frozen_model(models::ModelKind::latent_codec, "model.vae", vae_dir, job.model.vae_config,
                                models::derive_seed(job.training.seed, "vae")),
      "model.vae");
  const std::string vae_name = vae_dir.empty() ? "the inline config" : vae_dir;
  if (helpers.vae->latents_mean().empty())
    throw ConfigError(
        fmt::format("model.vae: {} has no latents_mean / latents_std (a vae job's checkpoints carry them; "
                    "an inline config takes its family's published ones where there are any)",
                    vae_name));
  const int64_t z = helpers.vae->latent_channels();
  if (z != dit.in_channels() || z != dit.out_channels())
    throw ConfigError(fmt::format("model.vae: {} makes latents of {} channels; the DiT takes {} and gives {}",
                                  vae_name, z, dit.in_channels(), dit.out_channels()));
  helpers.captions =
      std::make_shared<CaptionEncoder>(job.model, models::derive_seed(job.training.seed, "text"),
                                       std::move(builtin_tokenizer), dit.text_len());
  if (helpers.captions->width() != dit.text_dim())
    throw ConfigError(fmt::format("model.text_encoder: its features are {} wide; the DiT's text_dim is {}",
                                  helpers.captions->width(), dit.text_dim()));
  helpers.vae->module().to(device);
  helpers.captions->to(device);
  return helpers;
}

FlowMatchingTask::FlowMatchingTask(const config::JobConfig& job, std::shared_ptr<models::Denoiser> model,
                                   const core::Layout& layout)
    : job_(job), model_(std::move(model)), layout_(layout), seed_(static_cast<uint64_t>(job.training.seed)) {
  std::shared_ptr<const data::Tokenizer> builtin;
  if (!job.data.features.empty()) {
    features_ = std::make_shared<FeatureSet>(job.data.features);
    features_->check_source(job.data);
    if (job.data.dataset == "moving_fashion")
      builtin = std::make_shared<data::WordTokenizer>(moving_fashion_tokenizer());
  } else {
    clips_ = std::make_shared<VideoClips>(job.data, models::derive_seed(seed_, "data"));
    builtin = clips_->builtin_tokenizer();
  }
  helpers_ = load_flow_helpers(job, *model_, builtin, layout.device);
  if (features_)
    features_->check_helpers(*helpers_.vae, "model.vae", *helpers_.captions, "model.text_encoder");
  const auto& t = job.training;
  generation_.frames = features_ ? features_->frames() : clips_->frames();
  generation_.height = generation_.width = features_ ? features_->video_size() : clips_->height();
  generation_.guidance = t.sample_guidance;
  generation_.sampling.steps = t.sample_steps;
  generation_.sampling.shift = t.sample_shift;
  generation_.sampling.solver = parse_solver(t.sample_solver, "training.sample_solver");
  try {
    latent_shape(*model_, *helpers_.vae, generation_);
  } catch (const ConfigError& e) {
    throw ConfigError(
        fmt::format("data (frames {}, video_size {}): {}", generation_.frames, generation_.height, e.what()));
  }
  sampling_.kind = parse_timestep_sampling(t.timestep_sampling);
  sampling_.mean = t.logit_mean;
  sampling_.std = t.logit_std;
  sampling_.shift = t.flow_shift;
  check_timestep_sampling(sampling_);
}

std::vector<int64_t> FlowMatchingTask::latent_for(int64_t frames) const {
  GenerationSettings settings = generation_;
  settings.frames = frames;
  return latent_shape(*model_, *helpers_.vae, settings);
}

std::optional<FlowMicroBatch> FlowMatchingTask::micro_batch(const std::vector<int64_t>& indices,
                                                            int64_t* skipped) const {
  const auto& t = job_.training;
  FlowMicroBatch out;
  std::vector<at::Tensor> videos, noises;
  std::vector<double> sigmas;
  std::vector<at::Tensor> latents;
  for (int64_t i : indices) {
    // Each draw from (seed, its purpose, the sample's place in the run): any layout draws alike.
    CounterRng dropout(seed_, kDropoutStream, static_cast<uint64_t>(i));
    const bool dropped = static_cast<double>(dropout.next() >> 11) * 0x1.0p-53 < t.caption_dropout;
    int64_t frames = 0;
    if (features_) {
      FeatureSet::Sample sample = features_->train(feature_row(i));
      latents.push_back(sample.latents.to(at::kFloat));
      out.text.push_back(dropped ? helpers_.captions->encode({""})[0] : sample.text.to(at::kFloat));
      frames = train_frames(i);
    } else {
      const std::optional<data::VideoClip> clip = clips_->train(i);
      if (!clip) {
        ++*skipped;
        continue;
      }
      videos.push_back(video_tensor(*clip));
      out.captions.push_back(dropped ? std::string() : clip->caption);
      frames = clip->frames;
    }
    CounterRng level(seed_, kSigmaStream, static_cast<uint64_t>(i));
    sigmas.push_back(sample_sigma(sampling_, level));
    auto generator =
        at::make_generator<at::CPUGeneratorImpl>(models::derive_seed(seed_, fmt::format("flow/noise/{}", i)));
    noises.push_back(at::randn(latent_for(frames), generator, at::kFloat));
  }
  if (videos.empty() && latents.empty()) return std::nullopt;
  if (features_)
    out.x0 = at::stack(latents);
  else
    out.video = at::stack(videos);
  out.sigma = at::tensor(sigmas, at::kDouble);
  out.noise = at::stack(noises);
  return out;
}

int64_t FlowMatchingTask::feature_row(int64_t index) const {
  const int64_t n = features_->train_size();
  const uint64_t pass = static_cast<uint64_t>(index / n);
  const uint64_t at = static_cast<uint64_t>(index % n);
  if (pass == 0) return static_cast<int64_t>(at);
  return static_cast<int64_t>(
      permute_index(at, static_cast<uint64_t>(n), counter_start(seed_, kFeatureOrderStream, pass)));
}

int64_t FlowMatchingTask::train_frames(int64_t index) const {
  if (!features_) return clips_->train_frames(index);
  return helpers_.vae->video_frames(features_->train_latent_frames(feature_row(index)));
}

int64_t FlowMatchingTask::eval_frames(int64_t index) const {
  if (!features_) return clips_->eval_frames(index);
  return helpers_.vae->video_frames(features_->eval_latent_frames(index));
}

core::StepData FlowMatchingTask::step_data(int64_t step) const {
  const auto& t = job_.training;
  const int64_t share = t.global_batch_size / layout_.data_parallel();
  const int64_t begin = step * t.global_batch_size + layout_.data_shard() * share;
  core::StepData out;
  for (const auto& indices : same_shape_batches(begin, begin + share, t.micro_batch_size,
                                                [this](int64_t i) { return train_frames(i); })) {
    std::optional<FlowMicroBatch> batch = micro_batch(indices, &out.skipped);
    if (!batch) continue;
    out.loss_count += static_cast<double>(batch->noise.numel());
    out.micro_batches.push_back(std::make_shared<FlowMicroBatch>(std::move(*batch)));
  }
  return out;
}

std::vector<std::pair<std::string, at::Tensor>> FlowMatchingTask::export_step(int64_t step) const {
  if (layout_.data_parallel() != 1)
    throw ConfigError("data export: exports the whole step from one process (parallel.dp 1)");
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  const core::StepData data = step_data(step);
  for (size_t m = 0; m < data.micro_batches.size(); ++m) {
    const auto& batch = static_cast<const FlowMicroBatch&>(*data.micro_batches[m]);
    const auto [x0, text] = latents_and_text(batch);
    const std::string key = std::to_string(m) + ".";
    tensors.emplace_back(key + "x0", x0.to(at::kFloat).contiguous());
    tensors.emplace_back(key + "text", text.to(at::kFloat).contiguous());
    tensors.emplace_back(key + "sigma", batch.sigma);
    tensors.emplace_back(key + "noise", batch.noise);
  }
  return tensors;
}

std::pair<at::Tensor, at::Tensor> FlowMatchingTask::latents_and_text(const FlowMicroBatch& batch) const {
  if (batch.x0.defined()) return {batch.x0, model_->text_batch(batch.text)};
  return encode(batch.video, batch.captions);
}

std::pair<at::Tensor, at::Tensor> FlowMatchingTask::encode(const at::Tensor& video,
                                                           const std::vector<std::string>& captions) const {
  at::NoGradGuard no_grad;
  const at::Tensor x0 = encode_latents(*helpers_.vae, video);  // [B, z, T', h, w]
  const at::Tensor text = model_->text_batch(helpers_.captions->encode(captions));
  return {x0, text};
}

at::Tensor FlowMatchingTask::velocity_error(const at::Tensor& x0, const at::Tensor& text,
                                            const at::Tensor& sigma, const at::Tensor& noise,
                                            const core::Stage& stage, core::Carry input, core::Carry* output,
                                            bool sharded) const {
  const at::TensorOptions inputs = model_->input_options();
  const at::Device device = inputs.device();
  const at::Tensor s = sigma.to(device, at::kFloat);
  const at::Tensor xt = noised(x0.to(device), noise.to(device), s);
  const at::Tensor latents = xt.to(inputs.dtype()), timesteps = sigma.to(device) * 1000.0,
                   words = text.to(device, inputs.dtype());
  const auto context = model_->context(latents, timesteps, words, sharded);
  core::Carry carry = stage.forward(std::move(input), context);
  if (!stage.last) {
    *output = std::move(carry);
    return {};
  }
  const at::Tensor target = model_->output_tokens(velocity_target(x0.to(device), noise.to(device)));
  const at::Tensor predicted = carry.get("hidden").to(at::kFloat);
  if (!context->shard.enabled()) return (predicted - target).pow(2).sum();
  // Context parallelism: this rank's positions of every sample, its padding left out.
  const parallel::ContextShard& shard = context->shard;
  const at::Tensor real =
      (shard.row_index < target.size(1)).to(at::kFloat).to(target.device()).view({1, -1, 1});
  return ((predicted - shard.scatter_rows(target)).pow(2) * real).sum();
}

core::ForwardResult FlowMatchingTask::forward(const core::MicroBatch& micro, const core::Stage& stage,
                                              core::Carry input) {
  const auto& batch = static_cast<const FlowMicroBatch&>(micro);
  const auto [x0, text] = latents_and_text(batch);
  core::ForwardResult out;
  out.loss_sum = velocity_error(x0, text, batch.sigma, batch.noise, stage, std::move(input), &out.output,
                                /*sharded=*/true);
  const int64_t batch_size = x0.size(0);
  out.samples = batch_size;
  out.tokens = batch_size * model_->tokens(x0);
  out.flops = model_->training_flops(x0);
  return out;
}

core::Evaluation FlowMatchingTask::evaluate(int64_t step) {
  at::NoGradGuard no_grad;
  const int64_t samples =
      features_ ? std::min(job_.data.eval_samples, features_->eval_size()) : clips_->eval_samples();
  const int64_t ranks = layout_.data() ? layout_.data()->size() : 1, rank = layout_.data_rank();
  core::Stage whole;
  whole.layers = model_->layers();
  at::Tensor sums = at::zeros({2}, at::kDouble);  // squared error, latent elements
  const auto batches = same_shape_batches(0, samples, job_.training.micro_batch_size,
                                          [this](int64_t i) { return eval_frames(i); });
  for (size_t index = 0; index < batches.size(); ++index) {
    if (static_cast<int64_t>(index) % ranks != rank) continue;
    std::vector<at::Tensor> videos, latents, features, noises;
    std::vector<std::string> captions;
    std::vector<double> sigmas;
    for (int64_t i : batches[index]) {
      if (features_) {
        FeatureSet::Sample sample = features_->eval(i);
        latents.push_back(sample.latents.to(at::kFloat));
        features.push_back(sample.text.to(at::kFloat));
      } else {
        const data::VideoClip clip = clips_->eval(i);
        videos.push_back(video_tensor(clip));
        captions.push_back(clip.caption);
      }
      sigmas.push_back((static_cast<double>(i % kEvalLevels) + 0.5) / kEvalLevels);
      auto generator = at::make_generator<at::CPUGeneratorImpl>(
          models::derive_seed(seed_, fmt::format("flow/eval/{}", i)));
      noises.push_back(at::randn(latent_for(eval_frames(i)), generator, at::kFloat));
    }
    const auto [x0, text] = features_ ? std::pair{at::stack(latents), model_->text_batch(features)}
                                      : encode(at::stack(videos), captions);
    const at::Tensor error = velocity_error(x0, text, at::tensor(sigmas, at::kDouble), at::stack(noises),
                                            whole, {}, nullptr, false);
    sums[0] += error.item<double>();
    sums[1] += static_cast<double>(x0.numel());
  }
  if (layout_.data()) layout_.data()->all_reduce_sum({sums});
  core::Evaluation e;
  e.samples = samples;
  if (samples > 0) {
    const double loss = sums[0].item<double>() / sums[1].item<double>();
    e.metrics = {{"eval_loss", loss}};
    e.summary = fmt::format("eval: held-out flow-matching loss {:.6f} on {} clips", loss, samples);
  } else {
    e.summary = "eval: no held-out clips (data.eval_datasets)";
  }
  const int64_t videos =
      std::min<int64_t>(job_.training.eval_videos, features_ ? features_->eval_size() : clips_->eval_size());
  if (videos > 0) {
    // Each caption sampled from its own seed.
    auto caption = [this](int64_t i) {
      return features_ ? features_->eval_caption(i) : clips_->eval_caption(i);
    };
    auto seed = [this](int64_t i) { return models::derive_seed(seed_, fmt::format("flow/sample/{}", i)); };
    const std::string dir = write_eval_clips(
        job_.training.output_dir, step, videos, layout_,
        [&](int64_t i) {
          return nlohmann::json{{"caption", caption(i)}, {"seed", seed(i)}};
        },
        [&](int64_t i) {
          return generate_videos(*model_, *helpers_.vae, *helpers_.captions, {caption(i)}, {seed(i)},
                                 generation_)[0];
        },
        kFps);
    e.summary += fmt::format("; {} held-out captions sampled into {}", videos, dir);
  }
  e.report = e.summary + "\n";
  return e;
}

}  // namespace loom::tasks::flow_matching
