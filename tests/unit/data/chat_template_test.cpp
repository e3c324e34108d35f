// Qwen2-VL chat template: hand-worked ids and labels through a hand-made byte-level BPE
// (tests/fixtures/conversations/chatml_bpe_tokenizer.json), <image> expansion from the grid, skipped
// images, and the exact template text through Qwen's own tokenizer.json.
#include "loom/data/chat_template.h"

#include <gtest/gtest.h>

#include <thread>

#include "data_test_util.h"
#include "loom/data/image/qwen2vl_processor.h"
#include "loom/data/tokenizer/bpe_tokenizer.h"
#include "loom/util/errors.h"

using namespace loom::data;
using loom::DataError;
using loom::test::counts_of;
using loom::test::message_of;
using Ids = std::vector<int64_t>;

namespace {

const std::string kDir = std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/conversations";

// The fixture tokenizer: byte b is id b (printable ASCII bytes are themselves, space is "Ġ" 32,
// newline "Ċ" 10); merges give "user" 258, "\n\n" 259, "ok" 260; the specials follow.
constexpr int64_t kUser = 258, kTwoNewlines = 259, kOk = 260;
constexpr int64_t kImStart = 261, kImEnd = 262, kVisionStart = 263, kVisionEnd = 264, kImagePad = 265;
constexpr int64_t kIgnore = kIgnoreIndex;

const BpeTokenizer& tokenizer() {
  static const BpeTokenizer t = BpeTokenizer::load(kDir + "/chatml_bpe_tokenizer.json");
  return t;
}

// Ids of text the merges do not touch: one per byte.
Ids bytes(const std::string& text) { return Ids(text.begin(), text.end()); }

Ids operator+(Ids a, const Ids& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

Ids repeat(int64_t id, int64_t times) { return Ids(times, id); }
Ids ignored(size_t n) { return Ids(n, kIgnore); }

std::vector<Conversation> chat() {
  SkipLog skips;
  DatasetSpec spec;
  spec.path = kDir + "/chat.json";
  return read_conversations(spec, skips);
}

// "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
const Ids kDefaultSystem =
    Ids{kImStart} + bytes("system\nYou are a helpful assistant.") + Ids{kImEnd} + bytes("\n");
// "<|im_start|>user\n"
const Ids kUserTurn = Ids{kImStart, kUser, '\n'};
// "<|im_end|>\n<|im_start|>assistant\n"
const Ids kToAssistant = Ids{kImEnd, '\n', kImStart} + bytes("assistant\n");

Ids image_tokens(int64_t n) { return Ids{kVisionStart} + repeat(kImagePad, n) + Ids{kVisionEnd}; }

// An image as the Qwen2-VL processor at `merge` describes it, without its pixels.
VisionInput grid_only(int64_t t, int64_t h, int64_t w, int64_t merge = 2) {
  VisionInput v;
  v.grid_thw = {t, h, w};
  v.tokens = merged_token_count(v.grid_thw, merge);
  return v;
}

// The options with the Qwen2-VL image processor (its default settings): images as
// <|vision_start|> <|image_pad|> x merged tokens <|vision_end|>.
ChatTemplateOptions qwen2vl(ChatTemplateOptions options = {}) {
  options.processor = std::make_shared<Qwen2VLImageProcessor>(Qwen2VLImageOptions{});
  return options;
}

}  // namespace

TEST(ChatTemplate, HandWorkedIdsAndLabelsWithDefaultSystemAndPngImage) {
  const ChatTemplate chat_template(tokenizer(), qwen2vl());
  SkipLog skips;
  const std::optional<ConversationExample> ex = chat_template.build(chat()[0], skips);
  ASSERT_TRUE(ex.has_value());
  // user "<image>What is this?", assistant "ok"; red.png is 56x56: 4x4 patches, 4 merged tokens.
  const Ids prompt = kDefaultSystem + kUserTurn + image_tokens(4) + bytes("What is this?") + kToAssistant;
  const Ids reply = {kOk, kImEnd, '\n'};
  EXPECT_EQ(ex->input_ids, prompt + reply);
  EXPECT_EQ(ex->labels, ignored(prompt.size()) + reply);
  EXPECT_EQ(ex->prompt_length, static_cast<int64_t>(prompt.size()));
  EXPECT_EQ(ex->length(), static_cast<int64_t>(prompt.size() + 3));
  EXPECT_EQ(ex->answer, "ok");
  ASSERT_EQ(ex->images.size(), 1u);
  EXPECT_EQ(ex->images[0].grid_thw, (std::array<int64_t, 3>{1, 4, 4}));
  EXPECT_EQ(ex->images[0].pixel_values.sizes(), (std::vector<int64_t>{16, 1176}));
  EXPECT_EQ(ex->source, kDir + "/chat.json");
  EXPECT_EQ(ex->sample_index, 0);
  EXPECT_EQ(skips.counts().total(), 0);
  EXPECT_EQ(tokenizer().decode(ex->input_ids),
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n<|vision_start|>"
            "<|image_pad|><|image_pad|><|image_pad|><|image_pad|><|vision_end|>What is this?<|im_end|>\n"
            "<|im_start|>assistant\nok<|im_end|>\n");
}

TEST(ChatTemplate, SystemMessageReplacesTheDefaultAndJpegGridSetsTheCount) {
  const ChatTemplate chat_template(tokenizer(), qwen2vl());
  SkipLog skips;
  const std::optional<ConversationExample> ex = chat_template.build(chat()[1], skips);
  ASSERT_TRUE(ex.has_value());
  // sky.jpg is 56 high, 84 wide: 4x6 patches, 6 merged tokens.
  const Ids prompt = Ids{kImStart} + bytes("system\nBe brief.") + Ids{kImEnd, '\n'} + kUserTurn +
                     image_tokens(6) + bytes("Colour?") + kToAssistant;
  const Ids reply = bytes("blue") + Ids{kImEnd, '\n'};
  EXPECT_EQ(ex->input_ids, prompt + reply);
  EXPECT_EQ(ex->labels, ignored(prompt.size()) + reply);
  EXPECT_EQ(ex->images[0].grid_thw, (std::array<int64_t, 3>{1, 4, 6}));
}

TEST(ChatTemplate, MultiTurnLabelsEveryReplyAndNoMergeCrossesASpecialToken) {
  const ChatTemplate chat_template(tokenizer(), qwen2vl());
  const ConversationExample ex = chat_template.apply(chat()[2], {});
  // user "Line one\n\nLine two" (the two newlines merge), assistant "ok", user "hi\n", assistant "done".
  // "hi\n" ends in a newline and "\n" follows its <|im_end|>; they are encoded apart, so stay two 10s.
  const Ids turn1 =
      kDefaultSystem + kUserTurn + bytes("Line one") + Ids{kTwoNewlines} + bytes("Line two") + kToAssistant;
  const Ids reply1 = {kOk, kImEnd, '\n'};
  const Ids turn2 = kUserTurn + bytes("hi\n") + kToAssistant;
  const Ids reply2 = bytes("done") + Ids{kImEnd, '\n'};
  EXPECT_EQ(ex.input_ids, turn1 + reply1 + turn2 + reply2);
  EXPECT_EQ(ex.labels, ignored(turn1.size()) + reply1 + ignored(turn2.size()) + reply2);
  EXPECT_EQ(ex.prompt_length, static_cast<int64_t>(turn1.size() + reply1.size() + turn2.size()));
  EXPECT_EQ(ex.answer, "done");
  EXPECT_TRUE(ex.images.empty());
}

TEST(ChatTemplate, MergesInsideTextPieces) {
  const ChatTemplate chat_template(tokenizer(), qwen2vl());
  // user "Count the users." -> "Count", " the", " users", "." with " users" = Ġ user s.
  const ConversationExample ex = chat_template.apply(chat()[5], {});
  const Ids prompt =
      kDefaultSystem + kUserTurn + bytes("Count the") + Ids{' ', kUser, 's', '.'} + kToAssistant;
  const Ids reply = bytes("one") + Ids{' ', kUser, kImEnd, '\n'};
  EXPECT_EQ(ex.input_ids, prompt + reply);
  EXPECT_EQ(ex.labels, ignored(prompt.size()) + reply);
}

TEST(ChatTemplate, ImageExpansionCountComesFromTheGrid) {
  const ChatTemplate chat_template(tokenizer(), qwen2vl());
  // user "<image> and <image>: same?" with grids (1, 6, 8) and (2, 4, 4): 48/4 = 12 and 32/4 = 8 tokens.
  const ConversationExample ex = chat_template.apply(chat()[3], {grid_only(1, 6, 8), grid_only(2, 4, 4)});
  const Ids prompt = kDefaultSystem + kUserTurn + image_tokens(12) + bytes(" and ") + image_tokens(8) +
                     bytes(": same?") + kToAssistant;
  EXPECT_EQ(ex.input_ids, (prompt + Ids{'n', 'o', kImEnd, '\n'}));

  // The block holds the tokens the processor gave each image: at merge 4, 48/16 = 3 and 32/16 = 2.
  const ConversationExample ex4 =
      chat_template.apply(chat()[3], {grid_only(1, 6, 8, /*merge=*/4), grid_only(2, 4, 4, /*merge=*/4)});
  EXPECT_EQ(std::count(ex4.input_ids.begin(), ex4.input_ids.end(), kImagePad), 5);
}

TEST(ChatTemplate, SmallGreyImageIsScaledUpToFourTokens) {
  const ChatTemplate chat_template(tokenizer(), qwen2vl());
  SkipLog skips;
  // grey.png is 28x28 grey; min_pixels 56*56 scales it to 56x56.
  const std::optional<ConversationExample> ex = chat_template.build(chat()[4], skips);
  ASSERT_TRUE(ex.has_value());
  const Ids prompt = kDefaultSystem + kUserTurn + bytes("Describe.") + image_tokens(4) + kToAssistant;
  EXPECT_EQ(ex->input_ids, (prompt + bytes("grey") + Ids{kImEnd, '\n'}));
}

TEST(ChatTemplate, TrainOnPromptLabelsAllButImagePads) {
  ChatTemplateOptions options;
  options.train_on_prompt = true;
  SkipLog skips;
  const std::optional<ConversationExample> ex =
      ChatTemplate(tokenizer(), qwen2vl(options)).build(chat()[0], skips);
  ASSERT_TRUE(ex.has_value());
  Ids expected = ex->input_ids;
  for (int64_t& id : expected) {
    if (id == kImagePad) id = kIgnore;
  }
  EXPECT_EQ(ex->labels, expected);
  EXPECT_EQ(std::count(ex->labels.begin(), ex->labels.end(), kIgnore), 4);
}

TEST(ChatTemplate, GenerationPromptEndsWithTheAssistantHeader) {
  ChatTemplateOptions options;
  options.generation_prompt = true;
  options.train_on_prompt = true;  // no effect on a generation prompt
  const ConversationExample ex = ChatTemplate(tokenizer(), qwen2vl(options)).apply(chat()[2], {});
  const Ids expected = kDefaultSystem + kUserTurn + bytes("Line one") + Ids{kTwoNewlines} +
                       bytes("Line two") + kToAssistant + Ids{kOk, kImEnd, '\n'} + kUserTurn + bytes("hi\n") +
                       kToAssistant;
  EXPECT_EQ(ex.input_ids, expected);
  EXPECT_EQ(ex.labels, ignored(expected.size()));
  EXPECT_EQ(ex.prompt_length, static_cast<int64_t>(expected.size()));
  EXPECT_EQ(ex.answer, "done");
}

// A processor without a default system message (InternVL's): a conversation without one has none,
// one with one keeps it; the Jinja written for the checkpoint agrees.
TEST(ChatTemplate, NoDefaultSystemMessageWritesNone) {
  ChatTemplateOptions options = qwen2vl();
  options.default_system = "";
  const ChatTemplate chat_template(tokenizer(), options);
  const std::vector<Message> ask = {{Role::user, "hi"}};
  EXPECT_EQ(chat_template.encode_chat(ask, false), (kUserTurn + bytes("hi") + Ids{kImEnd, '\n'}));
  const std::vector<Message> told = {{Role::system, "Be brief."}, {Role::user, "hi"}};
  const Ids with_system = Ids{kImStart} + bytes("system\nBe brief.") + Ids{kImEnd, '\n'} + kUserTurn +
                          bytes("hi") + Ids{kImEnd, '\n'};
  EXPECT_EQ(chat_template.encode_chat(told, false), with_system);
  const ImageBlock block{"<|vision_start|>", "<|image_pad|>", "<|vision_end|>"};
  EXPECT_EQ(chatml_template_jinja("", block).find("system"), std::string::npos);
  EXPECT_NE(chatml_template_jinja("You are a helpful assistant.", block).find("<|im_start|>system"),
            std::string::npos);
}

TEST(ChatTemplate, EncodeChatEndsWithTheLastMessageOrTheGenerationPrompt) {
  const ChatTemplate chat_template(tokenizer(), qwen2vl());
  // A chat that ends with the user: "<|im_start|>user\nhi<|im_end|>\n", then the opening of the reply
  // when asked.
  const std::vector<Message> ask = {{Role::user, "hi"}};
  const Ids asked = kDefaultSystem + kUserTurn + bytes("hi") + Ids{kImEnd, '\n'};
  EXPECT_EQ(chat_template.encode_chat(ask, false), asked);
  EXPECT_EQ(chat_template.encode_chat(ask, true), asked + Ids{kImStart} + bytes("assistant\n"));
  // Multi-turn with a system message, ending with the assistant: every reply written out in full.
  const std::vector<Message> replied = {
      {Role::system, "Be brief."}, {Role::user, "Count the users."}, {Role::assistant, "ok"}};
  const Ids whole = Ids{kImStart} + bytes("system\nBe brief.") + Ids{kImEnd, '\n'} + kUserTurn +
                    bytes("Count the") + Ids{' ', kUser, 's', '.'} + kToAssistant + Ids{kOk, kImEnd, '\n'};
  EXPECT_EQ(chat_template.encode_chat(replied, false), whole);
  EXPECT_EQ(chat_template.encode_chat(replied, true), whole + Ids{kImStart} + bytes("assistant\n"));
  // The options' generation_prompt and train_on_prompt shape training examples, not a chat's ids.
  ChatTemplateOptions options;
  options.generation_prompt = true;
  options.train_on_prompt = true;
  EXPECT_EQ(ChatTemplate(tokenizer(), qwen2vl(options)).encode_chat(replied, false), whole);
}

TEST(ChatTemplate, EncodeChatRefusesBadChatsAndImagePlaceholders) {
  const ChatTemplate chat_template(tokenizer(), qwen2vl());
  EXPECT_NE(message_of([&] {
              chat_template.encode_chat({{Role::assistant, "a"}}, true);
            }).find("message 0 is an assistant message where a user message must come"),
            std::string::npos);
  EXPECT_EQ(message_of([&] { chat_template.encode_chat({}, true); }), "the conversation has no messages");
  EXPECT_EQ(message_of([&] {
              chat_template.encode_chat({{Role::user, "a"}, {Role::assistant, "b"}, {Role::user, "<image>c"}},
                                        false);
            }),
            "message 2 has an <image> placeholder, which a text-only chat cannot expand");
}

TEST(ChatTemplate, ConvertsToTokenizedExampleAndCollates) {
  const ChatTemplate chat_template(tokenizer(), qwen2vl());
  SkipLog skips;
  const std::vector<Conversation> samples = chat();
  const ConversationExample with_image = *chat_template.build(samples[0], skips);
  const ConversationExample text_only = *chat_template.build(samples[2], skips);
  const TokenizedExample a = with_image.to_tokenized_example();
  const TokenizedExample b = text_only.to_tokenized_example();
  EXPECT_EQ(a.input_ids, with_image.input_ids);
  EXPECT_EQ(a.labels, with_image.labels);
  EXPECT_EQ(a.prompt_length, with_image.prompt_length);
  EXPECT_EQ(a.answer, "ok");
  ASSERT_EQ(a.images.size(), 1u);
  EXPECT_EQ(a.images[0].grid_thw, (std::array<int64_t, 3>{1, 4, 4}));
  EXPECT_TRUE(b.images.empty());
  const Batch batch = collate({a, b}, 0);
  EXPECT_EQ(batch.input_ids.size(1), std::max(with_image.length(), text_only.length()));
  EXPECT_EQ(batch.pixel_values.sizes(), (std::vector<int64_t>{16, 1176}));
  EXPECT_EQ(batch.num_target_tokens, 3 + 3 + 6);  // "ok" reply; "ok" and "done" replies

  const ConversationExample two_images = *chat_template.build(samples[3], skips);
  ASSERT_EQ(two_images.images.size(), 2u);
  const TokenizedExample c = two_images.to_tokenized_example();
  ASSERT_EQ(c.images.size(), 2u);
  const Batch both = collate({a, c}, 0);
  const int64_t rows_c = c.images[0].pixel_values.size(0) + c.images[1].pixel_values.size(0);
  EXPECT_EQ(both.pixel_values.size(0), 16 + rows_c);
  EXPECT_EQ(both.image_grid_thw.size(0), 3);
  EXPECT_TRUE(
      both.pixel_values.slice(0, 16 + c.images[0].pixel_values.size(0)).equal(c.images[1].pixel_values));
}

TEST(ChatTemplate, MissingCorruptAndBadSamplesAreSkippedWithReasons) {
  SkipLog read_skips;
  DatasetSpec spec;
  spec.path = kDir + "/bad_samples.json";
  const std::vector<Conversation> samples = read_conversations(spec, read_skips);
  ASSERT_EQ(samples.size(), 4u);  // samples 0, 6, 7, 9
  const ChatTemplate chat_template(tokenizer(), qwen2vl());
  SkipLog skips;
  EXPECT_TRUE(chat_template.build(samples[0], skips).has_value());
  EXPECT_FALSE(chat_template.build(samples[1], skips).has_value());
  EXPECT_FALSE(chat_template.build(samples[2], skips).has_value());
  EXPECT_TRUE(chat_template.build(samples[3], skips).has_value());
  Conversation hand_made = samples[0];
  hand_made.messages.pop_back();  // ends with a user message
  EXPECT_FALSE(chat_template.build(hand_made, skips).has_value());

  EXPECT_EQ(counts_of(skips), "missing 1, corrupt 1, bad 1");
  const std::vector<SkipRecord> records = skips.records();
  ASSERT_EQ(records.size(), 3u);
  EXPECT_EQ(records[0].kind, SkipKind::missing_image);
  EXPECT_EQ(records[0].message(), "skipped sample 6 of " + spec.path + " (missing image): image file " +
                                      kDir + "/images/missing.png does not exist");
  EXPECT_EQ(records[1].kind, SkipKind::corrupt_image);
  EXPECT_EQ(records[1].sample_index, 7);
  EXPECT_NE(records[1].reason.find(kDir + "/images/corrupt.jpg"), std::string::npos) << records[1].reason;
  EXPECT_EQ(records[2].message(), "skipped sample 0 of " + spec.path +
                                      " (bad sample): the conversation must end with an assistant message");
}

TEST(ChatTemplate, ApplyRejectsMismatchedImagesAndBadConversations) {
  const ChatTemplate chat_template(tokenizer(), qwen2vl());
  const std::vector<Conversation> samples = chat();
  EXPECT_EQ(message_of([&] { chat_template.apply(samples[0], {}); }),
            kDir + "/chat.json sample 0: 0 processed images given for 1 image paths");
  Conversation bad = samples[2];
  bad.messages[1].role = Role::user;
  EXPECT_THROW(chat_template.apply(bad, {}), DataError);
}

TEST(ChatTemplate, TokenizerWithoutChatTokensIsAnError) {
  const BpeTokenizer plain =
      BpeTokenizer::load(std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/tokenizers/tiny_bpe_tokenizer.json");
  const std::string message = message_of([&] { ChatTemplate t(plain); });
  EXPECT_NE(message.find("needs the special token <|im_start|>"), std::string::npos) << message;
}

TEST(ChatTemplate, ThreadsBuildTheSameExamples) {
  const ChatTemplate chat_template(tokenizer(), qwen2vl());
  const std::vector<Conversation> samples = chat();
  SkipLog skips;
  std::vector<Ids> expected;
  for (const Conversation& c : samples) expected.push_back(chat_template.build(c, skips)->input_ids);
  std::vector<std::vector<Ids>> got(3, std::vector<Ids>(samples.size()));
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&, t] {
      for (size_t k = 0; k < samples.size(); ++k) {
        const size_t i = (k + t) % samples.size();
        got[t][i] = chat_template.build(samples[i], skips)->input_ids;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < 3; ++t) EXPECT_EQ(got[t], expected);
  EXPECT_EQ(skips.counts().total(), 0);
}

TEST(ChatTemplate, QwenTokenizerGivesTheQwen2VLTemplateText) {
  // The Qwen tokenizer splits its input at special tokens, so the ids of the whole template text
  // (as HuggingFace's apply_chat_template writes it) are the ids built piece by piece here.
  const BpeTokenizer qwen =
      BpeTokenizer::load(std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/tokenizers/qwen3_tokenizer.json");
  const ChatTemplate chat_template(qwen, qwen2vl());
  SkipLog skips;
  const std::vector<Conversation> samples = chat();
  const ConversationExample ex = *chat_template.build(samples[1], skips);
  std::string pads;
  for (int i = 0; i < 6; ++i) pads += "<|image_pad|>";
  const std::string text = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n<|vision_start|>" +
                           pads + "<|vision_end|>Colour?<|im_end|>\n<|im_start|>assistant\nblue<|im_end|>\n";
  EXPECT_EQ(qwen.decode(ex.input_ids), text);
  EXPECT_EQ(ex.input_ids, qwen.encode(text));
  // Qwen2-VL's ids: <|im_start|> 151644, <|im_end|> 151645, <|vision_start|> 151652, <|image_pad|> 151655.
  EXPECT_EQ(ex.input_ids.front(), 151644);
  EXPECT_EQ(ex.input_ids.back() == 198 && ex.input_ids[ex.input_ids.size() - 2] == 151645, true);
  EXPECT_EQ(std::count(ex.input_ids.begin(), ex.input_ids.end(), 151655), 6);
  EXPECT_EQ(std::count(ex.input_ids.begin(), ex.input_ids.end(), 151652), 1);

  const ConversationExample multi = chat_template.apply(samples[2], {});
  const std::string multi_text =
      "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nLine one\n\nLine two"
      "<|im_end|>\n<|im_start|>assistant\nok<|im_end|>\n<|im_start|>user\nhi\n<|im_end|>\n<|im_start|>"
      "assistant\n"
      "done<|im_end|>\n";
  EXPECT_EQ(multi.input_ids, qwen.encode(multi_text));

  // A chat for inference, ending with the user: the ids of its whole text, generation prompt or not.
  const std::vector<Message> asking = {{Role::system, "Answer briefly."},
                                       {Role::user, "我们今天去公园散步，天气非常好。 What do you think?"},
                                       {Role::assistant, "It sounds lovely 😀\n\nEnjoy the walk."},
                                       {Role::user, "def f(x):\n    return -x\n"}};
  const std::string chat_text =
      "<|im_start|>system\nAnswer briefly.<|im_end|>\n<|im_start|>user\n我们今天去公园散步，天气非常好。 "
      "What do you think?<|im_end|>\n<|im_start|>assistant\nIt sounds lovely 😀\n\nEnjoy the walk."
      "<|im_end|>\n<|im_start|>user\ndef f(x):\n    return -x\n<|im_end|>\n";
  EXPECT_EQ(chat_template.encode_chat(asking, false), qwen.encode(chat_text));
  EXPECT_EQ(chat_template.encode_chat(asking, true), qwen.encode(chat_text + "<|im_start|>assistant\n"));
}

TEST(ChatTemplate, ToolsFollowTheSystemMessageAndToolCallsAreLabelledReplies) {
  // A tool conversation as read_conversations writes it (dataset_formats_test shows that), through
  // Qwen's tokenizer: the text is Qwen's chat template's, <tool_call> and <tool_response> its own
  // ids, and the call is a labelled reply like any other.
  const BpeTokenizer qwen =
      BpeTokenizer::load(std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/tokenizers/qwen3_tokenizer.json");
  const ChatTemplate chat_template(qwen, qwen2vl());
  Conversation tools;
  tools.tools = "\n\n# Tools\n<tools>\n{\"name\": \"f\"}\n</tools>";
  const std::string call = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"x\": 1}}\n</tool_call>";
  tools.messages = {{Role::user, "Use f."},
                    {Role::assistant, call},
                    {Role::user, "<tool_response>\n2\n</tool_response>"},
                    {Role::assistant, "It gave 2."}};
  const ConversationExample ex = chat_template.apply(tools, {});
  const std::string prompt =
      "<|im_start|>system\nYou are a helpful assistant.\n\n# Tools\n<tools>\n{\"name\": \"f\"}\n</tools>"
      "<|im_end|>\n<|im_start|>user\nUse f.<|im_end|>\n<|im_start|>assistant\n";
  const std::string result =
      "<|im_start|>user\n<tool_response>\n2\n</tool_response><|im_end|>\n<|im_start|>assistant\n";
  const std::string reply = call + "<|im_end|>\n", answer = "It gave 2.<|im_end|>\n";
  EXPECT_EQ(ex.input_ids, qwen.encode(prompt + reply + result + answer));
  // Qwen's <tool_call> 151657, </tool_call> 151658, <tool_response> 151665, </tool_response> 151666.
  for (const int64_t id : {151657, 151658, 151665, 151666})
    EXPECT_EQ(std::count(ex.input_ids.begin(), ex.input_ids.end(), id), 1) << id;
  Ids labels = ignored(qwen.encode(prompt).size()) + qwen.encode(reply) +
               ignored(qwen.encode(result).size()) + qwen.encode(answer);
  EXPECT_EQ(ex.labels, labels);

  // With the system message given, the tools follow it; with none at all, they stand alone.
  tools.messages.insert(tools.messages.begin(), Message{Role::system, "Be brief."});
  EXPECT_EQ(
      chat_template.apply(tools, {}).input_ids,
      qwen.encode("<|im_start|>system\nBe brief.\n\n# Tools\n<tools>\n{\"name\": \"f\"}\n</tools><|im_end|>\n"
                  "<|im_start|>user\nUse f.<|im_end|>\n<|im_start|>assistant\n" +
                  reply + result + answer));
}
