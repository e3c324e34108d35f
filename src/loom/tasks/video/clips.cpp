#include "loom/tasks/video/clips.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "loom/data/fashion_vqa.h"
#include "loom/util/errors.h"
#include "loom/util/random.h"

namespace loom::tasks {

namespace {

constexpr uint64_t kEpochOrderStream = 21;

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
    : seed_(seed), frames_(data.frames), size_(data.video_size), tokenizer_(moving_fashion_tokenizer()) {
  if (data.dataset != "moving_fashion")
    throw ConfigError(fmt::format(
        "data.dataset: '{}' has no video clips (valid for video tasks: moving_fashion)", data.dataset));
  set_ = std::make_shared<data::MovingFashion>(data.dir.empty() ? data::FashionMnist::kDefaultDir : data.dir,
                                               seed, data.video_size, data.frames);
  if (data.eval_samples > eval_size())
    throw ConfigError(
        fmt::format("data.eval_samples: {} is more than the {} held-out clips of moving_fashion",
                    data.eval_samples, eval_size()));
}

data::VideoClip VideoClips::train(int64_t index) const {
  const int64_t size = set_->size(data::Split::train);
  const uint64_t epoch = static_cast<uint64_t>(index / size);
  const int64_t at =
      static_cast<int64_t>(permute_index(static_cast<uint64_t>(index % size), static_cast<uint64_t>(size),
                                         counter_start(seed_, kEpochOrderStream, epoch)));
  return set_->sample(data::Split::train, at);
}

int64_t VideoClips::eval_size() const { return set_->size(data::Split::eval); }

data::VideoClip VideoClips::eval(int64_t index) const { return set_->sample(data::Split::eval, index); }

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
                               .to(at::kByte)  // truncates, as Wan's pipeline does
                               .permute({1, 2, 3, 0})
                               .contiguous();
  return std::vector<uint8_t>(bytes.data_ptr<uint8_t>(), bytes.data_ptr<uint8_t>() + bytes.numel());
}

}  // namespace loom::tasks
