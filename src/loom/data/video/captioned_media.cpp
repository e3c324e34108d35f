#include "loom/data/video/captioned_media.h"

#include <fmt/format.h>

#include <filesystem>

#include "loom/data/json_samples.h"

namespace loom::data {

using json = nlohmann::ordered_json;

std::string captioned_media_problem(const json& sample) {
  if (!sample.is_object()) return fmt::format("a sample must be an object, got {}", sample.type_name());
  const bool video = sample.contains("video"), image = sample.contains("image");
  if (video == image)
    return video ? "it has both \"video\" and \"image\"; give one" : "it has neither \"video\" nor \"image\"";
  const json& path = sample[video ? "video" : "image"];
  if (!path.is_string() || path.get_ref<const std::string&>().empty())
    return fmt::format("\"{}\" must be a non-empty path, got {}", video ? "video" : "image",
                       path.is_string() ? "an empty string" : path.type_name());
  const auto caption = sample.find("caption");
  if (caption == sample.end()) return "it has no \"caption\"";
  if (!caption->is_string()) return fmt::format("\"caption\" must be a string, got {}", caption->type_name());
  return "";
}

std::vector<CaptionedMedia> read_captioned_media(const DatasetSpec& spec, SkipLog& skips) {
  namespace fs = std::filesystem;
  const fs::path root = spec.root.empty() ? fs::path(spec.path).parent_path() : fs::path(spec.root);
  std::vector<CaptionedMedia> out;
  for_each_json_sample(spec.path, "video", [&](const json& sample, int64_t index) {
    if (std::string problem = captioned_media_problem(sample); !problem.empty()) {
      skips.record({SkipKind::bad_sample, spec.path, index, std::move(problem)});
      return;
    }
    CaptionedMedia media;
    media.image = sample.contains("image");
    media.path = (root / sample[media.image ? "image" : "video"].get<std::string>()).string();
    media.caption = sample["caption"].get<std::string>();
    media.source = spec.path;
    media.index = index;
    out.push_back(std::move(media));
  });
  return out;
}

}  // namespace loom::data
