// The formats users' files come in, read as LLaMA-Factory and TRL define them: each is detected from
// its first sample and gives the same conversations as the plain messages file it is equivalent to;
// content-part lists, single media strings and a sample's system field; tool calls, their results
// and tool lists written as Qwen's chat template writes them; malformed tool calls, URLs and
// differing system prompts are bad samples; audio is an error naming the field. And
// LLaMA-Factory's dataset_info.json: entries read by name, every key checked, what Loom cannot train
// on refused by name. The files are look-alikes written here.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../checkpoint/temp_dir.h"
#include "data_test_util.h"
#include "loom/data/conversation.h"
#include "loom/data/dataset_info.h"
#include "loom/data/tool_calls.h"
#include "loom/util/errors.h"

namespace loom::data {
namespace {

using loom::test::message_of;
using loom::test::says_all;

class DatasetFormatsTest : public ::testing::Test {
 protected:
  std::string write(const std::string& name, const std::string& text) const {
    const std::string path = dir_ + "/" + name;
    checkpoint::testing::write_bytes(path, text);
    return path;
  }
  DatasetSpec spec(const std::string& path, DatasetFormat format = DatasetFormat::detect) const {
    DatasetSpec s;
    s.path = path;
    s.format = format;
    s.fields = field_names(format);
    return s;
  }
  std::vector<Conversation> read(const std::string& name, const std::string& text) const {
    SkipLog skips;
    auto samples = read_conversations(spec(write(name, text)), skips);
    for (const SkipRecord& r : skips.records()) ADD_FAILURE() << r.message();
    return samples;
  }
  // The reasons a file's samples were skipped, in order.
  std::vector<std::string> skip_reasons(const std::string& name, const std::string& text) const {
    SkipLog skips;
    read_conversations(spec(write(name, text)), skips);
    std::vector<std::string> reasons;
    for (const SkipRecord& r : skips.records()) reasons.push_back(r.reason);
    return reasons;
  }
  static std::string text_of(const std::vector<Conversation>& samples) {
    std::string out;
    for (const Conversation& c : samples) {
      for (const Message& m : c.messages)
        out += std::to_string(static_cast<int>(m.role)) + ":" + m.content + "|";
      for (const std::string& image : c.images) out += "img:" + image + "|";
      out += "\n";
    }
    return out;
  }

  checkpoint::testing::TempDir scratch_;
  std::string dir_ = scratch_.path().string();
};

// Two samples, as the plain messages file writes them.
constexpr const char* kPlain = R"([
{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "<image>What is it?"},
              {"role": "assistant", "content": "A cat."}], "images": ["a.jpg"]},
{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
              {"role": "user", "content": "Two: <image> and <image>"}, {"role": "assistant", "content": "Dogs."}],
 "images": ["b.jpg", "c.jpg"]}
])";

TEST_F(DatasetFormatsTest, EveryFormatGivesThePlainMessagesFilesConversations) {
  const std::string plain = text_of(read("plain.json", kPlain));
  ASSERT_NE(plain, "");
  // ShareGPT, JSON lines, the system prompt as a field and a single image as a string.
  EXPECT_EQ(
      text_of(read(
          "sharegpt.jsonl",
          R"({"conversations": [{"from": "human", "value": "<image>What is it?"}, {"from": "gpt", "value": "A cat."}], "system": "Be brief.", "images": "a.jpg"}
{"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello"}, {"from": "human", "value": "Two: <image> and <image>"}, {"from": "gpt", "value": "Dogs."}], "images": ["b.jpg", "c.jpg"]}
)")),
      plain);
  // Content-part lists, paths in the parts (file:// and image_url included) or in "images".
  EXPECT_EQ(text_of(read("parts.json", R"([
{"messages": [{"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
              {"role": "user", "content": [{"type": "image", "image": "a.jpg"}, {"type": "text", "text": "What is it?"}]},
              {"role": "assistant", "content": [{"type": "text", "text": "A cat."}]}]},
{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
              {"role": "user", "content": [{"type": "text", "text": "Two: "}, {"type": "image"},
                                           {"type": "text", "text": " and "}, {"type": "image_url"}]},
              {"role": "assistant", "content": "Dogs."}], "images": ["b.jpg", "c.jpg"]}
])")),
            plain);
  // Alpaca: the history's pairs, then the instruction and input joined by a line break.
  const std::string alpaca = text_of(read("alpaca.json", R"([
{"instruction": "<image>What is it?", "output": "A cat.", "system": "Be brief.", "images": "a.jpg"},
{"instruction": "Two:", "input": "<image> and <image>", "output": "Dogs.", "history": [["Hi", "Hello"]],
 "images": ["b.jpg", "c.jpg"]}
])"));
  std::string expected = plain;
  expected.replace(expected.find("Two: <image>"), 12, "Two:\n<image>");
  EXPECT_EQ(alpaca, expected);
}

