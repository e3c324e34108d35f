#include "loom/tasks/video/clips.h"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>

#include "loom/checkpoint/checkpoint_dir.h"
#include "loom/data/fashion_vqa.h"
#include "loom/data/image/decode.h"
#include "loom/data/image/resize.h"
#include "loom/data/video/gif_writer.h"
#include "loom/data/video/mp4_writer.h"
#include "loom/data/video/video_decode.h"
#include "loom/util/errors.h"
#include "loom/util/random.h"

namespace loom::tasks {

namespace {

constexpr uint64_t kEpochOrderStream = 21;
constexpr size_t kWarnedSkips = 20;  // skipped samples named in the log; the rest are counted

data::DatasetSpec spec_of(const config::DatasetFile& file) {
  if (!file.fields.empty())
    throw ConfigError(
        fmt::format("data.datasets: {}: fields is read by dataset messages only; a video "
                    "dataset's samples are {{\"video\" or \"image\": PATH, \"caption\": TEXT}}",
                    file.path));
  data::DatasetSpec spec;
  spec.path = file.path;
  spec.root = file.root;
  spec.weight = file.weight;
  return spec;
}

// An image resized (Pillow's bicubic) until both sides cover size x size, then centre-cropped.
data::Image cover_and_crop(const data::Image& image, int size) {
  const double scale =
      std::max(static_cast<double>(size) / image.height, static_cast<double>(size) / image.width);
  const int height = std::max(size, static_cast<int>(std::lround(image.height * scale)));
  const int width = std::max(size, static_cast<int>(std::lround(image.width * scale)));
  const data::Image scaled =
      height == image.height && width == image.width ? image : data::resize_bicubic(image, height, width);
  data::Image out{size, size, std::vector<uint8_t>(static_cast<size_t>(size) * size * 3)};
  const int top = (height - size) / 2, left = (width - size) / 2;
  for (int y = 0; y < size; ++y)
    std::copy_n(scaled.rgb.begin() + (static_cast<size_t>(top + y) * width + left) * 3,
                static_cast<size_t>(size) * 3, out.rgb.begin() + static_cast<size_t>(y) * size * 3);
  return out;
}

}  // namespace

data::WordTokenizer moving_fashion_tokenizer() {
  std::vector<std::string> words = {"a", "moving"};
  for (const std::string& name : data::FashionVqa::class_names())
    for (size_t begin = 0; begin < name.size();) {
      const size_t end = std::min(name.find(' ', begin), name.size());
      words.push_back(name.substr(begin, end - begin));
      begin = end + 1;
    }
  for (const std::string& direction : data::MovingFashion::directions()) words.push_back(direction);
  std::vector<std::string> unique;
  std::set<std::string> seen;
  for (const std::string& w : words)
    if (seen.insert(w).second) unique.push_back(w);
  return data::WordTokenizer::from_words(unique);
}

VideoClips::VideoClips(const config::DataSection& data, uint64_t seed)
    : seed_(seed), frames_(data.frames), size_(data.video_size), fps_(data.fps) {
  skips_ = std::make_shared<data::SkipLog>(64, data::warn_once_per_sample(kWarnedSkips));
  if (data.dataset == "moving_fashion") {
    tokenizer_ = std::make_shared<data::WordTokenizer>(moving_fashion_tokenizer());
    set_ = std::make_shared<data::MovingFashion>(
        data.dir.empty() ? data::FashionMnist::kDefaultDir : data.dir, seed, data.video_size, data.frames);
    if (data.eval_samples > eval_size())
      throw ConfigError(
          fmt::format("data.eval_samples: {} is more than the {} held-out clips of moving_fashion",
                      data.eval_samples, eval_size()));
    eval_samples_ = data.eval_samples;
    return;
  }
  if (data.dataset != "videos")
    throw ConfigError(
        fmt::format("data.dataset: '{}' has no video clips (valid for video tasks: moving_fashion, videos)",
                    data.dataset));
  std::vector<int64_t> sizes;
  std::vector<double> weights;
  std::vector<std::string> names;
  for (const auto& file : data.datasets) {
    const data::DatasetSpec spec = spec_of(file);
    files_.push_back(data::read_captioned_media(spec, *skips_));
    sizes.push_back(static_cast<int64_t>(files_.back().size()));
    weights.push_back(spec.weight);
    names.push_back(spec.path);
  }
  mix_ = std::make_unique<data::MixLayout>(sizes, weights, names, seed, "video");
  for (const auto& file : data.eval_datasets) {
    data::SkipLog problems;
    auto samples = data::read_captioned_media(spec_of(file), problems);
    if (!problems.records().empty()) {
      const data::SkipRecord first = problems.records().front();
      throw DataError(fmt::format("held-out sample {} of {} cannot be used: {}", first.sample_index,
                                  first.file, first.reason));
    }
    eval_files_.insert(eval_files_.end(), samples.begin(), samples.end());
  }
  eval_samples_ = std::min<int64_t>(data.eval_samples, eval_size());
  // Skipping a held-out sample would change what the evaluation measures, and finding it at the first
  // evaluation would cost the run up to then: each one the evaluation takes is decoded once now.
  for (int64_t i = 0; i < eval_samples_; ++i) {
    const auto& media = eval_files_[static_cast<size_t>(i)];
    try {
      load(media);
    } catch (const DataError& e) {
      throw DataError(
          fmt::format("held-out sample {} of {} cannot be used: {}", media.index, media.source, e.what()));
    }
  }
  int64_t samples = 0;
  for (const auto& f : files_) samples += static_cast<int64_t>(f.size());
  spdlog::info(
      "data: {} training clips and images in {} files, {} held out; {} samples skipped while reading",
      samples, files_.size(), eval_files_.size(), skips_->counts().total());
}

data::VideoClip VideoClips::load(const data::CaptionedMedia& media) const {
  data::VideoClip clip;
  clip.caption = media.caption;
  clip.height = clip.width = size_;
  const int size = static_cast<int>(size_);
  if (media.image) {
    const data::Image image = cover_and_crop(data::decode_image_file(media.path), size);
    clip.frames = 1;
    clip.rgb = image.rgb;
    return clip;
  }
  data::VideoSampling sampling;
  sampling.frames = static_cast<int>(frames_);
  sampling.fps = fps_;
  sampling.height = sampling.width = size;
  data::Video video = data::decode_video(media.path, sampling);
  clip.frames = video.frames;
  clip.rgb = std::move(video.rgb);
  return clip;
}

std::optional<data::VideoClip> VideoClips::train(int64_t index) const {
  if (set_) {
    const int64_t size = set_->size(data::Split::train);
    const uint64_t epoch = static_cast<uint64_t>(index / size);
    const int64_t at =
        static_cast<int64_t>(permute_index(static_cast<uint64_t>(index % size), static_cast<uint64_t>(size),
                                           counter_start(seed_, kEpochOrderStream, epoch)));
    return set_->sample(data::Split::train, at);
  }
  const data::MixPosition at = mix_->locate(index);
  const data::CaptionedMedia& media = files_[at.dataset][static_cast<size_t>(at.sample)];
  try {
    return load(media);
  } catch (const DataError& e) {
    std::error_code error;
    const bool missing = !std::filesystem::exists(media.path, error);
    const data::SkipKind kind =
        media.image ? (missing ? data::SkipKind::missing_image : data::SkipKind::corrupt_image)
                    : (missing ? data::SkipKind::missing_video : data::SkipKind::corrupt_video);
    skips_->record({kind, media.source, media.index, e.what()});
    return std::nullopt;
  }
}

int64_t VideoClips::train_size() const { return set_ ? set_->size(data::Split::train) : mix_->size(); }

int64_t VideoClips::train_frames(int64_t index) const {
  if (set_) return frames_;
  const data::MixPosition at = mix_->locate(index);
  return files_[at.dataset][static_cast<size_t>(at.sample)].image ? 1 : frames_;
}

int64_t VideoClips::eval_size() const {
  return set_ ? set_->size(data::Split::eval) : static_cast<int64_t>(eval_files_.size());
}

data::VideoClip VideoClips::eval(int64_t index) const {
  if (set_) return set_->sample(data::Split::eval, index);
  return load(eval_files_.at(static_cast<size_t>(index)));
}

int64_t VideoClips::eval_frames(int64_t index) const {
  if (set_) return frames_;
  return eval_files_.at(static_cast<size_t>(index)).image ? 1 : frames_;
}

std::string VideoClips::eval_caption(int64_t index) const {
  if (set_) return set_->sample(data::Split::eval, index).caption;
  return eval_files_.at(static_cast<size_t>(index)).caption;
}

std::vector<std::vector<int64_t>> same_shape_batches(int64_t begin, int64_t end, int64_t size,
                                                     const std::function<int64_t(int64_t)>& frames_of) {
  std::vector<int64_t> order;                     // frame counts in the order they first appear
  std::map<int64_t, std::vector<int64_t>> kinds;  // frame count -> its samples
  for (int64_t i = begin; i < end; ++i) {
    auto [it, added] = kinds.try_emplace(frames_of(i));
    if (added) order.push_back(it->first);
    it->second.push_back(i);
  }
  std::vector<std::vector<int64_t>> out;
  for (int64_t frames : order) {
    const auto& samples = kinds[frames];
    for (size_t at = 0; at < samples.size(); at += static_cast<size_t>(size))
      out.emplace_back(samples.begin() + static_cast<std::ptrdiff_t>(at),
                       samples.begin() + static_cast<std::ptrdiff_t>(
                                             std::min(samples.size(), at + static_cast<size_t>(size))));
  }
  return out;
}

at::Tensor video_tensor(const data::VideoClip& clip) {
  const at::Tensor bytes = at::from_blob(const_cast<uint8_t*>(clip.rgb.data()),
                                         {clip.frames, clip.height, clip.width, 3}, at::kByte);
  return bytes.permute({3, 0, 1, 2}).to(at::kFloat).div(127.5).sub(1.0).contiguous();  // [3, T, H, W]
}

std::vector<uint8_t> video_bytes(const at::Tensor& video) {
  if (video.dim() != 4 || video.size(0) != 3)
    throw ModelError(fmt::format("a video must be [3, T, H, W], got [{}]", fmt::join(video.sizes(), ", ")));
  const at::Tensor bytes = video.detach()
                               .to(at::kFloat)
                               .clamp(-1.0, 1.0)
                               .add(1.0)
                               .div(2.0)
                               .mul(255.0)
                               .to(at::kByte)  // truncates, as the reference pipeline does
                               .permute({1, 2, 3, 0})
                               .contiguous();
  return std::vector<uint8_t>(bytes.data_ptr<uint8_t>(), bytes.data_ptr<uint8_t>() + bytes.numel());
}

void write_clip(const at::Tensor& video, const std::string& dir, const std::string& name, double fps) {
  data::Video clip;
  clip.frames = static_cast<int>(video.size(1));
  clip.height = static_cast<int>(video.size(2));
  clip.width = static_cast<int>(video.size(3));
  clip.fps = fps;
  clip.rgb = video_bytes(video);
  const std::filesystem::path frames = std::filesystem::path(dir) / name;
  std::error_code error;
  std::filesystem::create_directories(frames, error);
  if (error) throw DataError(fmt::format("cannot create {}: {}", frames.string(), error.message()));
  for (int t = 0; t < clip.frames; ++t)
    data::encode_png_file(clip.frame_image(t), (frames / fmt::format("frame-{:04d}.png", t)).string());
  data::write_gif(clip, (std::filesystem::path(dir) / (name + ".gif")).string());
  data::write_mp4(clip, (std::filesystem::path(dir) / (name + ".mp4")).string());
}

std::string write_eval_clips(const std::string& output_dir, int64_t step, int64_t count,
                             const core::Layout& layout,
                             const std::function<nlohmann::json(int64_t)>& describe,
                             const std::function<at::Tensor(int64_t)>& make, double fps) {
  const std::string dir = (std::filesystem::path(output_dir) / "samples" /
                           (step >= 0 ? checkpoint::checkpoint_name(step) : std::string("eval")))
                              .string();
  const int64_t ranks = layout.data() ? layout.data()->size() : 1, rank = layout.data_rank();
  const bool writer = !layout.tp() || layout.tp()->rank() == 0;
  nlohmann::json index = nlohmann::json::array();
  for (int64_t i = 0; i < count; ++i) {
    const std::string name = fmt::format("sample-{:03d}", i);
    nlohmann::json entry = describe(i);
    entry["name"] = name;
    index.push_back(std::move(entry));
    if (i % ranks != rank) continue;
    const at::Tensor clip = make(i);
    if (writer) write_clip(clip, dir, name, fps);
  }
  if (layout.is_main()) checkpoint::write_text_file_durable(dir + "/captions.json", index.dump(2) + "\n");
  return dir;
}

}  // namespace loom::tasks
