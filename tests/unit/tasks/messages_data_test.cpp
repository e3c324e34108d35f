// The user's conversation files as job data: a held-out sample that cannot be used (a missing,
// truncated or zero-byte image, placeholders that do not match the images, a malformed sample, a
// prompt over data.max_seq_len) is a one-line DataError naming its file and index when the data
// is read, before any training; a usable held-out set builds its prompts.
#include "loom/tasks/vlm_sft/messages_data.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "../checkpoint/temp_dir.h"
#include "loom/data/image/qwen2vl_processor.h"
#include "loom/data/tokenizer/tokenizer.h"
#include "loom/data/video/gif_writer.h"
#include "loom/util/errors.h"

namespace loom::tasks {
namespace {

namespace fs = std::filesystem;

const std::string kFixtures = std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/conversations";

class MessagesDataTest : public ::testing::Test {
 protected:
  void SetUp() override {
    fs::copy_file(kFixtures + "/images/red.png", dir_ + "/red.png");
    fs::copy_file(kFixtures + "/images/sky.jpg", dir_ + "/sky.jpg");
    write(dir_ + "/train.jsonl", sample("red.png", "red"));
  }

  static std::string sample(const std::string& image, const std::string& answer,
                            const std::string& question = "<image>Colour?") {
    return R"({"messages": [{"role": "user", "content": ")" + question +
           R"("}, {"role": "assistant", "content": ")" + answer + R"("}], "images": [")" + image + "\"]}\n";
  }
  static void write(const std::string& path, const std::string& text) {
    checkpoint::testing::write_bytes(path, text);
  }

  config::DataSection section(const std::string& eval_text, int64_t eval_samples = 1) const {
    write(dir_ + "/eval.jsonl", eval_text);
    config::DataSection d;
    d.dataset = "messages";
    d.tokenizer = kFixtures + "/chatml_bpe_tokenizer.json";
    d.datasets.push_back({dir_ + "/train.jsonl", dir_, 1.0, {}});
    d.eval_datasets.push_back({dir_ + "/eval.jsonl", dir_, 1.0, {}});
    d.eval_samples = eval_samples;
    d.max_pixels = 3136;
    return d;
  }

  // The one-line error reading `eval_text` as the held-out file gives, "" when there is none.
  std::string held_out_error(const std::string& eval_text, int64_t eval_samples = 1) const {
    const data::Qwen2VLImageOptions image;
    try {
      const MessagesData data(section(eval_text, eval_samples), 1,
                              std::make_unique<data::Qwen2VLImageProcessor>(image));
      data.eval_prompts(0, data.eval_samples());
    } catch (const DataError& e) {
      return e.what();
    }
    return "";
  }

  checkpoint::testing::TempDir scratch_;
  std::string dir_ = scratch_.path().string();
};

TEST_F(MessagesDataTest, AUsableHeldOutSetGivesItsPrompts) {
  const data::Qwen2VLImageOptions image;
  const MessagesData data(section(sample("red.png", "red") + sample("sky.jpg", "blue"), 2), 1,
                          std::make_unique<data::Qwen2VLImageProcessor>(image));
  const data::Batch batch = data.eval_prompts(0, 2);
  EXPECT_EQ(batch.input_ids.size(0), 2);
  EXPECT_EQ(batch.answers, (std::vector<std::string>{"red", "blue"}));
  EXPECT_EQ(batch.image_grid_thw.size(0), 2);
}

TEST_F(MessagesDataTest, EvalSamplesTakesTheFirstHeldOutSamplesOrAllOfThem) {
  const data::Qwen2VLImageOptions image;
  const std::string two = sample("red.png", "red") + sample("sky.jpg", "blue");
  EXPECT_EQ(
      MessagesData(section(two, 1), 1, std::make_unique<data::Qwen2VLImageProcessor>(image)).eval_samples(),
      1);
  EXPECT_EQ(MessagesData(section(two, 1000), 1, std::make_unique<data::Qwen2VLImageProcessor>(image))
                .eval_samples(),
            2);  // the default, over a small file
}

