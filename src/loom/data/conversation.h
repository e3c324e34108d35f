// Conversation datasets as MindSpeed MM / LLaMA-Factory / TRL users write them (a JSON array or
// JSON lines; OpenAI-style messages, ShareGPT conversations or Alpaca instructions), the record of
// samples skipped as unusable, and a seeded, weighted mix of several datasets with random access.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "loom/data/mix.h"

namespace loom::data {

// How a file's samples are laid out (LLaMA-Factory's "formatting"):
// - messages: {"messages": [{"role": "user", "content": ...}, ...]}, OpenAI's and TRL's layout
//   (LLaMA-Factory's "openai", and its "sharegpt" with role/content tags);
// - sharegpt: {"conversations": [{"from": "human", "value": ...}, ...]};
// - alpaca: {"instruction": ..., "input": ..., "output": ..., "history": [[q, a], ...]};
// - detect: one of them, told from the file's first sample (detect_format).
enum class DatasetFormat { detect, messages, sharegpt, alpaca };
const char* format_name(DatasetFormat format);  // "messages", "sharegpt", "alpaca", "detect"

// The keys and role names a dataset file uses; defaults depend on the format (field_names).
struct FieldNames {
  // The sample's keys.
  std::string messages = "messages";  // the message list (messages, sharegpt)
  std::string images = "images";      // a path or a list of paths
  std::string videos = "videos";
  std::string audios = "audios";         // an error when given: no model of Loom's hears
  std::string tools = "tools";           // function descriptions (tool_calls.h), a list or its JSON text
  std::string system_prompt = "system";  // the sample's system message, a string beside the messages
  std::string prompt = "instruction", query = "input", response = "output", history = "history";  // alpaca
  // A message's keys.
  std::string role = "role";
  std::string content = "content";  // a string, or a list of content parts
  // Role names. Observation (a tool's result: a user turn of <tool_response>s, consecutive results
  // joined) and function (the assistant's tool call, its content the call's JSON) name the tool
  // turns, written as tool_calls.h says; an assistant message may also carry OpenAI's "tool_calls".
  std::string user = "user";
  std::string assistant = "assistant";
  std::string system = "system";
  std::string observation = "tool";
  std::string function = "function_call";
};

// A format's default names: messages as FieldNames{} (OpenAI's roles, "tool" for a result, and
// LLaMA-Factory's "function_call" for a call); sharegpt with conversations, from, value, human, gpt,
// observation and function_call.
FieldNames field_names(DatasetFormat format);

// Sets the field names `given` maps (by FieldNames' member names: "messages", "system_prompt",
// "user", ...). ConfigError naming `source` and the key for a name FieldNames does not have.
void set_field_names(FieldNames& names, const std::map<std::string, std::string>& given,
                     const std::string& source);

// One dataset file. Image and video paths in it are relative to root; an empty root means the
// directory the file is in. Absolute paths are used as they are.
struct DatasetSpec {
  std::string path, root;
  double weight = 1.0;  // share of the mixed stream, relative to the other datasets' weights
  DatasetFormat format = DatasetFormat::messages;
  FieldNames fields;  // when format is detect, the detected format's names replace these
};

// The format and names of a file whose first sample is `first`: messages or sharegpt when it has a
// "messages" or "conversations" list (told apart by its first message's keys, role/content or
// from/value; the list's key as found), alpaca when it has "instruction" or "output". DataError
// naming `path` and the keys found otherwise.
struct DetectedFormat {
  DatasetFormat format = DatasetFormat::messages;
  FieldNames fields;
  std::string description() const;  // "sharegpt (conversations: from/value, human/gpt)"
};
DetectedFormat detect_format(const nlohmann::ordered_json& first, const std::string& path);

enum class Role { system, user, assistant };

struct Message {
  Role role = Role::user;
  std::string content;  // text; each "<image>" in a user message stands for the next image
};

// A video as a sample names it: a file (decoded through FFmpeg), or its frames as image files.
struct VideoSource {
  std::string file;                 // resolved path; empty for a frame list
  std::vector<std::string> frames;  // resolved paths, in time order
};

struct Conversation {
  std::vector<Message> messages;
  std::vector<std::string> images;  // resolved paths, in the order of the "<image>" placeholders
  std::vector<VideoSource> videos;  // in the order of the "<video>" placeholders
  std::string tools;                // appended to the system message: tools_system_text, or ""
  std::string source;               // the dataset file, for messages
  int64_t index = -1;               // 0-based position of the sample in that file
};

constexpr const char* kImagePlaceholder = "<image>";
constexpr const char* kVideoPlaceholder = "<video>";

int64_t count_image_placeholders(const std::string& text);
int64_t count_video_placeholders(const std::string& text);

// Why messages do not form a chat, or "" when they do: an optional system message first, then user
// and assistant messages alternating, starting with a user message; "<image>" and "<video>"
// placeholders only in user messages; no literal vision tokens (<|vision_start|>, <|vision_end|>,
// <|image_pad|>,
// <|video_pad|>) in any content, since they would desynchronise image tokens and image features.
std::string chat_problem(const std::vector<Message>& messages);

// Why the chat template cannot be applied to a training conversation, or "" when it can: a
// chat_problem, a last message that is not an assistant one, or not as many "<image>" placeholders
// as images (or "<video>" placeholders as videos).
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
// JSON lines (one sample per non-blank line), in spec.format (detected from the first sample, and
// logged, when it is detect). Each sample becomes a Conversation: content-part lists
// ([{"type": "text", "text": ...}, {"type": "image"}, ...]) are joined into text with a placeholder
// per image or video part (a part's own path, when it gives one, is the sample's image or video); a
// single path stands for a list of one; a sample's system_prompt field is its system message.
// Returns the usable samples in file order; each unusable one (not an object, no messages, an
// unknown role or content part, a malformed tool call or tool list, media not paths, or a
// conversation_problem) is recorded in skips as a bad sample. A video is a file or a list of frame files
// (LLaMA-Factory's nested lists). Tool turns and a sample's tools are written as text (tool_calls.h).
// DataError naming the file and line/column for malformed JSON, and naming the sample and field for one with
// audio (no model of Loom's hears).
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
