#include "loom/tasks/flow_matching/features.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "loom/checkpoint/checkpoint_dir.h"
#include "loom/models/registry.h"
#include "loom/models/weights.h"
#include "loom/tasks/flow_matching/task.h"
#include "loom/tasks/video/clips.h"
#include "loom/util/errors.h"

namespace loom::tasks::flow_matching {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kIndexFile = "features.json";
constexpr const char* kFormat = "loom flow-matching features";

// Samples gathered per latent shape and written as shards of one shape each.
class ShardWriter {
 public:
  ShardWriter(std::string dir, std::string prefix) : dir_(std::move(dir)), prefix_(std::move(prefix)) {}

  void add(const at::Tensor& latents, const at::Tensor& text, int64_t source_index) {
    Pending& p = pending_[latents.size(1)];
    p.latents.push_back(latents);
    p.text.push_back(text);
    p.source.push_back(source_index);
    ++added_;
    if (static_cast<int64_t>(p.latents.size()) == kShardSamples) flush(p);
  }
  // Writes what is left; returns the shards written, in order.
  json finish() {
    for (auto& [frames, p] : pending_)
      if (!p.latents.empty()) flush(p);
    return shards_;
  }
  int64_t added() const { return added_; }
  // The source index of every row written, in the order of the shards and their rows.
  const std::vector<int64_t>& written_sources() const { return written_; }

 private:
  struct Pending {
    std::vector<at::Tensor> latents, text;
    std::vector<int64_t> source;
  };

  void flush(Pending& p) {
    const std::string file = fmt::format("{}-{:05d}.safetensors", prefix_, shards_.size());
    std::vector<int64_t> offsets{0};
    for (const at::Tensor& t : p.text) offsets.push_back(offsets.back() + t.size(0));
    const at::Tensor latents = at::stack(p.latents);
    checkpoint::save_safetensors((fs::path(dir_) / file).string(),
                                 {{"latents", latents},
                                  {"text", at::cat(p.text)},
                                  {"text_offsets", at::tensor(offsets, at::kLong)},
                                  {"source_index", at::tensor(p.source, at::kLong)}});
    shards_.push_back(
        {{"file", file},
         {"samples", p.latents.size()},
         {"latent_shape", std::vector<int64_t>(latents.sizes().begin() + 1, latents.sizes().end())}});
    written_.insert(written_.end(), p.source.begin(), p.source.end());
    p = Pending{};
  }

  std::string dir_, prefix_;
  std::map<int64_t, Pending> pending_;  // by latent frames
  json shards_ = json::array();
  int64_t added_ = 0;
  std::vector<int64_t> written_;
};

// A [L, d] tensor as L lists of d numbers.
std::vector<std::vector<double>> tensor_rows(const at::Tensor& t) {
  const at::Tensor d = t.to(at::kDouble).contiguous();
  std::vector<std::vector<double>> rows;
  for (int64_t r = 0; r < d.size(0); ++r)
    rows.emplace_back(d[r].data_ptr<double>(), d[r].data_ptr<double>() + d.size(1));
  return rows;
}

}  // namespace