TEST_F(DatasetFormatsTest, DetectionNamesWhatItFoundOrTheKeysItSaw) {
  SkipLog skips;
  const nlohmann::ordered_json sharegpt =
      nlohmann::ordered_json::parse(R"({"conversations": [{"from": "human", "value": "x"}]})");
  EXPECT_EQ(detect_format(sharegpt, "f").description(), "sharegpt (conversations: from/value, human/gpt)");
  const nlohmann::ordered_json listed =
      nlohmann::ordered_json::parse(R"({"conversations": [{"role": "user", "content": "x"}]})");
  EXPECT_EQ(detect_format(listed, "f").description(),
            "messages (conversations: role/content, user/assistant)");
  EXPECT_EQ(detect_format(nlohmann::ordered_json::parse(R"({"instruction": "x", "output": "y"})"), "f")
                .description(),
            "alpaca (instruction / input / output, history)");
  const std::string message = message_of(
      [&] { read_conversations(spec(write("odd.json", R"([{"dialog": [], "pics": []}])")), skips); });
  EXPECT_TRUE(
      says_all(message, {"odd.json: cannot tell its format from its first sample (keys: dialog, pics)",
                         "give the file's format and fields"}))
      << message;
}

TEST_F(DatasetFormatsTest, MalformedToolCallsUrlsAndDifferingSystemPromptsAreBadSamples) {
  EXPECT_EQ(
      skip_reasons(
          "bad.jsonl",
          R"({"conversations": [{"from": "human", "value": "x"}, {"from": "function_call", "value": "{}"}]}
{"conversations": [{"from": "human", "value": "x"}, {"from": "gpt", "value": "y"}], "tools": "[{\"name\": \"f\"}]]"}
{"conversations": [{"from": "human", "value": "x"}, {"from": "gpt", "value": "y"}], "tools": [{"description": "f"}]}
{"conversations": [{"from": "human", "value": [{"type": "image_url", "image_url": {"url": "https://x/a.jpg"}}]}, {"from": "gpt", "value": "y"}]}
{"conversations": [{"from": "system", "value": "A"}, {"from": "human", "value": "x"}, {"from": "gpt", "value": "y"}], "system": "B"}
{"conversations": [{"from": "human", "value": [{"type": "image", "image": "a.jpg"}, {"type": "image"}]}, {"from": "gpt", "value": "y"}]}
{"conversations": [{"from": "human", "value": [{"type": "image", "path": "a.jpg"}]}, {"from": "gpt", "value": "y"}], "images": ["b.jpg"]}
{"conversations": [{"from": "human", "value": [{"type": "table"}]}, {"from": "gpt", "value": "y"}]}
{"conversations": [{"from": "human", "value": "x"}, {"from": "gpt", "value": "y"}], "system": "A"}
)"),
      (std::vector<std::string>{
          "message 1 (role \"function_call\"): tool call 0 is not an object with a string \"name\" and "
          "\"arguments\"",
          "\"tools\": the tool list is a string that is not JSON: [json.exception.parse_error.101] parse "
          "error at "
          "line 1, column 16: syntax error while parsing value - unexpected ']'; expected end of input",
          "\"tools\": tool 0 is not a function description (an object with a \"name\")",
          "message 0 content part 0 (image_url): it names https://...; Loom reads local files, not URLs or "
          "inline data",
          "its system message and its \"system\" field differ; give one",
          "some content parts give a path and 1 do not; give every path in its part or all in \"images\"",
          "content parts give paths and so does \"images\"; give them in one place",
          "message 0 content part 0 has unknown type \"table\"; Loom reads text, image, image_url, video and "
          "video_url parts",
      }));
  EXPECT_EQ(
      skip_reasons(
          "bad_calls.jsonl",
          R"({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [{"function": {"name": "f"}}]}]}
{"messages": [{"role": "user", "content": "x"}, {"role": "tool", "content": "2"}, {"role": "assistant", "content": "y"}]}
)"),
      (std::vector<std::string>{
          "message 1 \"tool_calls\": tool call 0 is not an object with a string \"name\" and \"arguments\"",
          "message 1 is a user message where an assistant message must come (after an optional first system "
          "message, user and assistant messages alternate, starting with user)"}));
}

