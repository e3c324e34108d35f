// Reading conversation dataset files, checking each sample, recording skips, and the weighted mix.
#include "loom/data/conversation.h"

#include <fmt/format.h>
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
#include "loom/data/tool_calls.h"
#include "loom/util/errors.h"
#include "loom/util/random.h"

namespace loom::data {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;

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

bool given(const json& sample, const std::string& key) {
  const auto value = sample.find(key);
  return value != sample.end() && !value->is_null() && !(value->is_array() && value->empty()) &&
         !(value->is_string() && value->get_ref<const std::string&>().empty());
}

// A local path as a sample gives it: "file://" dropped; the reason in `problem` for a URL or inline
// data, which Loom does not fetch.
std::string local_path(const std::string& given, std::string& problem) {
  std::string path = given.rfind("file://", 0) == 0 ? given.substr(7) : given;
  for (const char* scheme : {"http://", "https://", "data:"})
    if (path.rfind(scheme, 0) == 0)
      problem = fmt::format("it names {}...; Loom reads local files, not URLs or inline data", scheme);
  return path;
}

// One image or video as a sample names it: a file, or (a video, when `frames` allows) a non-empty
// list of its frames' image files; resolved against root. The reason it cannot be used, or "".
std::string read_source(const json& value, const fs::path& root, bool frames, VideoSource& out) {
  std::string problem;
  if (value.is_string() && !value.get_ref<const std::string&>().empty()) {
    out.file = (root / local_path(value.get<std::string>(), problem)).string();
    return problem;
  }
  if (!frames || !value.is_array() || value.empty())
    return frames ? "a path or a list of frame paths" : "a path";
  for (const json& frame : value) {
    if (!frame.is_string() || frame.get_ref<const std::string&>().empty()) return "a list of frame paths";
    out.frames.push_back((root / local_path(frame.get<std::string>(), problem)).string());
    if (!problem.empty()) return problem;
  }
  return "";
}

// Appends the images or videos under `key` (one of them, or a list) to `out`; the reason they
// cannot be used, or "".
std::string read_sources(const json& sample, const std::string& key, const fs::path& root, bool frames,
                         std::vector<VideoSource>& out) {
  const auto value = sample.find(key);
  if (value == sample.end() || value->is_null()) return "";
  const bool one = value->is_string();
  const json list = one ? json::array({*value}) : json();
  const json& entries = one ? list : *value;
  if (!entries.is_array())
    return fmt::format("\"{}\" must be {} or a list of them, got {}", key, frames ? "a video" : "a path",
                       value->type_name());
  for (const json& entry : entries) {
    VideoSource source;
    if (std::string what = read_source(entry, root, frames, source); !what.empty())
      return fmt::format("\"{}\" must list {}: {}", key,
                         frames ? "videos (each a file or a list of frame files)" : "non-empty paths", what);
    out.push_back(std::move(source));
  }
  return "";
}

// The images and videos content parts bring, and how many parts named none (they take the sample's
// "images" / "videos" in order).
struct PartMedia {
  std::vector<VideoSource> sources;
  int64_t without_path = 0;
};

// The image or video a media part names: its value under `type` (a path, "file:///x.jpg",
// {"url": ...}, or a video's list of frame paths), "url" or "path". False when it names none; the
// reason in `problem` when it cannot be used.
bool part_source(const json& part, const std::string& type, const fs::path& root, bool frames,
                 VideoSource& out, std::string& problem) {
  for (const std::string& key : {type, std::string("url"), std::string("path")}) {
    const auto value = part.find(key);
    if (value == part.end() || value->is_null()) continue;
    const json* given = &*value;
    if (value->is_object()) {
      const auto url = value->find("url");
      if (url == value->end()) continue;
      given = &*url;
    }
    if (std::string what = read_source(*given, root, frames, out); !what.empty())
      problem = what.rfind("it names", 0) == 0 ? what : fmt::format("its \"{}\" is not {}", key, what);
    return true;
  }
  return false;
}

// A message's content: a string as it is, or a content-part list joined into text with a
// placeholder per image or video part. The reason it cannot be used, or "".
std::string read_content(const json& content, size_t m, const FieldNames& f, const DatasetSpec& spec,
                         int64_t index, const fs::path& root, std::string& text, PartMedia& images,
                         PartMedia& videos) {
  if (content.is_string()) {
    text = content.get<std::string>();
    return "";
  }
  if (!content.is_array()) return fmt::format("message {} has no string \"{}\"", m, f.content);
  for (size_t p = 0; p < content.size(); ++p) {
    const json& part = content[p];
    const auto type = part.is_object() ? part.find("type") : part.end();
    if (!part.is_object() || type == part.end() || !type->is_string())
      return fmt::format("message {} content part {} is not an object with a string \"type\"", m, p);
    const std::string& name = type->get_ref<const std::string&>();
    if (name == "text") {
      const auto value = part.find("text");
      if (value == part.end() || !value->is_string())
        return fmt::format("message {} content part {} (text) has no string \"text\"", m, p);
      text += value->get<std::string>();
    } else if (name == "image" || name == "image_url" || name == "video" || name == "video_url") {
      const bool image = name.rfind("image", 0) == 0;
      std::string problem;
      VideoSource source;
      const bool named = part_source(part, name, root, /*frames=*/!image, source, problem);
      if (!problem.empty()) return fmt::format("message {} content part {} ({}): {}", m, p, name, problem);
      PartMedia& media = image ? images : videos;
      if (!named)
        ++media.without_path;
      else
        media.sources.push_back(std::move(source));
      text += image ? kImagePlaceholder : kVideoPlaceholder;
    } else if (name == "audio" || name == "input_audio" || name == "audio_url") {
      throw DataError(
          fmt::format("conversation dataset {} sample {} message {} has an audio part (\"{}\"): Loom's "
                      "models have no audio encoder; remove the sample or the dataset",
                      spec.path, index, m, name));
    } else {
      return fmt::format(
          "message {} content part {} has unknown type \"{}\"; Loom reads text, image, image_url, "
          "video and video_url parts",
          m, p, name);
    }
  }
  return "";
}

// The messages of a messages or sharegpt sample.
std::string read_messages(const json& sample, const DatasetSpec& spec, const fs::path& root, int64_t index,
                          Conversation& out, PartMedia& images, PartMedia& videos) {
  const FieldNames& f = spec.fields;
  const auto messages = sample.find(f.messages);
  if (messages == sample.end() || messages->is_null()) return fmt::format("no \"{}\" field", f.messages);
  if (!messages->is_array())
    return fmt::format("\"{}\" must be a list, got {}", f.messages, messages->type_name());
  if (messages->empty()) return fmt::format("\"{}\" is empty", f.messages);
  // Consecutive tool results become one user turn.
  std::vector<std::string> results;
  auto flush_results = [&] {
    if (!results.empty()) out.messages.push_back({Role::user, tool_responses_text(results)});
    results.clear();
  };
  for (size_t m = 0; m < messages->size(); ++m) {
    const json& message = (*messages)[m];
    if (!message.is_object()) return fmt::format("message {} is not a JSON object", m);
    const auto role = message.find(f.role);
    if (role == message.end() || !role->is_string()) {
      return fmt::format("message {} has no string \"{}\"", m, f.role);
    }
    const std::string& name = role->get_ref<const std::string&>();
    const auto calls = message.find("tool_calls");  // OpenAI's calls beside an assistant's content
    const bool with_calls = name == f.assistant && calls != message.end() && !calls->is_null() &&
                            !(calls->is_array() && calls->empty());
    const auto content = message.find(f.content);
    if (name == f.function) {
      if (content == message.end()) return fmt::format("message {} has no \"{}\"", m, f.content);
      std::string problem;
      Message call{Role::assistant, tool_calls_text(*content, problem)};
      if (!problem.empty()) return fmt::format("message {} (role \"{}\"): {}", m, name, problem);
      flush_results();
      out.messages.push_back(std::move(call));
      continue;
    }
    if (content == message.end() && !with_calls)
      return fmt::format("message {} has no string \"{}\"", m, f.content);
    Message parsed;
    if (name == f.user || name == f.observation) {
      parsed.role = Role::user;
    } else if (name == f.assistant) {
      parsed.role = Role::assistant;
    } else if (name == f.system) {
      parsed.role = Role::system;
    } else {
      return fmt::format(
          "message {} has unknown role \"{}\"; valid roles are \"{}\", \"{}\", \"{}\", \"{}\" (a tool's "
          "result) and \"{}\" (a tool call)",
          m, name, f.system, f.user, f.assistant, f.observation, f.function);
    }
    if (content != message.end() && !(with_calls && content->is_null())) {
      if (std::string problem =
              read_content(*content, m, f, spec, index, root, parsed.content, images, videos);
          !problem.empty())
        return problem;
    }
    if (name == f.observation) {
      results.push_back(std::move(parsed.content));
      continue;
    }
    flush_results();
    if (with_calls) {
      std::string problem;
      const std::string text = tool_calls_text(*calls, problem);
      if (!problem.empty()) return fmt::format("message {} \"tool_calls\": {}", m, problem);
      parsed.content += (parsed.content.empty() ? "" : "\n") + text;
    }
    out.messages.push_back(std::move(parsed));
  }
  flush_results();
  return "";
}

// The messages of an alpaca sample: its history's pairs, then the instruction and input (joined by
// a line break) as the user message and the output as the reply.
std::string read_alpaca(const json& sample, const FieldNames& f, Conversation& out) {
  auto text = [&](const std::string& key, std::string& value) -> std::string {
    const auto found = sample.find(key);
    if (found == sample.end() || found->is_null()) return "";
    if (!found->is_string()) return fmt::format("\"{}\" must be a string, got {}", key, found->type_name());
    value = found->get<std::string>();
    return "";
  };
  if (const auto history = sample.find(f.history); history != sample.end() && !history->is_null()) {
    if (!history->is_array()) return fmt::format("\"{}\" must be a list of [prompt, reply] pairs", f.history);
    for (const json& turn : *history) {
      if (!turn.is_array() || turn.size() != 2 || !turn[0].is_string() || !turn[1].is_string())
        return fmt::format("\"{}\" must be a list of [prompt, reply] pairs of strings", f.history);
      out.messages.push_back({Role::user, turn[0].get<std::string>()});
      out.messages.push_back({Role::assistant, turn[1].get<std::string>()});
    }
  }
  std::string prompt, query, response;
  for (auto [key, value] : {std::pair{&f.prompt, &prompt}, std::pair{&f.query, &query}})
    if (std::string problem = text(*key, *value); !problem.empty()) return problem;
  if (prompt.empty() && query.empty()) return fmt::format("no \"{}\" or \"{}\" text", f.prompt, f.query);
  out.messages.push_back(
      {Role::user, prompt.empty() || query.empty() ? prompt + query : prompt + "\n" + query});
  const auto reply = sample.find(f.response);
  if (reply == sample.end() || !reply->is_string())
    return fmt::format("\"{}\" must be a string (a list of replies is preference data)", f.response);
  out.messages.push_back({Role::assistant, reply->get<std::string>()});
  return "";
}

// The sample's images or videos: from its content parts or its `key` field, not both.
std::string take_media(const json& sample, const std::string& key, const fs::path& root,
                       const PartMedia& parts, bool frames, std::vector<VideoSource>& out) {
  if (std::string problem = read_sources(sample, key, root, frames, out); !problem.empty()) return problem;
  if (parts.sources.empty()) return "";
  if (!out.empty())
    return fmt::format("content parts give paths and so does \"{}\"; give them in one place", key);
  if (parts.without_path > 0)
    return fmt::format(
        "some content parts give a path and {} do not; give every path in its part or all in \"{}\"",
        parts.without_path, key);
  out = parts.sources;
  return "";
}

// Parses one sample object into a Conversation, or returns the reason it is unusable. Throws
// DataError for a sample with audio.
std::string parse_sample(const json& sample, const DatasetSpec& spec, const fs::path& root, int64_t index,
                         Conversation& out) {
  const FieldNames& f = spec.fields;
  if (!sample.is_object()) return fmt::format("a sample must be a JSON object, got {}", sample.type_name());
  if (given(sample, f.audios))
    throw DataError(
        fmt::format("conversation dataset {} sample {} has \"{}\": Loom's models have no audio encoder; "
                    "remove the field or the dataset",
                    spec.path, index, f.audios));
  if (given(sample, f.tools)) {
    std::string problem;
    out.tools = tools_system_text(sample[f.tools], problem);
    if (!problem.empty()) return fmt::format("\"{}\": {}", f.tools, problem);
  }
  out.source = spec.path;
  out.index = index;
  PartMedia images, videos;
  std::string problem = spec.format == DatasetFormat::alpaca
                            ? read_alpaca(sample, f, out)
                            : read_messages(sample, spec, root, index, out, images, videos);
  std::vector<VideoSource> image_sources;
  if (problem.empty()) problem = take_media(sample, f.images, root, images, /*frames=*/false, image_sources);
  if (problem.empty()) problem = take_media(sample, f.videos, root, videos, /*frames=*/true, out.videos);
  if (!problem.empty()) return problem;
  for (VideoSource& image : image_sources) out.images.push_back(std::move(image.file));
  if (const auto system = sample.find(f.system_prompt); system != sample.end() && !system->is_null()) {
    if (!system->is_string())
      return fmt::format("\"{}\" must be a string, got {}", f.system_prompt, system->type_name());
    const std::string& text = system->get_ref<const std::string&>();
    if (!text.empty()) {
      if (out.messages.empty() || out.messages[0].role != Role::system)
        out.messages.insert(out.messages.begin(), Message{Role::system, text});
      else if (out.messages[0].content != text)
        return fmt::format("its system message and its \"{}\" field differ; give one", f.system_prompt);
    }
  }
  return conversation_problem(out);
}

}  // namespace