// data.system_prompt: the system message a conversation without one gets. Given, it is what an explicit
// system message of the same text gives; "" gives the conversation alone; absent, the processor's
// default ("You are a helpful assistant." for Qwen2-VL) is written before it.
TEST_F(MessagesDataTest, TheSystemPromptIsTheDefaultSystemMessage) {
  const auto ids = [this](const std::string& train, std::optional<std::string> system_prompt) {
    write(dir_ + "/train.jsonl", train);
    config::DataSection d = section(sample("red.png", "red"));
    d.system_prompt = std::move(system_prompt);
    const MessagesData data(d, 1, std::make_unique<data::Qwen2VLImageProcessor>(data::Qwen2VLImageOptions{}));
    const TrainSamples samples = data.train_examples(0, 1);
    EXPECT_EQ(samples.examples.size(), 1u);
    return samples.examples.at(0).input_ids;
  };
  const std::string plain = sample("red.png", "red");
  const std::string with_system =
      R"({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "<image>Colour?"},)"
      R"( {"role": "assistant", "content": "red"}], "images": ["red.png"]})"
      "\n";
  EXPECT_EQ(ids(plain, "Be brief."), ids(with_system, std::nullopt));
  EXPECT_EQ(ids(with_system, "Other."), ids(with_system, std::nullopt));  // the conversation's own wins

  const std::vector<int64_t> none = ids(plain, ""), defaulted = ids(plain, std::nullopt);
  const auto loaded = data::load_tokenizer(kFixtures + "/chatml_bpe_tokenizer.json");
  const data::Tokenizer& tokenizer = *loaded;
  std::vector<int64_t> system =
      tokenizer.encode("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n");
  system.insert(system.end(), none.begin(), none.end());
  EXPECT_EQ(defaulted, system);
  EXPECT_EQ(none.front(), tokenizer.encode("<|im_start|>").at(0));
  EXPECT_EQ(std::vector<int64_t>(none.begin(), none.begin() + 3), tokenizer.encode("<|im_start|>user\n"));
}

TEST_F(MessagesDataTest, ASystemPromptOpeningATemplateTagIsAConfigError) {
  config::DataSection d = section(sample("red.png", "red"));
  d.system_prompt = "Answer in {{ language }}.";
  try {
    MessagesData(d, 1, std::make_unique<data::Qwen2VLImageProcessor>(data::Qwen2VLImageOptions{}));
    FAIL() << "a system prompt with {{ should be refused";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(),
                 "data.system_prompt: the default system message cannot hold '{{' in a chat template");
  }
  d.system_prompt = "Say 'hi' {like this}.";  // quotes and a lone brace stand outside the tags
  EXPECT_NO_THROW(
      MessagesData(d, 1, std::make_unique<data::Qwen2VLImageProcessor>(data::Qwen2VLImageOptions{})));
}

// The same two conversations as a plain messages file, as ShareGPT with a system field and single image
// strings, as content-part lists, as alpaca, and named in a dataset_info.json: the same token ids and
// labels, each file's format detected (or given by the registry).
TEST_F(MessagesDataTest, EquivalentFormatsGiveTheSameTokenIds) {
  const std::string plain = R"([
{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "<image>Colour?"},
              {"role": "assistant", "content": "red"}], "images": ["red.png"]},
{"messages": [{"role": "user", "content": "<image>And this?"}, {"role": "assistant", "content": "blue"}],
 "images": ["sky.jpg"]}])";
  const std::vector<std::string> equivalents = {
      R"({"conversations": [{"from": "human", "value": "<image>Colour?"}, {"from": "gpt", "value": "red"}],)"
      R"( "system": "Be brief.", "images": "red.png"})"
      "\n"
      R"({"conversations": [{"from": "human", "value": "<image>And this?"}, {"from": "gpt", "value": "blue"}],)"
      R"( "images": "sky.jpg"})"
      "\n",
      R"([{"messages": [{"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
                        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Colour?"}]},
                        {"role": "assistant", "content": [{"type": "text", "text": "red"}]}], "images": ["red.png"]},
          {"messages": [{"role": "user", "content": [{"type": "image", "image": "sky.jpg"}, {"type": "text", "text": "And this?"}]},
                        {"role": "assistant", "content": "blue"}]}])",
      R"([{"instruction": "<image>Colour?", "output": "red", "system": "Be brief.", "images": ["red.png"]},
          {"instruction": "<image>And this?", "input": "", "output": "blue", "images": "sky.jpg"}])",
  };
  const auto batch = [this](const std::string& eval_text, const std::string& registry = "") {
    config::DataSection d = section(eval_text, 2);
    if (!registry.empty()) {
      write(dir_ + "/dataset_info.json", registry);
      d.dataset_info = dir_ + "/dataset_info.json";
      d.eval_datasets[0].path.clear();
      d.eval_datasets[0].name = "held_out";
    }
    const MessagesData data(d, 1, std::make_unique<data::Qwen2VLImageProcessor>(data::Qwen2VLImageOptions{}));
    return data.eval_examples(0, 2);
  };
  const data::Batch expected = batch(plain);
  ASSERT_EQ(expected.input_ids.size(0), 2);
  for (const std::string& text : equivalents) {
    const data::Batch got = batch(text);
    EXPECT_TRUE(at::equal(got.input_ids, expected.input_ids)) << text;
    EXPECT_TRUE(at::equal(got.labels, expected.labels)) << text;
  }
  const data::Batch named =
      batch(equivalents[0], R"({"held_out": {"file_name": "eval.jsonl", "formatting": "sharegpt"}})");
  EXPECT_TRUE(at::equal(named.input_ids, expected.input_ids));
  EXPECT_TRUE(at::equal(named.labels, expected.labels));
}