TEST_F(DatasetFormatsTest, AudioIsAnErrorNamingTheField) {
  SkipLog skips;
  const std::string audio = write("audio.json", R"([
{"messages": [{"role": "user", "content": "<audio>What is said?"}, {"role": "assistant", "content": "Hi."}],
 "audios": ["a.mp3"]}])");
  std::string message = message_of([&] { read_conversations(spec(audio), skips); });
  EXPECT_EQ(message,
            "conversation dataset " + audio +
                " sample 0 has \"audios\": Loom's models have no audio encoder; remove the field or the "
                "dataset");
  const std::string part = write("audio_part.json", R"([
{"messages": [{"role": "user", "content": [{"type": "input_audio"}]}, {"role": "assistant", "content": "Hi."}]}])");
  message = message_of([&] { read_conversations(spec(part), skips); });
  EXPECT_TRUE(says_all(message, {part + " sample 0 message 0 has an audio part (\"input_audio\")"}))
      << message;
}

// The tool section Qwen's chat template appends to the system message, for one get_weather tool
// whose keys are not in sorted order (they stay as the file has them).
const std::string kWeatherTools =
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided "
    "with function signatures within <tools></tools> XML tags:\n<tools>\n"
    R"({"type": "function", "function": {"name": "get_weather", "description": "Current weather", )"
    R"("parameters": {"type": "object", "properties": {"unit": {"type": "string", "enum": ["c", "f"]}, )"
    R"("city": {"type": "string"}}, "required": ["city"]}}})"
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\n</tool_call>";