const char* format_name(DatasetFormat format) {
  switch (format) {
    case DatasetFormat::detect:
      return "detect";
    case DatasetFormat::messages:
      return "messages";
    case DatasetFormat::sharegpt:
      return "sharegpt";
    case DatasetFormat::alpaca:
      return "alpaca";
  }
  return "?";
}

FieldNames field_names(DatasetFormat format) {
  FieldNames f;
  if (format == DatasetFormat::sharegpt) {
    f.messages = "conversations";
    f.role = "from";
    f.content = "value";
    f.user = "human";
    f.assistant = "gpt";
    f.observation = "observation";
    f.function = "function_call";
  }
  return f;
}

void set_field_names(FieldNames& names, const std::map<std::string, std::string>& given,
                     const std::string& source) {
  const std::map<std::string, std::string FieldNames::*> slots = {
      {"messages", &FieldNames::messages}, {"images", &FieldNames::images},
      {"videos", &FieldNames::videos},     {"audios", &FieldNames::audios},
      {"tools", &FieldNames::tools},       {"system_prompt", &FieldNames::system_prompt},
      {"prompt", &FieldNames::prompt},     {"query", &FieldNames::query},
      {"response", &FieldNames::response}, {"history", &FieldNames::history},
      {"role", &FieldNames::role},         {"content", &FieldNames::content},
      {"user", &FieldNames::user},         {"assistant", &FieldNames::assistant},
      {"system", &FieldNames::system},     {"observation", &FieldNames::observation},
      {"function", &FieldNames::function}};
  for (const auto& [field, name] : given) {
    const auto slot = slots.find(field);
    if (slot == slots.end())
      throw ConfigError(fmt::format("{}: unknown field '{}' in fields", source, field));
    names.*(slot->second) = name;
  }
}

