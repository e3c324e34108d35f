// Reading conversation dataset files, checking each sample, recording skips, and the weighted mix.
#include "loom/data/conversation.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <set>
#include <sstream>
#include <utility>

#include "loom/data/json_samples.h"
#include "loom/util/errors.h"
#include "loom/util/random.h"

namespace loom::data {
namespace {

using nlohmann::json;

const char* role_name(Role role) {
  switch (role) {
    case Role::system:
      return "system";
    case Role::user:
      return "user";
    case Role::assistant:
      return "assistant";
  }
  return "?";
}

std::string with_article(Role role) {
  return fmt::format("{} {}", role == Role::assistant ? "an" : "a", role_name(role));
}

// Parses one sample object into a Conversation, or returns the reason it is unusable. Throws
// DataError for a sample with videos.
std::string parse_sample(const json& sample, const DatasetSpec& spec, const std::filesystem::path& root,
                         int64_t index, Conversation& out) {
  const FieldNames& f = spec.fields;
  if (!sample.is_object()) return fmt::format("a sample must be a JSON object, got {}", sample.type_name());
  if (auto videos = sample.find(f.videos);
      videos != sample.end() && !videos->is_null() && !(videos->is_array() && videos->empty())) {
    throw DataError(
        fmt::format("conversation dataset {} sample {} has \"{}\": video samples are not supported in this "
                    "version of Loom; "
                    "remove the sample or its videos",
                    spec.path, index, f.videos));
  }
  out.source = spec.path;
  out.index = index;
  const auto messages = sample.find(f.messages);
  if (messages == sample.end() || messages->is_null()) return fmt::format("no \"{}\" field", f.messages);
  if (!messages->is_array())
    return fmt::format("\"{}\" must be a list, got {}", f.messages, messages->type_name());
  if (messages->empty()) return fmt::format("\"{}\" is empty", f.messages);
  for (size_t m = 0; m < messages->size(); ++m) {
    const json& message = (*messages)[m];
    if (!message.is_object()) return fmt::format("message {} is not a JSON object", m);
    const auto role = message.find(f.role);
    if (role == message.end() || !role->is_string()) {
      return fmt::format("message {} has no string \"{}\"", m, f.role);
    }
    const auto content = message.find(f.content);
    if (content == message.end() || !content->is_string()) {
      return fmt::format("message {} has no string \"{}\"", m, f.content);
    }
    Message parsed;
    const std::string& name = role->get_ref<const std::string&>();
    if (name == f.user) {
      parsed.role = Role::user;
    } else if (name == f.assistant) {
      parsed.role = Role::assistant;
    } else if (name == f.system) {
      parsed.role = Role::system;
    } else {
      return fmt::format("message {} has unknown role \"{}\"; valid roles are \"{}\", \"{}\" and \"{}\"", m,
                         name, f.system, f.user, f.assistant);
    }
    parsed.content = content->get<std::string>();
    out.messages.push_back(std::move(parsed));
  }
  if (auto images = sample.find(f.images); images != sample.end() && !images->is_null()) {
    if (!images->is_array()) return fmt::format("\"{}\" must be a list of paths", f.images);
    for (const json& image : *images) {
      if (!image.is_string() || image.get_ref<const std::string&>().empty()) {
        return fmt::format("\"{}\" must be a list of non-empty paths", f.images);
      }
      out.images.push_back((root / image.get<std::string>()).string());
    }
  }
  return conversation_problem(out);
}

}  // namespace

int64_t count_image_placeholders(const std::string& text) {
  int64_t count = 0;
  const std::string placeholder = kImagePlaceholder;
  for (size_t at = text.find(placeholder); at != std::string::npos;
       at = text.find(placeholder, at + placeholder.size()))
    ++count;
  return count;
}

std::string chat_problem(const std::vector<Message>& messages) {
  if (messages.empty()) return "the conversation has no messages";
  const size_t first = messages[0].role == Role::system ? 1 : 0;
  if (first == messages.size()) return "the conversation has a system message but no user message";
  for (size_t m = 0; m < messages.size(); ++m) {
    const Message& message = messages[m];
    if (m >= first) {
      const Role expected = (m - first) % 2 == 0 ? Role::user : Role::assistant;
      if (message.role != expected) {
        return fmt::format(
            "message {} is {} message where {} message must come (after an optional first system message, "
            "user and assistant messages alternate, starting with user)",
            m, with_article(message.role), with_article(expected));
      }
    }
    if (message.role != Role::user && count_image_placeholders(message.content) > 0) {
      return fmt::format("message {} ({}) has an {} placeholder; images belong in user messages", m,
                         role_name(message.role), kImagePlaceholder);
    }
    for (const char* token : {"<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"}) {
      if (message.content.find(token) != std::string::npos) {
        return fmt::format("message {} contains the literal token {}; write {} for an image", m, token,
                           kImagePlaceholder);
      }
    }
  }
  return "";
}

std::string conversation_problem(const Conversation& conversation) {
  const std::vector<Message>& messages = conversation.messages;
  if (std::string problem = chat_problem(messages); !problem.empty()) return problem;
  if (messages.back().role != Role::assistant) {
    return "the conversation must end with an assistant message";
  }
  int64_t placeholders = 0;
  for (const Message& message : messages) placeholders += count_image_placeholders(message.content);
  if (placeholders != static_cast<int64_t>(conversation.images.size())) {
    return fmt::format("{} {} placeholders but {} images; each image needs exactly one placeholder",
                       placeholders, kImagePlaceholder, conversation.images.size());
  }
  return "";
}

const char* skip_kind_name(SkipKind kind) {
  switch (kind) {
    case SkipKind::missing_image:
      return "missing image";
    case SkipKind::corrupt_image:
      return "corrupt image";
    case SkipKind::bad_sample:
      return "bad sample";
    case SkipKind::missing_video:
      return "missing video";
    case SkipKind::corrupt_video:
      return "corrupt video";
  }
  return "?";
}

std::string SkipRecord::message() const {
  return fmt::format("skipped sample {} of {} ({}): {}", sample_index, file, skip_kind_name(kind), reason);
}

std::function<void(const SkipRecord&)> warn_once_per_sample(size_t named) {
  return [named,
          seen = std::make_shared<std::set<std::pair<std::string, int64_t>>>()](const SkipRecord& record) {
    if (seen->size() > named || !seen->insert({record.file, record.sample_index}).second) return;
    if (seen->size() <= named)
      spdlog::warn("{}", record.message());
    else
      spdlog::warn("further skipped samples are counted, not named");
  };
}

SkipLog::SkipLog(size_t max_records, std::function<void(const SkipRecord&)> on_skip)
    : max_records_(max_records), on_skip_(std::move(on_skip)) {}

void SkipLog::record(SkipRecord record) {
  std::lock_guard<std::mutex> lock(mutex_);
  switch (record.kind) {
    case SkipKind::missing_image:
      ++counts_.missing_image;
      break;
    case SkipKind::corrupt_image:
      ++counts_.corrupt_image;
      break;
    case SkipKind::bad_sample:
      ++counts_.bad_sample;
      break;
    case SkipKind::missing_video:
      ++counts_.missing_video;
      break;
    case SkipKind::corrupt_video:
      ++counts_.corrupt_video;
      break;
  }
  if (on_skip_) on_skip_(record);
  if (records_.size() < max_records_) records_.push_back(std::move(record));
}

SkipCounts SkipLog::counts() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return counts_;
}