TEST_F(DatasetFormatsTest, ToolTurnsAreWrittenAsQwensChatTemplateWritesThem) {
  // LLaMA-Factory's ShareGPT tool data: the tools and each call as JSON text, the result as text.
  const std::vector<Conversation> sharegpt = read(
      "tools.jsonl",
      R"({"conversations": [{"from": "human", "value": "Weather in Zürich and Paris?"}, )"
      R"({"from": "function_call", "value": "[{\"name\": \"get_weather\", \"arguments\": {\"unit\": \"c\", \"city\": \"Zürich\"}}, )"
      R"({\"name\": \"get_weather\", \"arguments\": {\"unit\": \"c\", \"city\": \"Paris\"}}]"}, )"
      R"({"from": "observation", "value": "{\"temp\": 3.5}"}, {"from": "gpt", "value": "3.5 °C in Zürich."}], )"
      R"("tools": "[{\"name\": \"get_weather\", \"description\": \"Current weather\", \"parameters\": )"
      R"({\"type\": \"object\", \"properties\": {\"unit\": {\"type\": \"string\", \"enum\": [\"c\", \"f\"]}, )"
      R"(\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}]"})"
      "\n");
  ASSERT_EQ(sharegpt.size(), 1u);
  EXPECT_EQ(sharegpt[0].tools, kWeatherTools);
  const std::string calls =
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"unit\": \"c\", \"city\": \"Zürich\"}}\n"
      "</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"unit\": \"c\", \"city\": "
      "\"Paris\"}}\n</tool_call>";
  EXPECT_EQ(text_of(sharegpt),
            "1:Weather in Zürich and Paris?|2:" + calls +
                "|1:<tool_response>\n{\"temp\": 3.5}\n</tool_response>|2:3.5 °C in Zürich.|\n");

  // OpenAI's: the tools as objects, the calls in "tool_calls" beside the reply's text (arguments as
  // JSON text, written as they are), each result a "tool" message; consecutive results are one turn.
  const std::vector<Conversation> openai = read("tools.json", R"([
{"messages": [{"role": "user", "content": "Weather in Zürich and Paris?"},
              {"role": "assistant", "content": "Checking.", "tool_calls": [
                 {"type": "function", "function": {"name": "get_weather", "arguments": {"unit": "c", "city": "Zürich"}}},
                 {"type": "function", "function": {"name": "get_weather", "arguments": "{\"unit\":\"c\",\"city\":\"Paris\"}"}}]},
              {"role": "tool", "content": "{\"temp\": 3.5}"}, {"role": "tool", "content": "{\"temp\": 9}"},
              {"role": "assistant", "content": "3.5 °C and 9 °C."}],
 "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Current weather",
            "parameters": {"type": "object", "properties": {"unit": {"type": "string", "enum": ["c", "f"]},
                           "city": {"type": "string"}}, "required": ["city"]}}}]}
])");
  ASSERT_EQ(openai.size(), 1u);
  EXPECT_EQ(openai[0].tools, kWeatherTools);
  std::string openai_calls = calls;
  openai_calls.replace(openai_calls.find(R"({"unit": "c", "city": "Paris"})"), 30,
                       R"({"unit":"c","city":"Paris"})");
  EXPECT_EQ(text_of(openai), "1:Weather in Zürich and Paris?|2:Checking.\n" + openai_calls +
                                 "|1:<tool_response>\n{\"temp\": 3.5}\n</tool_response>\n<tool_response>\n"
                                 "{\"temp\": 9}\n</tool_response>|2:3.5 °C and 9 °C.|\n");
}

TEST_F(DatasetFormatsTest, PythonJsonWritesAsJsonDumps) {
  // As Python's json.dumps(value, ensure_ascii=False) gives them.
  const auto dumped = [](const char* text) { return python_json(nlohmann::ordered_json::parse(text)); };
  EXPECT_EQ(dumped(R"({"b":[1,2.0,-0.0,1e-5,0.0001,1e15,1e16,123.456,1.5e300],"a":{"z":null,"y":true}})"),
            R"({"b": [1, 2.0, -0.0, 1e-05, 0.0001, 1000000000000000.0, 1e+16, 123.456, 1.5e+300], )"
            R"("a": {"z": null, "y": true}})");
  EXPECT_EQ(dumped(R"(["Zürich \"q\" \\ \n\t\u0001 😀", [], {}])"),
            R"(["Zürich \"q\" \\ \n\t\u0001 😀", [], {}])");
}

// A registry in LLaMA-Factory's layout, with look-alikes of its multimodal demo entries.
constexpr const char* kRegistry = R"({
  "demo": {"file_name": "demo.json", "formatting": "sharegpt", "columns": {"messages": "messages", "images": "images"},
           "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"}},
  "plain_alpaca": {"file_name": "alpaca.json"},
  "chats": {"file_name": "chats.jsonl", "formatting": "sharegpt", "columns": {"messages": "dialog", "system": "sys"}},
  "hub": {"hf_hub_url": "someone/data", "ms_hub_url": "someone/data"},
  "both": {"hf_hub_url": "someone/data", "file_name": "demo.json"},
  "prefs": {"file_name": "demo.json", "ranking": true},
  "kto": {"file_name": "demo.json", "formatting": "sharegpt", "columns": {"messages": "messages", "kto_tag": "label"}},
  "sampled": {"file_name": "demo.json", "num_samples": 10},
  "folder": {"file_name": "media"},
  "csv": {"file_name": "table.csv"}
})";

