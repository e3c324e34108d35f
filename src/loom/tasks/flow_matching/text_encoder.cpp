#include "loom/tasks/flow_matching/text_encoder.h"

#include <fmt/format.h>

#include <filesystem>

#include "loom/models/registry.h"
#include "loom/models/weights.h"
#include "loom/util/errors.h"

namespace loom::tasks::flow_matching {

namespace fs = std::filesystem;

CaptionEncoder::CaptionEncoder(const config::ModelSection& m, uint64_t seed,
                               std::shared_ptr<const data::Tokenizer> builtin, int64_t text_len)
    : text_len_(text_len) {
  if (m.text_encoder_path.empty() && !builtin)
    throw ConfigError(
        "model.text_encoder: an inline config (weights drawn from the seed) needs a built-in dataset's "
        "captions to tokenize; give a text encoder's model directory with its tokenizer");
  model_ = models::as_interface<models::TextEncoder>(
      models::load_frozen_model(models::ModelKind::text_encoder, "model.text_encoder", m.text_encoder_path,
                                m.text_encoder, models::derive_seed(seed, "text_encoder")),
      "model.text_encoder");
  if (!m.text_encoder_path.empty()) {
    const std::string& dir = m.text_encoder_path;
    for (const char* name : {"spiece.model", "tokenizer.json"})
      if (fs::is_regular_file(fs::path(dir) / name)) {
        tokenizer_ = data::load_tokenizer((fs::path(dir) / name).string());
        break;
      }
    if (!tokenizer_)
      throw ConfigError(fmt::format(
          "model.text_encoder: '{}' holds no spiece.model or tokenizer.json beside the weights", dir));
  } else {
    tokenizer_ = std::move(builtin);
  }
  if (tokenizer_->vocab_size() > model_->vocab_size())
    throw ConfigError(
        fmt::format("model.text_encoder: its vocab_size {} is smaller than the tokenizer's {} ids",
                    model_->vocab_size(), tokenizer_->vocab_size()));
}

std::vector<int64_t> CaptionEncoder::token_ids(const std::string& caption) const {
  std::vector<int64_t> ids = tokenizer_->encode(caption);
  if (static_cast<int64_t>(ids.size()) > text_len_ - 1) ids.resize(static_cast<size_t>(text_len_ - 1));
  ids.push_back(model_->eos_token_id());
  return ids;
}

void CaptionEncoder::to(const at::Device& device) {
  model_->module().to(device);
  device_ = device;
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [caption, features] : cache_) features = features.to(device);
}

std::vector<at::Tensor> CaptionEncoder::encode(const std::vector<std::string>& captions) const {
  std::vector<at::Tensor> out;
  for (const std::string& caption : captions) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (auto it = cache_.find(caption); it != cache_.end()) {
        out.push_back(it->second);
        continue;
      }
    }
    const std::vector<int64_t> ids = token_ids(caption);
    const at::Tensor input = at::tensor(ids, at::kLong).unsqueeze(0).to(device_);
    at::Tensor features;
    {
      at::NoGradGuard no_grad;
      features = model_->encode(input, at::ones_like(input))[0].to(at::kFloat).contiguous();  // [L, width]
    }
    std::lock_guard<std::mutex> lock(mutex_);
    const auto [it, added] = cache_.emplace(caption, features);
    out.push_back(it->second);
    if (!added) continue;
    cached_order_.push_back(caption);
    if (cached_order_.size() > kCachedCaptions) {
      cache_.erase(cached_order_.front());
      cached_order_.pop_front();
    }
  }
  return out;
}

}  // namespace loom::tasks::flow_matching