// Videos in a training file: a list of frame files (the video fixture's 5 frames, an odd clip), a GIF
// file of 6 frames at 10 fps (taken at data.video_fps 5 over its 0.6 s: 3 frames, 2 temporal
// patches), beside an image sample; a corrupt and an empty video file are skipped as corrupt videos,
// a missing one as a missing video. Each video is <|vision_start|>, its tokens of <|video_pad|>,
// <|vision_end|> where its <video> was, never labelled, and its seconds per temporal patch are
// 2 / the rate its frames were taken at. Frames are sized by the video bounds, not the images'.
TEST_F(MessagesDataTest, VideosAreFramesOrFilesAndBadOnesAreSkippedAndCounted) {
  const std::string frames = std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/hf-qwen2-vl-video/qwen2_5_vl/";
  data::Video clip{6, 28, 28, 10.0, std::vector<uint8_t>(6 * 28 * 28 * 3)};
  for (size_t i = 0; i < clip.rgb.size(); ++i)
    clip.rgb[i] = static_cast<uint8_t>((i * 7 + i / 2352 * 40) % 256);
  data::write_gif(clip, dir_ + "/clip.gif");
  write(dir_ + "/corrupt.mp4", "not a video at all, just bytes");
  write(dir_ + "/empty.mp4", "");
  auto video_sample = [](const std::string& videos, const std::string& answer) {
    return R"({"messages": [{"role": "user", "content": "<video>What moves?"}, {"role": "assistant", "content": ")" +
           answer + R"("}], "videos": )" + videos + "}\n";
  };
  std::string frame_list = "[[";
  for (int f = 0; f < 5; ++f)
    frame_list += (f ? ", " : "") + std::string("\"") + frames + "frame_00" + std::to_string(f) + ".png\"";
  frame_list += "]]";
  write(dir_ + "/train.jsonl", video_sample(frame_list, "a") + video_sample("\"clip.gif\"", "b") +
                                   video_sample("[\"corrupt.mp4\"]", "c") +
                                   video_sample("[\"empty.mp4\"]", "d") +
                                   video_sample("[\"missing.mp4\"]", "e") + sample("red.png", "red"));
  config::DataSection d = section(sample("red.png", "red"));
  d.video_fps = 5;
  d.video_max_pixels = 12544;  // images stay within 3136 (section())
  d.train_on_prompt = true;
  const MessagesData data(d, 1, std::make_unique<data::Qwen2VLImageProcessor>(data::Qwen2VLImageOptions{}));
  // One epoch, in the mix's order: every sample once.
  const TrainSamples samples = data.train_examples(0, 6);
  EXPECT_EQ(samples.skipped, 3);
  ASSERT_EQ(samples.examples.size(), 3u);
  const auto loaded = data::load_tokenizer(kFixtures + "/chatml_bpe_tokenizer.json");
  const int64_t start = loaded->id("<|vision_start|>"), pad = loaded->id("<|video_pad|>"),
                end = loaded->id("<|vision_end|>");
  int videos = 0;
  for (const data::TokenizedExample& ex : samples.examples) {
    if (ex.videos.empty()) continue;
    ++videos;
    const data::VisionInput& video = ex.videos.at(0);
    const bool listed = ex.answer == "a";
    // 5 frames of 56x84 -> 3 patches of 4x6; the GIF's 3 frames of 28x28 resized to 56x56 -> 2 of 4x4.
    EXPECT_EQ(video.grid_thw, listed ? (std::array<int64_t, 3>{3, 4, 6}) : (std::array<int64_t, 3>{2, 4, 4}));
    EXPECT_DOUBLE_EQ(video.second_per_grid, 2.0 / 5.0);
    const auto block = std::find(ex.input_ids.begin(), ex.input_ids.end(), start);
    ASSERT_NE(block, ex.input_ids.end());
    EXPECT_EQ(std::count(ex.input_ids.begin(), ex.input_ids.end(), pad), video.tokens);
    EXPECT_EQ(*(block + 1), pad);
    EXPECT_EQ(*(block + 1 + video.tokens), end);
    for (size_t i = 0; i < ex.input_ids.size(); ++i)
      if (ex.input_ids[i] == pad) EXPECT_EQ(ex.labels[i], data::kIgnoreIndex);
  }
  EXPECT_EQ(videos, 2);
  const data::Batch batch = data::collate(samples.examples, 0);
  EXPECT_EQ(batch.video_grid_thw.size(0), 2);
  EXPECT_EQ(batch.pixel_values_videos.size(0), 3 * 4 * 6 + 2 * 4 * 4);
  EXPECT_EQ(batch.second_per_grid_ts, (std::vector<double>{0.4, 0.4}));
  EXPECT_EQ(batch.image_grid_thw.size(0), 1);
}