TEST_F(DatasetFormatsTest, ARegistryEntryIsReadAsLlamaFactoryDescribesIt) {
  const std::string info = write("dataset_info.json", kRegistry);
  DatasetSpec demo = registry_dataset(info, "demo");
  EXPECT_EQ(demo.path, dir_ + "/demo.json");
  EXPECT_EQ(demo.root, dir_);
  EXPECT_EQ(demo.format, DatasetFormat::sharegpt);
  EXPECT_EQ(demo.fields.messages, "messages");
  EXPECT_EQ(demo.fields.role, "role");
  EXPECT_EQ(demo.fields.user, "user");
  EXPECT_EQ(demo.fields.observation, "observation");  // sharegpt's, where tags do not say
  EXPECT_EQ(registry_dataset(info, "plain_alpaca").format, DatasetFormat::alpaca);  // the default formatting
  const DatasetSpec chats = registry_dataset(info, "chats");
  EXPECT_EQ(chats.fields.messages, "dialog");
  EXPECT_EQ(chats.fields.system_prompt, "sys");
  EXPECT_EQ(chats.fields.role, "from");

  // Media paths are relative to the registry's directory, as in LLaMA-Factory.
  std::filesystem::create_directories(dir_ + "/sub");
  write("sub/demo.json",
        R"([{"messages": [{"role": "user", "content": "<image>x"}, {"role": "assistant", "content": "y"}],
                             "images": ["media/1.jpg"]}])");
  const std::string nested =
      write("nested_info.json", R"({"d": {"file_name": "sub/demo.json", "formatting": "sharegpt",
    "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user", "assistant_tag": "assistant"},
    "columns": {"messages": "messages"}}})");
  SkipLog skips;
  const auto samples = read_conversations(registry_dataset(nested, "d"), skips);
  ASSERT_EQ(samples.size(), 1u);
  EXPECT_EQ(samples[0].images, (std::vector<std::string>{dir_ + "/media/1.jpg"}));
}

TEST_F(DatasetFormatsTest, WhatARegistryEntryCannotGiveIsRefusedByName) {
  const std::string info = write("dataset_info.json", kRegistry);
  std::filesystem::create_directories(dir_ + "/media");
  const std::string at = "dataset registry " + info;
  auto error = [&](const std::string& name) { return message_of([&] { registry_dataset(info, name); }); };
  EXPECT_EQ(error("demmo"), at + " holds no dataset 'demmo'; did you mean 'demo'?");
  EXPECT_TRUE(says_all(error("hub"),
                       {at + " entry 'hub': hf_hub_url 'someone/data'", "Loom reads local files only"}));
  EXPECT_TRUE(
      says_all(error("both"), {at + " entry 'both': hf_hub_url", "give its file_name without hf_hub_url"}));
  EXPECT_TRUE(says_all(error("prefs"), {at + " entry 'prefs': ranking: true is preference data"}));
  EXPECT_TRUE(says_all(error("kto"), {at + " entry 'kto': columns.kto_tag is preference or KTO data"}));
  EXPECT_TRUE(says_all(error("sampled"), {at + " entry 'sampled': num_samples is not supported"}));
  EXPECT_TRUE(says_all(error("folder"), {at + " entry 'folder': file_name " + dir_ + "/media is a folder"}));
  EXPECT_TRUE(says_all(error("csv"), {at + " entry 'csv': file_name table.csv: Loom reads JSON"}));

  // A key LLaMA-Factory does not define, in any entry, is an error whichever entry is asked for.
  const std::string typo = write("typo_info.json", R"({"a": {"file_name": "a.json"},
    "b": {"file_name": "b.json", "columns": {"message": "conversations"}}})");
  EXPECT_EQ(
      message_of([&] { registry_dataset(typo, "a"); }),
      "dataset registry " + typo +
          " entry 'b' columns: unknown key 'message'; did you mean 'messages'? (valid keys: audios, chosen, "
          "history, images, kto_tag, messages, prompt, query, rejected, response, system, tools, videos)");
  const std::string entry_typo =
      write("entry_typo.json", R"({"a": {"file_name": "a.json", "formating": "sharegpt"}})");
  EXPECT_TRUE(says_all(message_of([&] { registry_dataset(entry_typo, "a"); }),
                       {"entry 'a': unknown key 'formating'; did you mean 'formatting'?"}));
  EXPECT_EQ(message_of([&] { registry_dataset(dir_ + "/none.json", "a"); }),
            "cannot open the dataset registry " + dir_ + "/none.json");
}

}  // namespace
}  // namespace loom::data
