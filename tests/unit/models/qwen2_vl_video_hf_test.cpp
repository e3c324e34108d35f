// Loom's Qwen2-VL and Qwen2.5-VL video path against transformers' own run on short clips given as
// frame PNGs (tests/fixtures/hf-qwen2-vl-video, see its README): the processor's pixel values and
// grid, M-RoPE's position ids (Qwen2.5-VL's temporal axis in seconds), the tower's video embeddings
// and the logits. Clips of 1 and 2 frames are checked against slices of the fixture's (the tower
// attends within one temporal patch, and the README's check shows a patch run alone gives its rows).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "loom/data/image/decode.h"
#include "loom/data/image/qwen2vl_processor.h"
#include "loom/models/qwen2_vl/spec.h"
#include "loom/models/weights.h"
#include "loom/util/errors.h"
#include "reference_fixture.h"

namespace loom::models {
namespace {

const std::string kDir = std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/hf-qwen2-vl-video/";

at::Tensor ids_tensor(const nlohmann::json& rows) {
  std::vector<int64_t> flat;
  for (const auto& row : rows)
    for (const auto& v : row) flat.push_back(v.get<int64_t>());
  return at::tensor(flat, at::kLong).view({static_cast<int64_t>(rows.size()), -1});
}

// Every number of a nested JSON list, in order.
void flatten(const nlohmann::json& value, std::vector<int64_t>& out) {
  if (!value.is_array()) return out.push_back(value.get<int64_t>());
  for (const auto& item : value) flatten(item, out);
}
at::Tensor flat_longs(const nlohmann::json& value) {
  std::vector<int64_t> out;
  flatten(value, out);
  return at::tensor(out, at::kLong);
}

at::Tensor longs(const std::vector<int64_t>& values) { return at::tensor(values, at::kLong); }

// The fixture's processor bounds (min 3136, max 12544): 56x84 frames stay 56x84.
data::Qwen2VLImageOptions fixture_options() {
  data::Qwen2VLImageOptions options;
  options.min_pixels = 3136;
  options.max_pixels = 12544;
  return options;
}

class HfQwen2VLVideo : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    config = model_config_from_dir(fixture.dir());
    model = build_model(config, {});
    load_parameters(*model, fixture.dir());
    input = fixture.json("input.json");
    for (const auto& name : input["frames"])
      frames.push_back(data::decode_image_file(fixture.dir() + "/" + name.get<std::string>()));
    fps = input["fps"].get<double>();
    video = data::qwen2vl_process_frames(frames, fps, fixture_options(), /*video=*/true);
  }
  VisionLanguageInputs inputs(bool with_second_per_grid = true) const {
    VisionLanguageInputs in;
    in.input_ids = ids_tensor(input["input_ids"]);
    in.pixel_values_videos = video.pixel_values;
    in.video_grid_thw =
        at::tensor(std::vector<int64_t>(video.grid_thw.begin(), video.grid_thw.end())).view({1, 3});
    if (with_second_per_grid) in.second_per_grid_ts = {video.second_per_grid};
    return in;
  }

  testing::ReferenceFixture fixture{kDir + GetParam(), GetParam()};
  Qwen2VLConfig config;
  std::shared_ptr<Qwen2VLForConditionalGeneration> model;
  nlohmann::json input;
  std::vector<data::Image> frames;
  double fps = 0;
  data::VisionInput video;
};

TEST_P(HfQwen2VLVideo, PixelValuesGridAndSecondsPerPatch) {
  EXPECT_EQ(video.grid_thw, (std::array<int64_t, 3>{3, 4, 6}));
  EXPECT_EQ(video.tokens, input["num_video_tokens"].get<int64_t>());
  EXPECT_DOUBLE_EQ(video.second_per_grid, 2.0 / fps);
  if (input.contains("second_per_grid_ts"))
    EXPECT_NEAR(video.second_per_grid, input["second_per_grid_ts"][0].get<double>(), 1e-15);
  EXPECT_LT(fixture.max_abs_diff("pixel_values_videos", video.pixel_values,
                                 fixture.f32("pixel_values_videos.bin", {72, 1176})),
            1e-5);
}

TEST_P(HfQwen2VLVideo, PositionIdsExact) {
  const RopeIndex rope = rope_index(inputs(), config);
  EXPECT_TRUE(at::equal(rope.position_ids, flat_longs(input["position_ids"]).view({3, 1, -1})));
  EXPECT_EQ(rope.rope_deltas.item<int64_t>(), input["rope_deltas"][0][0].get<int64_t>());
  // The video block's temporal axis: start + each patch's time.
  const int64_t start = input["video_position_start"].get<int64_t>();
  const at::Tensor ids = ids_tensor(input["input_ids"])[0];
  const at::Tensor t = rope.position_ids[0][0].masked_select(ids == config.tokens.video);
  std::vector<int64_t> times;
  for (int64_t i = 0; i < t.size(0); i += 6) times.push_back(t[i].item<int64_t>() - start);
  EXPECT_EQ(nlohmann::json(times), input["video_temporal_positions"]);
}

TEST_P(HfQwen2VLVideo, VideoEmbeddingsAndLogits) {
  const at::Tensor embeds = model->image_embeddings(video.pixel_values, inputs().video_grid_thw);
  EXPECT_LT(fixture.max_abs_diff("video_embeds", embeds, fixture.f32("video_embeds.bin", {18, 64})), 1e-4);
  const at::Tensor logits = model->forward(inputs());
  EXPECT_LT(fixture.max_abs_diff("logits", logits, fixture.f32("logits.bin", {1, 97, 256})), 1e-4);
}

