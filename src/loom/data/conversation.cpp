// Reading conversation dataset files, checking each sample, recording skips, and the weighted mix.
#include "loom/data/conversation.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>

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

std::string read_whole_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(fmt::format("cannot open conversation dataset {}", path));
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// 1-based line and column of the character at 0-based offset `at` in text.
std::pair<int64_t, int64_t> line_and_column(const std::string& text, size_t at) {
  at = std::min(at, text.size());
  const int64_t line = 1 + std::count(text.begin(), text.begin() + at, '\n');
  const size_t newline = at == 0 ? std::string::npos : text.rfind('\n', at - 1);
  const int64_t column = static_cast<int64_t>(newline == std::string::npos ? at + 1 : at - newline);
  return {line, column};
}

// nlohmann's parse_error::byte counts the characters read, the offending one included.
size_t error_offset(const json::parse_error& e) { return e.byte == 0 ? 0 : e.byte - 1; }

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

uint64_t derive_key(uint64_t seed, uint64_t a, uint64_t b, uint64_t c) {
  return splitmix64(splitmix64(splitmix64(splitmix64(seed) ^ a) ^ b) ^ c);
}

constexpr uint64_t kEpochOrderTag = 0x6d69782d6f726465ULL;    // positions of a mix epoch
constexpr uint64_t kDatasetOrderTag = 0x646174612d6f7264ULL;  // a dataset's samples in one pass

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
  }
  return "?";
}

std::string SkipRecord::message() const {
  return fmt::format("skipped sample {} of {} ({}): {}", sample_index, file, skip_kind_name(kind), reason);
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
  const std::string text = read_whole_file(spec.path);
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
  const size_t first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) return out;
  if (text[first] == '[') {
    json root_value;
    try {
      root_value = json::parse(text);
    } catch (const json::parse_error& e) {
      const auto [line, column] = line_and_column(text, error_offset(e));
      throw DataError(fmt::format("conversation dataset {}: malformed JSON at line {}, column {}: {}",
                                  spec.path, line, column, e.what()));
    }
    for (size_t i = 0; i < root_value.size(); ++i) take(root_value[i], static_cast<int64_t>(i));
    return out;
  }
  // JSON lines: one sample per non-blank line.
  int64_t line_number = 0, index = 0;
  size_t begin = 0;
  while (begin <= text.size()) {
    size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    ++line_number;
    const std::string line = text.substr(begin, end - begin);
    if (line.find_first_not_of(" \t\r") != std::string::npos) {
      json sample;
      try {
        sample = json::parse(line);
      } catch (const json::parse_error& e) {
        throw DataError(fmt::format(
            "conversation dataset {}: malformed JSON at line {}, column {} (sample {}, read as JSON "
            "lines since the file does not start with '['): {}",
            spec.path, line_number, error_offset(e) + 1, index, e.what()));
      }
      take(sample, index++);
    }
    begin = end + 1;
  }
  return out;
}

ConversationMix::ConversationMix(const std::vector<DatasetSpec>& specs, uint64_t seed, SkipLog& skips)
    : seed_(seed) {
  std::vector<std::string> names;
  for (const DatasetSpec& spec : specs) {
    if (!std::isfinite(spec.weight) || spec.weight <= 0) {
      throw ConfigError(fmt::format("conversation dataset {}: weight {} must be a positive number", spec.path,
                                    spec.weight));
    }
    datasets_.push_back(read_conversations(spec, skips));
    weights_.push_back(spec.weight);
    names.push_back(spec.path);
  }
  check_and_lay_out(names);
}

ConversationMix::ConversationMix(std::vector<std::vector<Conversation>> datasets, std::vector<double> weights,
                                 uint64_t seed)
    : datasets_(std::move(datasets)), weights_(std::move(weights)), seed_(seed) {
  if (weights_.size() != datasets_.size()) {
    throw ConfigError(fmt::format("conversation mix: {} datasets but {} weights; give one weight per dataset",
                                  datasets_.size(), weights_.size()));
  }
  std::vector<std::string> names;
  for (size_t d = 0; d < datasets_.size(); ++d) {
    names.push_back(fmt::format("dataset {}", d));
    if (!std::isfinite(weights_[d]) || weights_[d] <= 0) {
      throw ConfigError(
          fmt::format("conversation mix: weight {} of dataset {} must be a positive number", weights_[d], d));
    }
  }
  check_and_lay_out(names);
}

void ConversationMix::check_and_lay_out(const std::vector<std::string>& names) {
  if (datasets_.empty()) throw DataError("conversation mix: no datasets given; list at least one");
  epoch_size_ = 0;
  for (size_t d = 0; d < datasets_.size(); ++d) {
    if (datasets_[d].empty()) {
      throw DataError(fmt::format("conversation dataset {} has no usable samples", names[d]));
    }
    epoch_size_ += static_cast<int64_t>(datasets_[d].size());
  }
  // Largest remainder: floor of each exact share, the rest to the largest fractions.
  const double total_weight = std::accumulate(weights_.begin(), weights_.end(), 0.0);
  std::vector<double> fractions(datasets_.size());
  quotas_.assign(datasets_.size(), 0);
  int64_t assigned = 0;
  for (size_t d = 0; d < datasets_.size(); ++d) {
    const double share = static_cast<double>(epoch_size_) * weights_[d] / total_weight;
    quotas_[d] = static_cast<int64_t>(std::floor(share));
    fractions[d] = share - std::floor(share);
    assigned += quotas_[d];
  }
  std::vector<size_t> order(datasets_.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return fractions[a] > fractions[b]; });
  for (size_t i = 0; assigned < epoch_size_; i = (i + 1) % order.size(), ++assigned) ++quotas_[order[i]];
  starts_.assign(datasets_.size(), 0);
  for (size_t d = 1; d < datasets_.size(); ++d) starts_[d] = starts_[d - 1] + quotas_[d - 1];
}

int64_t ConversationMix::dataset_size(size_t dataset) const {
  if (dataset >= datasets_.size()) {
    throw DataError(
        fmt::format("conversation mix: dataset {} does not exist; there are {}", dataset, datasets_.size()));
  }
  return static_cast<int64_t>(datasets_[dataset].size());
}

int64_t ConversationMix::quota(size_t dataset) const {
  dataset_size(dataset);  // bounds check
  return quotas_[dataset];
}

MixPosition ConversationMix::locate(int64_t index) const {
  if (index < 0) throw DataError(fmt::format("conversation mix: sample index {} is negative", index));
  MixPosition at;
  at.epoch = index / epoch_size_;
  const uint64_t slot = permute_index(static_cast<uint64_t>(index % epoch_size_), epoch_size_,
                                      derive_key(seed_, kEpochOrderTag, at.epoch, 0));
  // The last dataset whose block starts at or before the slot (datasets with quota 0 own no slot).
  at.dataset = static_cast<size_t>(
      std::upper_bound(starts_.begin(), starts_.end(), static_cast<int64_t>(slot)) - starts_.begin() - 1);
  const int64_t draw = at.epoch * quotas_[at.dataset] + (static_cast<int64_t>(slot) - starts_[at.dataset]);
  const int64_t n = static_cast<int64_t>(datasets_[at.dataset].size());
  const int64_t pass = draw / n;
  at.sample = static_cast<int64_t>(permute_index(static_cast<uint64_t>(draw % n), n,
                                                 derive_key(seed_, kDatasetOrderTag, at.dataset, pass)));
  return at;
}

const Conversation& ConversationMix::sample(int64_t index) const {
  const MixPosition at = locate(index);
  return datasets_[at.dataset][at.sample];
}

}  // namespace loom::data