std::vector<SkipRecord> SkipLog::records() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return records_;
}

std::vector<Conversation> read_conversations(const DatasetSpec& spec, SkipLog& skips) {
  const std::filesystem::path root =
      spec.root.empty() ? std::filesystem::path(spec.path).parent_path() : std::filesystem::path(spec.root);
  std::vector<Conversation> out;
  auto take = [&](const json& sample, int64_t index) {
    Conversation conversation;
    std::string problem = parse_sample(sample, spec, root, index, conversation);
    if (problem.empty()) {
      out.push_back(std::move(conversation));
    } else {
      skips.record({SkipKind::bad_sample, spec.path, index, std::move(problem)});
    }
  };
  for_each_json_sample(spec.path, "conversation", take);
  return out;
}

namespace {

std::vector<int64_t> sizes_of(const std::vector<std::vector<Conversation>>& datasets) {
  std::vector<int64_t> sizes;
  for (const auto& d : datasets) sizes.push_back(static_cast<int64_t>(d.size()));
  return sizes;
}

std::vector<std::vector<Conversation>> read_all(const std::vector<DatasetSpec>& specs, SkipLog& skips) {
  std::vector<std::vector<Conversation>> out;
  for (const DatasetSpec& spec : specs) {
    if (!std::isfinite(spec.weight) || spec.weight <= 0)
      throw ConfigError(fmt::format("conversation dataset {}: weight {} must be a positive number", spec.path,
                                    spec.weight));
    out.push_back(read_conversations(spec, skips));
  }
  return out;
}

std::vector<double> weights_of(const std::vector<DatasetSpec>& specs) {
  std::vector<double> weights;
  for (const DatasetSpec& spec : specs) weights.push_back(spec.weight);
  return weights;
}

std::vector<std::string> paths_of(const std::vector<DatasetSpec>& specs) {
  std::vector<std::string> names;
  for (const DatasetSpec& spec : specs) names.push_back(spec.path);
  return names;
}

std::vector<std::string> numbered(size_t count) {
  std::vector<std::string> names;
  for (size_t d = 0; d < count; ++d) names.push_back(fmt::format("dataset {}", d));
  return names;
}

}  // namespace

ConversationMix::ConversationMix(const std::vector<DatasetSpec>& specs, uint64_t seed, SkipLog& skips)
    : datasets_(read_all(specs, skips)),
      layout_(sizes_of(datasets_), weights_of(specs), paths_of(specs), seed, "conversation") {}

ConversationMix::ConversationMix(std::vector<std::vector<Conversation>> datasets, std::vector<double> weights,
                                 uint64_t seed)
    : datasets_(std::move(datasets)),
      layout_(sizes_of(datasets_), std::move(weights), numbered(datasets_.size()), seed, "conversation") {}

const Conversation& ConversationMix::sample(int64_t index) const {
  const MixPosition at = locate(index);
  return datasets_[at.dataset][static_cast<size_t>(at.sample)];
}

}  // namespace loom::data