std::string DetectedFormat::description() const {
  if (format == DatasetFormat::alpaca)
    return fmt::format("alpaca ({} / {} / {}, {})", fields.prompt, fields.query, fields.response,
                       fields.history);
  return fmt::format("{} ({}: {}/{}, {}/{})", format_name(format), fields.messages, fields.role,
                     fields.content, fields.user, fields.assistant);
}

DetectedFormat detect_format(const json& first, const std::string& path) {
  std::vector<std::string> keys;
  if (first.is_object()) {
    for (const auto& [key, value] : first.items()) keys.push_back(key);
    for (const char* list : {"messages", "conversations"}) {
      const auto messages = first.find(list);
      if (messages == first.end() || !messages->is_array()) continue;
      const json* message = messages->empty() ? nullptr : &(*messages)[0];
      DetectedFormat out;
      if (message && message->is_object() && message->contains("from")) out.format = DatasetFormat::sharegpt;
      out.fields = field_names(out.format);
      out.fields.messages = list;
      return out;
    }
    if (first.contains("instruction") || first.contains("output"))
      return {DatasetFormat::alpaca, field_names(DatasetFormat::alpaca)};
  }
  throw DataError(fmt::format(
      "conversation dataset {}: cannot tell its format from its first sample (keys: {}): a \"messages\" or "
      "\"conversations\" list, or alpaca's \"instruction\" and \"output\", were expected; give the file's "
      "format and fields (docs/config.md, \"Dataset files\")",
      path, keys.empty() ? std::string("none") : fmt::format("{}", fmt::join(keys, ", "))));
}