TEST_F(MessagesDataTest, AMissingHeldOutImageIsAnErrorNamingTheSample) {
  const std::string error = held_out_error(sample("red.png", "red") + sample("gone.png", "blue"), 2);
  EXPECT_EQ(error, "held-out sample 1 of " + dir_ +
                       "/eval.jsonl cannot be used (missing image): image file " + dir_ +
                       "/gone.png does not exist");
}

TEST_F(MessagesDataTest, ATruncatedHeldOutImageIsAnErrorNamingTheSample) {
  const std::string bytes = checkpoint::testing::read_bytes(kFixtures + "/images/sky.jpg");
  write(dir_ + "/cut.jpg", bytes.substr(0, bytes.size() / 2));
  const std::string error = held_out_error(sample("cut.jpg", "blue"));
  EXPECT_EQ(error.rfind("held-out sample 0 of " + dir_ + "/eval.jsonl cannot be used (corrupt image): ", 0),
            0u)
      << error;
  EXPECT_NE(error.find("cut.jpg"), std::string::npos) << error;
}

TEST_F(MessagesDataTest, AZeroByteHeldOutImageIsAnErrorNamingTheSample) {
  write(dir_ + "/empty.png", "");
  const std::string error = held_out_error(sample("red.png", "red") + sample("empty.png", "red"), 2);
  EXPECT_EQ(error.rfind("held-out sample 1 of " + dir_ + "/eval.jsonl cannot be used (corrupt image): ", 0),
            0u)
      << error;
  EXPECT_NE(error.find("empty.png"), std::string::npos) << error;
}

TEST_F(MessagesDataTest, HeldOutPlaceholdersNotMatchingTheImagesAreAnError) {
  const std::string error = held_out_error(sample("red.png", "red", "<image><image>Colours?"));
  EXPECT_EQ(error.rfind("held-out sample 0 of " + dir_ + "/eval.jsonl cannot be used (bad sample): ", 0), 0u)
      << error;
  EXPECT_NE(error.find("2 <image> placeholders but 1 images"), std::string::npos) << error;
}

TEST_F(MessagesDataTest, AMalformedHeldOutSampleIsAnErrorNotASkip) {
  const std::string error = held_out_error(sample("red.png", "red") + "[1, 2]\n", 1);
  EXPECT_EQ(error.rfind("held-out sample 1 of " + dir_ + "/eval.jsonl cannot be used (bad sample): ", 0), 0u)
      << error;
}

TEST_F(MessagesDataTest, AnOverlongHeldOutPromptIsAnErrorWhenTheDataIsRead) {
  write(dir_ + "/eval.jsonl", sample("red.png", "red"));
  auto d = section(sample("red.png", "red"));
  d.max_seq_len = 8;
  const data::Qwen2VLImageOptions image;
  try {
    const MessagesData data(d, 1, std::make_unique<data::Qwen2VLImageProcessor>(image));
    FAIL() << "expected a DataError";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("held-out sample 0 of " + dir_ + "/eval.jsonl has "),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("more than data.max_seq_len 8"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace loom::tasks