std::string extract_features(const config::JobConfig& job, const std::string& out, int64_t samples) {
  if (job.training.task != "flow_matching" ||
      models::family_named(job.model.family).kind != models::ModelKind::denoiser)
    throw ConfigError(
        fmt::format("extract-features takes a flow_matching job's config (training.task flow_matching, a "
                    "denoiser's model.family), not a {} job's {}",
                    job.training.task, job.model.family));
  if (samples < 0) throw ConfigError(fmt::format("--samples: must be >= 0, got {}", samples));
  const std::string& out_dir = out.empty() ? job.data.features : out;
  if (out_dir.empty()) throw ConfigError("extract-features: give --out DIR, or data.features in the job");
  std::error_code error;
  if (fs::exists(out_dir, error) && !(fs::is_directory(out_dir, error) && fs::is_empty(out_dir, error)))
    throw ConfigError(
        fmt::format("--out: {} exists and is not an empty directory; features go into a new one", out_dir));
  fs::create_directories(out_dir, error);
  if (error) throw DataError(fmt::format("cannot create {}: {}", out_dir, error.message()));

  const uint64_t seed = static_cast<uint64_t>(job.training.seed);
  const auto dit = models::as_interface<models::Denoiser>(models::job_model_shapes(job), "model.family");
  const VideoClips clips(job.data, models::derive_seed(seed, "data"));  // the stream a training job walks
  const FlowHelpers helpers = load_flow_helpers(job, *dit, clips.builtin_tokenizer());
  if (samples == 0)
    samples = job.training.epochs > 0
                  ? clips.train_size()
                  : std::min(clips.train_size(), job.training.steps * job.training.global_batch_size);
  const int64_t batch = job.training.micro_batch_size;

  const auto encode_into = [&](ShardWriter& writer, const std::vector<int64_t>& indices,
                               const std::vector<data::VideoClip>& batch_clips) {
    std::vector<at::Tensor> videos;
    std::vector<std::string> captions;
    for (const auto& clip : batch_clips) {
      videos.push_back(video_tensor(clip));
      captions.push_back(clip.caption);
    }
    const at::Tensor x0 = encode_latents(*helpers.vae, at::stack(videos));
    const std::vector<at::Tensor> text = helpers.captions->encode(captions);
    for (size_t i = 0; i < batch_clips.size(); ++i)
      writer.add(x0[static_cast<int64_t>(i)], text[i], indices[i]);
  };

  ShardWriter train(out_dir, "train");
  int64_t skipped = 0;
  for (int64_t begin = 0; begin < samples; begin += batch) {
    for (const auto& indices : same_shape_batches(begin, std::min(begin + batch, samples), batch,
                                                  [&](int64_t i) { return clips.train_frames(i); })) {
      std::vector<data::VideoClip> batch_clips;
      std::vector<int64_t> kept;
      for (int64_t i : indices) {
        if (auto clip = clips.train(i)) {
          batch_clips.push_back(std::move(*clip));
          kept.push_back(i);
        } else {
          ++skipped;
        }
      }
      if (!batch_clips.empty()) encode_into(train, kept, batch_clips);
    }
    if ((begin / batch + 1) % 50 == 0)
      spdlog::info("extract-features: {} of {} training samples", begin + batch, samples);
  }
  if (train.added() == 0)
    throw DataError(fmt::format("none of the first {} training samples is usable", samples));
  ShardWriter held_out(out_dir, "eval");
  json captions = json::array();
  for (const auto& indices :
       same_shape_batches(0, clips.eval_samples(), batch, [&](int64_t i) { return clips.eval_frames(i); })) {
    std::vector<data::VideoClip> batch_clips;
    for (int64_t i : indices) batch_clips.push_back(clips.eval(i));
    encode_into(held_out, indices, batch_clips);
  }
  // Held-out captions in the order of the rows: shards of one shape each, in the order written.
  json train_shards = train.finish(), eval_shards = held_out.finish();
  for (int64_t source : held_out.written_sources()) captions.push_back(clips.eval_caption(source));
  const models::LatentCodec& vae = *helpers.vae;
  json index = {{"format", kFormat},
                {"version", 1},
                {"frames", clips.frames()},
                {"video_size", clips.height()},
                {"z_dim", vae.latent_channels()},
                {"latents_mean", vae.latents_mean()},
                {"latents_std", vae.latents_std()},
                {"text_dim", helpers.captions->width()},
                {"dataset", job.data.dataset},
                {"fps", job.data.fps},
                {"empty_caption", tensor_rows(helpers.captions->encode({""})[0])},
                {"train", {{"samples", train.added()}, {"skipped", skipped}, {"shards", train_shards}}},
                {"eval", {{"samples", held_out.added()}, {"shards", eval_shards}, {"captions", captions}}}};
  checkpoint::write_text_file_durable((fs::path(out_dir) / kIndexFile).string(), index.dump(1) + "\n");
  const std::string summary =
      fmt::format("extract-features: {} training samples ({} skipped as unusable) and {} held-out ones in {}",
                  train.added(), skipped, held_out.added(), out_dir);
  return summary;
}