namespace {

int64_t count_placeholders(const std::string& text, const std::string& placeholder) {
  int64_t count = 0;
  for (size_t at = text.find(placeholder); at != std::string::npos;
       at = text.find(placeholder, at + placeholder.size()))
    ++count;
  return count;
}

}  // namespace

int64_t count_image_placeholders(const std::string& text) {
  return count_placeholders(text, kImagePlaceholder);
}
int64_t count_video_placeholders(const std::string& text) {
  return count_placeholders(text, kVideoPlaceholder);
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
    if (message.role != Role::user && count_video_placeholders(message.content) > 0) {
      return fmt::format("message {} ({}) has a {} placeholder; videos belong in user messages", m,
                         role_name(message.role), kVideoPlaceholder);
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
  int64_t video_placeholders = 0;
  for (const Message& message : messages) video_placeholders += count_video_placeholders(message.content);
  if (video_placeholders != static_cast<int64_t>(conversation.videos.size())) {
    return fmt::format("{} {} placeholders but {} videos; each video needs exactly one placeholder",
                       video_placeholders, kVideoPlaceholder, conversation.videos.size());
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
  DatasetSpec read = spec;  // with the detected format's names, once the first sample is seen
  auto take = [&](const json& sample, int64_t index) {
    if (read.format == DatasetFormat::detect && sample.is_object()) {
      const DetectedFormat detected = detect_format(sample, spec.path);
      read.format = detected.format;
      read.fields = detected.fields;
      spdlog::info("conversation dataset {}: format {} detected", spec.path, detected.description());
    }
    Conversation conversation;
    std::string problem = parse_sample(sample, read, root, index, conversation);
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
