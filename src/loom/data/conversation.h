// Conversation datasets as MindSpeed MM / LLaMA-Factory users write them (JSON array or JSONL of
// {"messages": [...], "images": [...]}), the record of samples skipped as unusable, and a seeded,
// weighted mix of several datasets with random access.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "loom/data/mix.h"

namespace loom::data {

// The keys and role names a dataset file uses. ShareGPT-style files, for example, are read with
// messages="conversations", role="from", content="value", user="human", assistant="gpt".
struct FieldNames {
  std::string messages = "messages";
  std::string images = "images";
  std::string videos = "videos";
  std::string role = "role";
  std::string content = "content";
  std::string user = "user";
  std::string assistant = "assistant";
  std::string system = "system";
};

// One dataset file. Image paths in it are relative to root; an empty root means the directory the
// file is in. Absolute image paths are used as they are.
struct DatasetSpec {
  std::string path, root;
  double weight = 1.0;  // share of the mixed stream, relative to the other datasets' weights
  FieldNames fields;
};

enum class Role { system, user, assistant };

struct Message {
  Role role = Role::user;
  std::string content;  // text; each "<image>" in a user message stands for the next image
};

struct Conversation {
  std::vector<Message> messages;
  std::vector<std::string> images;  // resolved paths, in the order of the "<image>" placeholders
  std::string source;               // the dataset file, for messages
  int64_t index = -1;               // 0-based position of the sample in that file
};

constexpr const char* kImagePlaceholder = "<image>";

int64_t count_image_placeholders(const std::string& text);

// Why messages do not form a chat, or "" when they do: an optional system message first, then user
// and assistant messages alternating, starting with a user message; "<image>" placeholders only in
// user messages; no literal vision tokens (<|vision_start|>, <|vision_end|>, <|image_pad|>,
// <|video_pad|>) in any content, since they would desynchronise image tokens and image features.
std::string chat_problem(const std::vector<Message>& messages);

// Why the chat template cannot be applied to a training conversation, or "" when it can: a
// chat_problem, a last message that is not an assistant one, or not as many "<image>" placeholders
// as images.
std::string conversation_problem(const Conversation& conversation);

enum class SkipKind { missing_image, corrupt_image, bad_sample, missing_video, corrupt_video };
const char* skip_kind_name(SkipKind kind);  // "missing image", "corrupt image", "bad sample", ...

struct SkipRecord {
  SkipKind kind = SkipKind::bad_sample;
  std::string file;  // the dataset file
  int64_t sample_index = -1;
  std::string reason;
  std::string message() const;  // "skipped sample I of FILE (KIND): REASON"
};

struct SkipCounts {
  int64_t missing_image = 0, corrupt_image = 0, bad_sample = 0, missing_video = 0, corrupt_video = 0;
  int64_t total() const { return missing_image + corrupt_image + bad_sample + missing_video + corrupt_video; }
};

// Counts every skipped sample and keeps the first max_records of them; on_skip, when given, sees
// every one as it is recorded (under the log's lock, so it needs no locking of its own). Safe to
// use from several threads at once.
class SkipLog {
 public:
  explicit SkipLog(size_t max_records = 64, std::function<void(const SkipRecord&)> on_skip = nullptr);
  void record(SkipRecord record);
  SkipCounts counts() const;
  std::vector<SkipRecord> records() const;

 private:
  mutable std::mutex mutex_;
  size_t max_records_;
  std::function<void(const SkipRecord&)> on_skip_;
  SkipCounts counts_;
  std::vector<SkipRecord> records_;
};

// An on_skip for SkipLog that warns with a skipped sample's message, naming each sample once however
// many epochs skip it again and the first `named` samples only; after them it says once that further
// skipped samples are counted, not named. Called under the log's lock.
std::function<void(const SkipRecord&)> warn_once_per_sample(size_t named = 20);

// Reads one dataset file: a JSON array of samples when its first non-blank character is '[', else
// JSON lines (one sample per non-blank line). Returns the usable samples in file order; each
// unusable one (not an object, no messages, an unknown role, a message without string content,
// images not a list of strings, or a conversation_problem) is recorded in skips as a bad sample.
// DataError naming the file and line/column for malformed JSON, and naming the sample for one
// with videos (video samples are not supported in this version).
std::vector<Conversation> read_conversations(const DatasetSpec& spec, SkipLog& skips);

// Several conversation datasets as one stream, laid out as MixLayout says. Immutable after
// construction; sample() and locate() may be called from several threads at once.
class ConversationMix {
 public:
  // Reads every dataset (bad samples go to skips). ConfigError for a weight that is not a positive
  // finite number; DataError for a dataset without any usable sample, or for an empty list.
  ConversationMix(const std::vector<DatasetSpec>& specs, uint64_t seed, SkipLog& skips);
  // From samples already in memory, one weight per dataset; same checks.
  ConversationMix(std::vector<std::vector<Conversation>> datasets, std::vector<double> weights,
                  uint64_t seed);

  int64_t size() const { return layout_.size(); }  // positions in one epoch
  size_t dataset_count() const { return layout_.dataset_count(); }
  int64_t dataset_size(size_t dataset) const { return layout_.dataset_size(dataset); }
  int64_t quota(size_t dataset) const { return layout_.quota(dataset); }

  // Any index >= 0; indices past size() fall in later epochs. DataError for a negative index.
  MixPosition locate(int64_t index) const { return layout_.locate(index); }
  const Conversation& sample(int64_t index) const;

 private:
  std::vector<std::vector<Conversation>> datasets_;
  MixLayout layout_;
};

}  // namespace loom::data