FeatureSet::FeatureSet(const std::string& dir) : dir_(dir) {
  const std::string index_path = (fs::path(dir) / kIndexFile).string();
  std::error_code error;
  if (!fs::is_regular_file(index_path, error))
    throw DataError(
        fmt::format("data.features: {} has no {} (not a features directory, or an extraction that did "
                    "not finish)",
                    dir, kIndexFile));
  json index;
  try {
    index = json::parse(checkpoint::read_text_file(index_path));
    if (index.at("format").get<std::string>() != kFormat || index.at("version").get<int>() != 1)
      throw DataError(fmt::format("{}: not version 1 of {}", index_path, kFormat));
    z_dim_ = index.at("z_dim").get<int64_t>();
    text_dim_ = index.at("text_dim").get<int64_t>();
    frames_ = index.at("frames").get<int64_t>();
    video_size_ = index.at("video_size").get<int64_t>();
    latents_mean_ = index.at("latents_mean").get<std::vector<double>>();
    latents_std_ = index.at("latents_std").get<std::vector<double>>();
    eval_captions_ = index.at("eval").at("captions").get<std::vector<std::string>>();
    dataset_ = index.at("dataset").get<std::string>();
    fps_ = index.at("fps").get<double>();
    const auto empty = index.at("empty_caption").get<std::vector<std::vector<double>>>();
    if (empty.empty() || empty[0].size() != static_cast<size_t>(text_dim_))
      throw DataError(
          fmt::format("{}: empty_caption is not rows of text_dim {} numbers", index_path, text_dim_));
    empty_caption_ = at::empty({static_cast<int64_t>(empty.size()), text_dim_}, at::kDouble);
    for (size_t r = 0; r < empty.size(); ++r) {
      if (empty[r].size() != static_cast<size_t>(text_dim_))
        throw DataError(fmt::format("{}: empty_caption's rows are not all {} wide", index_path, text_dim_));
      for (int64_t c = 0; c < text_dim_; ++c)
        empty_caption_[static_cast<int64_t>(r)][c] = empty[r][static_cast<size_t>(c)];
    }
    for (const char* split : {"train", "eval"}) {
      std::vector<Row>& rows = std::string(split) == "train" ? train_ : eval_;
      for (const json& shard : index.at(split).at("shards")) {
        const std::string file = (fs::path(dir) / shard.at("file").get<std::string>()).string();
        const int64_t n = shard.at("samples").get<int64_t>();
        const auto shape = shard.at("latent_shape").get<std::vector<int64_t>>();
        shards_.emplace_back(file);
        const auto& reader = shards_.back();
        const auto latents = reader.shape("latents");
        const at::Tensor offsets = reader.load("text_offsets");
        std::vector<int64_t> expected{n};
        expected.insert(expected.end(), shape.begin(), shape.end());
        if (latents != expected || shape.size() != 4 || shape[0] != z_dim_ || offsets.numel() != n + 1 ||
            reader.shape("text").size() != 2 || reader.shape("text")[1] != text_dim_ ||
            offsets[n].item<int64_t>() != reader.shape("text")[0] || offsets[0].item<int64_t>() != 0 ||
            (offsets.slice(0, 1) < offsets.slice(0, 0, n)).any().item<bool>())
          throw DataError(
              fmt::format("{}: its tensors disagree with {} ({} samples of latents [{}], text {} wide)", file,
                          index_path, n, fmt::join(shape, ", "), text_dim_));
        offsets_.push_back(offsets);
        for (int64_t i = 0; i < n; ++i) rows.push_back({shards_.size() - 1, i, shape[1]});
      }
    }
  } catch (const json::exception& e) {
    throw DataError(fmt::format("{}: not a features index ({})", index_path, e.what()));
  } catch (const CheckpointError& e) {
    throw DataError(fmt::format("data.features: {}", e.what()));
  }
  if (train_.empty()) throw DataError(fmt::format("{}: no training samples", index_path));
  if (eval_captions_.size() != eval_.size())
    throw DataError(fmt::format("{}: {} held-out captions for {} held-out samples", index_path,
                                eval_captions_.size(), eval_.size()));
}

void FeatureSet::check_helpers(const models::LatentCodec& vae, const std::string& vae_key,
                               const CaptionEncoder& captions, const std::string& text_key) const {
  const int64_t text_dim = captions.width();
  if (vae.latent_channels() != z_dim_ || vae.latents_mean() != latents_mean_ ||
      vae.latents_std() != latents_std_)
    throw ConfigError(
        fmt::format("{}: the features in {} were made by another VAE (other latent channels or "
                    "statistics); sampling would decode latents it did not make",
                    vae_key, dir_));
  if (text_dim != text_dim_)
    throw ConfigError(
        fmt::format("{}: its features are {} wide, those in {} {}", text_key, text_dim, dir_, text_dim_));
  const at::Tensor empty = captions.encode({""})[0].to(at::kDouble);
  if (!empty.sizes().equals(empty_caption_.sizes()) || !at::allclose(empty, empty_caption_, 1e-5, 1e-6))
    throw ConfigError(
        fmt::format("{}: the features in {} were made by another text encoder (its features of the "
                    "empty caption differ)",
                    text_key, dir_));
}

void FeatureSet::check_source(const config::DataSection& data) const {
  const auto differs = [&](const char* key, const std::string& job, const std::string& features) {
    if (job != features)
      throw ConfigError(
          fmt::format("data.{}: {} here, but the features in {} were extracted from {}; extract them "
                      "again (loom data extract-features) or set data.{} back",
                      key, job, dir_, features, key));
  };
  differs("dataset", data.dataset, dataset_);
  differs("frames", std::to_string(data.frames), std::to_string(frames_));
  differs("video_size", std::to_string(data.video_size), std::to_string(video_size_));
  if (data.dataset == "videos") differs("fps", fmt::format("{}", data.fps), fmt::format("{}", fps_));
}

FeatureSet::Sample FeatureSet::read(const Row& row) const {
  const auto& reader = shards_[row.shard];
  const at::Tensor& offsets = offsets_[row.shard];
  const int64_t* o = offsets.data_ptr<int64_t>();
  return {reader.load_rows("latents", row.index, row.index + 1)[0],
          reader.load_rows("text", o[row.index], o[row.index + 1])};
}

}  // namespace loom::tasks::flow_matching
