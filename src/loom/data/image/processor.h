// A vision-language family's image processor, as the data path sees it: an image to the rows its
// vision tower embeds and the block of tokens it takes in the text, with the files and the chat
// template transformers reads beside the model. Each family's spec makes its own (models/registry.h).
#pragma once
#include <ATen/ATen.h>

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "loom/data/image/image.h"

namespace loom::data {

struct VisionInput {
  at::Tensor pixel_values;          // the rows the vision tower embeds, e.g. (24, 1176) float32
  std::array<int64_t, 3> grid_thw;  // the grid those rows form, as the family reads it
  int64_t tokens = 0;               // the image's feature tokens in the text (its block's pads)
  double second_per_grid = 0;       // a video's seconds per temporal patch; 0 for an image
  // A video whose family writes each temporal patch as a block of its own after its time (Qwen3.5):
  // each temporal patch's seconds (its frames' mean); empty otherwise.
  std::vector<double> timestamps;
};

// The tokens an image is written with in the text: `start`, `tokens` times `pad` (the positions its
// features take), `end`. A chat template written for transformers writes an image as
// template_text(), which the family's processor there expands into the block.
struct ImageBlock {
  std::string start, pad, end;
  std::string in_template;  // empty: start, pad and end
  std::string video_pad;    // a video's block is start, its tokens times video_pad, end; empty: no videos
  // A video's temporal patches each their own block, after its time as "<t.t seconds>" (the video's
  // VisionInput::timestamps), rather than one block for the whole video.
  bool video_timestamps = false;

  std::string template_text() const { return in_template.empty() ? start + pad + end : in_template; }
};

// A model directory's image processor settings, as transformers saves them: preprocessor_config.json,
// or transformers 5's processor_config.json (the settings under "image_processor"); `path` is the
// file read. Null settings when the directory has neither. DataError naming the file when it cannot
// be read or is not valid JSON.
struct ImageProcessorSettings {
  nlohmann::json settings;
  std::string path;
};
ImageProcessorSettings read_image_processor_settings(const std::string& dir);

class ImageProcessor {
 public:
  virtual ~ImageProcessor() = default;
  // One decoded image; DataError when it cannot be processed.
  virtual VisionInput process(const Image& image) const = 0;
  // Whether the family's model takes videos, and one video's frames taken `fps` a second; DataError
  // when they cannot be processed or (the default) the family takes no videos.
  virtual bool takes_videos() const { return false; }
  virtual VisionInput process_video(const std::vector<Image>& frames, double fps) const;
  // Bounds on a video frame's pixels (data.video_min_pixels, data.video_max_pixels; 0 keeps the
  // image bounds): ConfigError when the family takes no videos (the default).
  virtual void set_video_pixel_bounds(int64_t min_pixels, int64_t max_pixels);
  virtual const ImageBlock& block() const = 0;
  // Bounds on an image's pixel count (data.min_pixels, data.max_pixels; 0 keeps the processor's
  // own): ConfigError when the family's processor has no such bounds.
  virtual void set_pixel_bounds(int64_t min_pixels, int64_t max_pixels) = 0;
  // The built-in sets' images are side x side squares: each is processed whole, as one unit of the
  // vision tower (each family's processor says how it sizes them).
  virtual void set_square_images(int64_t side) = 0;
  // The multiple an image's sides must be for it to be processed at its own size (1: any size).
  virtual int64_t size_multiple() const = 0;
  // preprocessor_config.json, as the family's processor in transformers reads it.
  virtual nlohmann::ordered_json preprocessor_config() const = 0;
  // video_preprocessor_config.json, as the family's video processor in transformers reads it; null
  // (the default) when the family takes no videos.
  virtual nlohmann::ordered_json video_preprocessor_config() const { return nullptr; }
  // processor_config.json, the processor class transformers' AutoProcessor makes and its own settings
  // (e.g. the image tokens per tile); null when the family's processor needs no such file.
  virtual nlohmann::ordered_json processor_config() const = 0;
  // The tokens transformers' processor looks up on the tokenizer by name, e.g. {"context_image_token":
  // "<IMG_CONTEXT>"} (tokenizer_config.json's model_specific_special_tokens); empty for none.
  virtual nlohmann::ordered_json named_tokens() const = 0;
  // The system message a conversation without one is given ("" for none), as the family's chat
  // template writes it.
  virtual const std::string& default_system() const = 0;
};

}  // namespace loom::data
