// The user's captioned videos and images for the video tasks (dataset: videos): JSON or JSON lines of
// {"video": PATH, "caption": TEXT} or {"image": PATH, "caption": TEXT}, paths relative to the file's
// root, as MindSpeed MM's video datasets list them.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "loom/data/conversation.h"

namespace loom::data {

struct CaptionedMedia {
  std::string path;    // resolved against the dataset file's root
  bool image = false;  // a still image, trained as a one-frame clip
  std::string caption;
  std::string source;  // the dataset file
  int64_t index = -1;  // 0-based position of the sample in it
};

// Why a sample object is no captioned video or image ("" when it is one): not an object, neither or
// both of "video" and "image", a path that is not a non-empty string, a "caption" that is missing or
// not a string. Other keys are left alone.
std::string captioned_media_problem(const nlohmann::json& sample);

// Reads one dataset file (spec.fields is not used): the usable samples in file order, each unusable
// one recorded in skips as a bad sample naming the problem. DataError naming the file for one that
// cannot be read or is malformed JSON.
std::vector<CaptionedMedia> read_captioned_media(const DatasetSpec& spec, SkipLog& skips);

}  // namespace loom::data