// Clips of 2 frames (Qwen2-VL's first temporal patch) and 1 frame (Qwen2.5-VL's last, its frame
// repeated): the rows and embeddings of that patch in the fixture; a 1-frame video is the same frame
// as an image.
TEST_P(HfQwen2VLVideo, OneAndTwoFrameClipsAreTheirPatchOfTheFixture) {
  const bool odd = frames.size() % 2 == 1;
  const size_t first = odd ? frames.size() - 1 : 0;  // qwen2_5_vl: frame 4 (patch 2); qwen2_vl: frames 0, 1
  const int64_t patch = odd ? 2 : 0;
  const std::vector<data::Image> clip(frames.begin() + first, frames.begin() + first + (odd ? 1 : 2));
  const data::VisionInput short_clip = data::qwen2vl_process_frames(clip, fps, fixture_options(), true);
  EXPECT_EQ(short_clip.grid_thw, (std::array<int64_t, 3>{1, 4, 6}));
  EXPECT_EQ(short_clip.tokens, 6);
  const at::Tensor rows = fixture.f32("pixel_values_videos.bin", {72, 1176}).narrow(0, patch * 24, 24);
  EXPECT_LT(fixture.max_abs_diff(fmt::format("{}-frame clip pixel values", clip.size()),
                                 short_clip.pixel_values, rows),
            1e-5);
  const at::Tensor embeds =
      model->image_embeddings(short_clip.pixel_values, longs({int64_t{1}, 4, 6}).view({1, 3}));
  EXPECT_LT(fixture.max_abs_diff(fmt::format("{}-frame clip embeds", clip.size()), embeds,
                                 fixture.f32("video_embeds.bin", {18, 64}).narrow(0, patch * 6, 6)),
            1e-4);
  if (odd) {
    const data::VisionInput still = data::qwen2vl_process_frames(clip, 0, fixture_options(), /*video=*/false);
    EXPECT_TRUE(at::equal(still.pixel_values, short_clip.pixel_values));
    EXPECT_EQ(still.second_per_grid, 0.0);
  }
}

INSTANTIATE_TEST_SUITE_P(Families, HfQwen2VLVideo, ::testing::Values("qwen2_vl", "qwen2_5_vl"));

// Qwen2.5-VL's temporal positions are float32 products truncated, as transformers computes them:
// without second_per_grid_ts a patch is 1 second; at 1.3 fps (2 / 1.3 seconds a patch) and 2 tokens a
// second, patch 39 is at 120, where double arithmetic would give 119.
TEST(RopeIndexVideo, Qwen25TemporalPositionsAreFloat32Truncations) {
  Qwen2VLConfig config = model_config_from_dir(kDir + "qwen2_5_vl");
  const int64_t patches = 40;
  const int64_t tokens = patches * 1;  // grid (40, 2, 2): one merged token a patch
  std::vector<int64_t> ids(tokens, config.tokens.video);
  VisionLanguageInputs in;
  in.input_ids = at::tensor(ids, at::kLong).view({1, -1});
  in.video_grid_thw = longs({patches, int64_t{2}, int64_t{2}}).view({1, 3});
  in.second_per_grid_ts = {2.0 / 1.3};
  const at::Tensor t = rope_index(in, config).position_ids[0][0];
  EXPECT_EQ(t[39].item<int64_t>(), 120);
  EXPECT_EQ(static_cast<int64_t>(39 * (2.0 / 1.3) * 2.0), 119);  // what double arithmetic gives
  in.second_per_grid_ts.clear();
  const at::Tensor one_second = rope_index(in, config).position_ids[0][0];
  EXPECT_EQ(one_second[3].item<int64_t>(), 3 * 2);
  // Qwen2-VL ignores the seconds: patch k is at k.
  Qwen2VLConfig qwen2 = model_config_from_dir(kDir + "qwen2_vl");
  in.second_per_grid_ts = {2.0 / 1.3};
  EXPECT_EQ(rope_index(in, qwen2).position_ids[0][0][39].item<int64_t>(), 39);
}

TEST(RopeIndexVideo, BlocksTakeTheirOwnKindsGridsInTextOrder) {
  Qwen2VLConfig config = model_config_from_dir(kDir + "qwen2_vl");
  const int64_t v = config.tokens.video, i = config.tokens.image;
  // text, a video of 2 patches of 1 merged token, text, an image of 1 token (grid 1x2x2), text.
  VisionLanguageInputs in;
  in.input_ids = longs({int64_t{7}, v, v, int64_t{8}, i, int64_t{9}}).view({1, -1});
  in.video_grid_thw = longs({int64_t{2}, 2, 2}).view({1, 3});
  in.image_grid_thw = longs({int64_t{1}, 2, 2}).view({1, 3});
  const at::Tensor p = rope_index(in, config).position_ids;
  EXPECT_TRUE(at::equal(p[0][0], longs({int64_t{0}, 1, 2, 3, 4, 5})));
  EXPECT_TRUE(at::equal(p[1][0], longs({int64_t{0}, 1, 1, 3, 4, 5})));
  // A video block without a grid, and a grid without a block, are errors naming the kind.
  in.video_grid_thw = at::zeros({0, 3}, at::kLong);
  EXPECT_NE(testing::message_of<ModelError>([&] { rope_index(in, config); }).find("more video blocks"),
            std::string::npos);
  in.input_ids = longs({int64_t{7}, i}).view({1, -1});
  in.video_grid_thw = longs({int64_t{2}, 2, 2}).view({1, 3});
  EXPECT_EQ(testing::message_of<ModelError>([&] { rope_index(in, config); }),
            "video_grid_thw has 1 videos but the input ids hold 0 video blocks");
}

}  // namespace
}  // namespace loom::models
