// Conversation datasets: reading JSON and JSONL fixtures (tests/fixtures/conversations, made by
// make.py), every bad-input case with its count and message, and the weighted mix.
#include "loom/data/conversation.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>
#include <thread>

#include "data_test_util.h"
#include "loom/util/errors.h"

using namespace loom::data;
using loom::ConfigError;
using loom::DataError;
using loom::test::counts_of;
using loom::test::message_of;
using loom::test::says_all;

namespace {

const std::string kDir = std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/conversations";

DatasetSpec spec(const std::string& name, double weight = 1.0) {
  DatasetSpec s;
  s.path = kDir + "/" + name;
  s.weight = weight;
  return s;
}

// Dataset d of `sizes` as conversations whose index is the sample's position and source "d<d>".
std::vector<std::vector<Conversation>> synthetic(const std::vector<int>& sizes) {
  std::vector<std::vector<Conversation>> datasets;
  for (size_t d = 0; d < sizes.size(); ++d) {
    std::vector<Conversation> samples(sizes[d]);
    for (int i = 0; i < sizes[d]; ++i) {
      samples[i].messages = {{Role::user, "q"}, {Role::assistant, "a"}};
      samples[i].source = "d" + std::to_string(d);
      samples[i].index = i;
    }
    datasets.push_back(std::move(samples));
  }
  return datasets;
}

Conversation conversation(std::vector<Message> messages, std::vector<std::string> images = {}) {
  Conversation c;
  c.messages = std::move(messages);
  c.images = std::move(images);
  return c;
}

}  // namespace

TEST(ReadConversations, JsonArrayWithRolesSystemAndImages) {
  SkipLog skips;
  DatasetSpec s = spec("chat.json");
  s.root = "/data/root";
  const std::vector<Conversation> samples = read_conversations(s, skips);
  ASSERT_EQ(samples.size(), 6u);
  EXPECT_EQ(skips.counts().total(), 0);
  for (size_t i = 0; i < samples.size(); ++i) {
    EXPECT_EQ(samples[i].index, static_cast<int64_t>(i));
    EXPECT_EQ(samples[i].source, s.path);
  }
  const Conversation& c = samples[1];
  ASSERT_EQ(c.messages.size(), 3u);
  EXPECT_EQ(c.messages[0].role, Role::system);
  EXPECT_EQ(c.messages[0].content, "Be brief.");
  EXPECT_EQ(c.messages[1].role, Role::user);
  EXPECT_EQ(c.messages[1].content, "<image>Colour?");
  EXPECT_EQ(c.messages[2].role, Role::assistant);
  EXPECT_EQ(c.messages[2].content, "blue");
  EXPECT_EQ(c.images, (std::vector<std::string>{"/data/root/images/sky.jpg"}));
  // Text-only multi-turn, newlines kept.
  EXPECT_TRUE(samples[2].images.empty());
  ASSERT_EQ(samples[2].messages.size(), 4u);
  EXPECT_EQ(samples[2].messages[0].content, "Line one\n\nLine two");
  EXPECT_EQ(samples[2].messages[3].content, "done");
  EXPECT_EQ(samples[3].images.size(), 2u);
  // An empty "videos" list is no video.
  EXPECT_EQ(samples[4].images, (std::vector<std::string>{"/data/root/images/grey.png"}));
}

TEST(ReadConversations, JsonLinesSkipBlankLinesAndRootDefaultsToTheFilesDirectory) {
  SkipLog skips;
  const std::vector<Conversation> samples = read_conversations(spec("chat.jsonl"), skips);
  ASSERT_EQ(samples.size(), 4u);
  EXPECT_EQ(skips.counts().total(), 0);
  EXPECT_EQ(samples[0].images, (std::vector<std::string>{kDir + "/images/red.png"}));
  EXPECT_EQ(samples[1].messages[0].content, "Short answers.");
  EXPECT_EQ(samples[2].index, 2);  // the blank line is not a sample
  EXPECT_EQ(samples[2].messages[0].content, "Say ok.");
  EXPECT_EQ(samples[3].messages[1].content, "grey");
}

TEST(ReadConversations, ConfigurableFieldNames) {
  DatasetSpec s = spec("sharegpt.jsonl");
  s.fields.messages = "conversations";
  s.fields.images = "pictures";
  s.fields.role = "from";
  s.fields.content = "value";
  s.fields.user = "human";
  s.fields.assistant = "gpt";
  s.fields.system = "prompt";
  SkipLog skips;
  const std::vector<Conversation> samples = read_conversations(s, skips);
  ASSERT_EQ(samples.size(), 3u);
  EXPECT_EQ(skips.counts().total(), 0);
  EXPECT_EQ(samples[0].images, (std::vector<std::string>{kDir + "/images/red.png"}));
  EXPECT_EQ(samples[0].messages[0].role, Role::user);
  EXPECT_EQ(samples[0].messages[1].content, "ok");
  EXPECT_EQ(samples[1].messages[0].role, Role::system);
  EXPECT_EQ(samples[1].messages[0].content, "Be kind.");

  // With the default names none of them has "messages".
  SkipLog defaults;
  EXPECT_TRUE(read_conversations(spec("sharegpt.jsonl"), defaults).empty());
  EXPECT_EQ(defaults.counts().bad_sample, 3);
  EXPECT_EQ(defaults.records()[1].reason, "no \"messages\" field");
}

TEST(ReadConversations, BadSamplesAreSkippedCountedAndExplained) {
  std::vector<std::string> seen;
  SkipLog skips(64, [&](const SkipRecord& r) { seen.push_back(r.message()); });
  const DatasetSpec s = spec("bad_samples.json");
  const std::vector<Conversation> samples = read_conversations(s, skips);
  std::vector<int64_t> kept;
  for (const Conversation& c : samples) kept.push_back(c.index);
  // Missing and corrupt images (6, 7) are only found when the images are read.
  EXPECT_EQ(kept, (std::vector<int64_t>{0, 6, 7, 9}));
  EXPECT_EQ(counts_of(skips), "missing 0, corrupt 0, bad 8");

  const std::vector<SkipRecord> records = skips.records();
  ASSERT_EQ(records.size(), 8u);
  const std::map<int64_t, std::string> reasons = {
      {1, "\"messages\" is empty"},
      {2, "no \"messages\" field"},
      {3,  // a tool's result is a user turn, and cannot follow one
       "message 1 is a user message where an assistant message must come (after an optional first system "
       "message, user and assistant messages alternate, starting with user)"},
      {4,
       "message 0 is an assistant message where a user message must come (after an optional first system "
       "message, user and assistant messages alternate, starting with user)"},
      {5, "2 <image> placeholders but 1 images; each image needs exactly one placeholder"},
      {8, "a sample must be a JSON object, got string"},
      {10, "message 1 has no string \"content\""},
      {11, "message 0 contains the literal token <|image_pad|>; write <image> for an image"},
  };
  size_t r = 0;
  for (const auto& [index, reason] : reasons) {
    EXPECT_EQ(records[r].kind, SkipKind::bad_sample);
    EXPECT_EQ(records[r].file, s.path);
    EXPECT_EQ(records[r].sample_index, index);
    EXPECT_EQ(records[r].reason, reason);
    EXPECT_EQ(seen[r],
              "skipped sample " + std::to_string(index) + " of " + s.path + " (bad sample): " + reason);
    ++r;
  }
}

TEST(ReadConversations, SkipLogKeepsABoundedListButCountsEverything) {
  SkipLog skips(3);
  read_conversations(spec("bad_samples.json"), skips);
  EXPECT_EQ(skips.counts().bad_sample, 8);
  ASSERT_EQ(skips.records().size(), 3u);
  EXPECT_EQ(skips.records()[2].sample_index, 3);
}

TEST(ReadConversations, VideosAreFilesOrFrameLists) {
  SkipLog skips;
  const std::vector<Conversation> samples = read_conversations(spec("videos.json"), skips);
  ASSERT_EQ(samples.size(), 2u);
  EXPECT_EQ(skips.counts().total(), 0);
  ASSERT_EQ(samples[1].videos.size(), 1u);
  EXPECT_EQ(samples[1].videos[0].file, kDir + "/clips/fall.mp4");
  EXPECT_TRUE(samples[1].videos[0].frames.empty());
}

TEST(ReadConversations, MalformedJsonNamesFileAndPosition) {
  SkipLog skips;
  std::string message = message_of<DataError>([&] { read_conversations(spec("malformed.json"), skips); });
  EXPECT_NE(message.find(kDir + "/malformed.json: malformed JSON at line 4, column 2"), std::string::npos)
      << message;
  message = message_of<DataError>([&] { read_conversations(spec("malformed.jsonl"), skips); });
  EXPECT_TRUE(says_all(
      message, {kDir + "/malformed.jsonl: malformed JSON at line 3", "(sample 1, read as JSON lines"}));
  message = message_of<DataError>([&] { read_conversations(spec("no_such_file.json"), skips); });
  EXPECT_EQ(message, "cannot open conversation dataset " + kDir + "/no_such_file.json");
}

TEST(ConversationProblem, RoleOrderPlaceholdersAndEnding) {
  EXPECT_EQ(conversation_problem(conversation({{Role::user, "a"}, {Role::assistant, "b"}})), "");
  EXPECT_EQ(
      conversation_problem(conversation({{Role::system, "s"}, {Role::user, "a"}, {Role::assistant, "b"}})),
      "");
  EXPECT_EQ(conversation_problem(conversation({})), "the conversation has no messages");
  EXPECT_EQ(conversation_problem(conversation({{Role::system, "s"}})),
            "the conversation has a system message but no user message");
  EXPECT_EQ(conversation_problem(conversation({{Role::user, "a"}})),
            "the conversation must end with an assistant message");
  EXPECT_NE(
      conversation_problem(conversation({{Role::user, "a"}, {Role::system, "s"}, {Role::assistant, "b"}}))
          .find("message 1 is a system message where an assistant message must come"),
      std::string::npos);
  EXPECT_NE(
      conversation_problem(conversation({{Role::user, "a"}, {Role::assistant, "b"}, {Role::assistant, "c"}}))
          .find("message 2 is an assistant message where a user message must come"),
      std::string::npos);
  EXPECT_EQ(conversation_problem(conversation({{Role::user, "a"}, {Role::assistant, "<image>"}}, {"x.png"})),
            "message 1 (assistant) has an <image> placeholder; images belong in user messages");
  EXPECT_EQ(conversation_problem(conversation({{Role::user, "a"}, {Role::assistant, "b"}}, {"x.png"})),
            "0 <image> placeholders but 1 images; each image needs exactly one placeholder");
  EXPECT_EQ(count_image_placeholders("<image><image> x <image"), 2);
}

TEST(ChatProblem, AChatMayEndWithAUserMessageAndHasNoImageCount) {
  EXPECT_EQ(chat_problem({{Role::user, "a"}}), "");
  EXPECT_EQ(chat_problem({{Role::system, "s"}, {Role::user, "a"}, {Role::assistant, "b"}, {Role::user, "c"}}),
            "");
  EXPECT_EQ(chat_problem({{Role::user, "<image> a"}}), "");  // placeholders are counted against images later
  EXPECT_EQ(chat_problem({}), "the conversation has no messages");
  EXPECT_EQ(chat_problem({{Role::system, "s"}}), "the conversation has a system message but no user message");
  EXPECT_NE(chat_problem({{Role::user, "a"}, {Role::user, "b"}})
                .find("message 1 is a user message where an assistant message must come"),
            std::string::npos);
  EXPECT_EQ(chat_problem({{Role::user, "a"}, {Role::assistant, "<image>"}}),
            "message 1 (assistant) has an <image> placeholder; images belong in user messages");
  EXPECT_EQ(chat_problem({{Role::user, "see <|image_pad|>"}}),
            "message 0 contains the literal token <|image_pad|>; write <image> for an image");
}

TEST(ConversationMix, QuotasByLargestRemainder) {
  // N = 15; exact shares 15 * (1, 2, 3) / 6 = (2.5, 5, 7.5); the one left over goes to the first of
  // the tied fractions.
  const ConversationMix mix(synthetic({5, 7, 3}), {1, 2, 3}, 0);
  EXPECT_EQ(mix.size(), 15);
  EXPECT_EQ(mix.quota(0), 3);
  EXPECT_EQ(mix.quota(1), 5);
  EXPECT_EQ(mix.quota(2), 7);
  EXPECT_EQ(mix.dataset_size(2), 3);
}

TEST(ConversationMix, EveryEpochHoldsEachDatasetsQuotaAndWindowsFollowTheWeights) {
  // N = 450, weights (0.5, 0.3, 0.2): quotas exactly (225, 135, 90) per epoch.
  const ConversationMix mix(synthetic({100, 300, 50}), {0.5, 0.3, 0.2}, 1234);
  const std::vector<int64_t> quotas = {225, 135, 90};
  const std::vector<double> weights = {0.5, 0.3, 0.2};
  for (size_t d = 0; d < 3; ++d) EXPECT_EQ(mix.quota(d), quotas[d]);
  for (int64_t epoch = 0; epoch < 4; ++epoch) {
    std::vector<int64_t> counts(3, 0);
    for (int64_t i = 0; i < 450; ++i) ++counts[mix.locate(epoch * 450 + i).dataset];
    EXPECT_EQ(counts, quotas) << "epoch " << epoch;
  }
  // Inside an epoch a window of m positions draws without replacement: the count of dataset d is
  // hypergeometric with mean m w_d and variance m w_d (1 - w_d) (N - m) / (N - 1). Every window of
  // 150 stays within 5 standard deviations.
  const int64_t m = 150;
  for (int64_t start = 0; start + m <= 450 * 3; start += m) {
    std::vector<int64_t> counts(3, 0);
    for (int64_t i = start; i < start + m; ++i) ++counts[mix.locate(i).dataset];
    for (size_t d = 0; d < 3; ++d) {
      const double w = weights[d];
      const double sd = std::sqrt(m * w * (1 - w) * (450.0 - m) / 449.0);
      EXPECT_LE(std::abs(counts[d] - m * w), 5 * sd) << "window at " << start << " dataset " << d;
    }
  }
}

TEST(ConversationMix, EachDatasetIsWalkedInFullPassesAcrossEpochs) {
  const ConversationMix mix(synthetic({100, 300, 50}), {0.5, 0.3, 0.2}, 99);
  // Epoch 0: dataset 0 has 225 draws over 100 samples = 2 full passes + 25; dataset 2 has 90 over
  // 50 = 1 pass + 40; dataset 1 has 135 of its 300, all distinct.
  std::vector<std::vector<int>> seen = {std::vector<int>(100), std::vector<int>(300), std::vector<int>(50)};
  for (int64_t i = 0; i < 450; ++i) {
    const MixPosition at = mix.locate(i);
    EXPECT_EQ(at.epoch, 0);
    ++seen[at.dataset][at.sample];
  }
  auto histogram = [](const std::vector<int>& times) {
    std::map<int, int> h;
    for (int t : times) ++h[t];
    return h;
  };
  EXPECT_EQ(histogram(seen[0]), (std::map<int, int>{{2, 75}, {3, 25}}));
  EXPECT_EQ(histogram(seen[1]), (std::map<int, int>{{0, 165}, {1, 135}}));
  EXPECT_EQ(histogram(seen[2]), (std::map<int, int>{{1, 10}, {2, 40}}));
  // Ten epochs: 900 draws of dataset 2 are 18 whole passes, 1350 of dataset 1 are 4.5 passes.
  seen = {std::vector<int>(100), std::vector<int>(300), std::vector<int>(50)};
  for (int64_t i = 0; i < 4500; ++i) {
    const MixPosition at = mix.locate(i);
    ++seen[at.dataset][at.sample];
  }
  EXPECT_EQ(histogram(seen[2]), (std::map<int, int>{{18, 50}}));
  EXPECT_EQ(histogram(seen[1]), (std::map<int, int>{{4, 150}, {5, 150}}));
}

TEST(ConversationMix, DeterministicAcrossInstancesAndThreadsAndReshuffledPerEpoch) {
  const ConversationMix a(synthetic({40, 25, 10}), {1, 1, 2}, 7);
  const ConversationMix b(synthetic({40, 25, 10}), {1, 1, 2}, 7);
  const ConversationMix other_seed(synthetic({40, 25, 10}), {1, 1, 2}, 8);
  const int64_t n = a.size() * 3;
  std::vector<std::pair<size_t, int64_t>> sequential(n);
  int differ_from_other_seed = 0;
  for (int64_t i = 0; i < n; ++i) {
    const MixPosition pa = a.locate(i), pb = b.locate(i), po = other_seed.locate(i);
    ASSERT_EQ(pa.dataset, pb.dataset);
    ASSERT_EQ(pa.sample, pb.sample);
    EXPECT_EQ(pa.epoch, i / a.size());
    sequential[i] = {pa.dataset, pa.sample};
    differ_from_other_seed += pa.dataset != po.dataset || pa.sample != po.sample;
    const Conversation& c = a.sample(i);
    EXPECT_EQ(c.source, "d" + std::to_string(pa.dataset));
    EXPECT_EQ(c.index, pa.sample);
  }
  EXPECT_GT(differ_from_other_seed, n / 2);
  int same_as_epoch0 = 0;
  for (int64_t i = 0; i < a.size(); ++i) same_as_epoch0 += sequential[i] == sequential[i + a.size()];
  EXPECT_LT(same_as_epoch0, a.size() / 4);

  std::vector<std::vector<std::pair<size_t, int64_t>>> threaded(4,
                                                                std::vector<std::pair<size_t, int64_t>>(n));
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int64_t k = 0; k < n; ++k) {
        const int64_t i = (k * 7 + t * 13) % n;  // each thread in its own order
        const Conversation& c = a.sample(i);
        threaded[t][i] = {static_cast<size_t>(c.source[1] - '0'), c.index};
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(threaded[t], sequential) << "thread " << t;
}

TEST(ConversationMix, FromDatasetFilesWithWeights) {
  SkipLog skips;
  // chat.json (6) and bad_samples.json (4 usable): N = 10, weights 1:3 give shares 2.5 and 7.5,
  // the tie going to the first: quotas 3 and 7.
  const ConversationMix mix({spec("chat.json", 1.0), spec("bad_samples.json", 3.0)}, 5, skips);
  EXPECT_EQ(skips.counts().bad_sample, 8);
  EXPECT_EQ(mix.size(), 10);
  EXPECT_EQ(mix.dataset_size(0), 6);
  EXPECT_EQ(mix.dataset_size(1), 4);
  EXPECT_EQ(mix.quota(0), 3);
  EXPECT_EQ(mix.quota(1), 7);
  int from_chat = 0;
  for (int64_t i = 0; i < 10; ++i) from_chat += mix.sample(i).source == kDir + "/chat.json";
  EXPECT_EQ(from_chat, 3);
}

TEST(ConversationMix, RejectsBadWeightsEmptyDatasetsAndNegativeIndices) {
  SkipLog skips;
  EXPECT_EQ(message_of<ConfigError>([&] { ConversationMix({spec("chat.json", 0.0)}, 0, skips); }),
            "conversation dataset " + kDir + "/chat.json: weight 0 must be a positive number");
  EXPECT_THROW(ConversationMix(synthetic({3}), {-1.0}, 0), ConfigError);
  EXPECT_THROW(ConversationMix(synthetic({3}), {std::nan("")}, 0), ConfigError);
  EXPECT_THROW(ConversationMix(synthetic({3, 2}), {1.0}, 0), ConfigError);
  EXPECT_EQ(message_of<DataError>([] {
              ConversationMix(synthetic({3, 0}), {1.0, 1.0}, 0);
            }),
            "conversation dataset dataset 1 has no usable samples");
  EXPECT_EQ(message_of<DataError>([&] { ConversationMix(std::vector<DatasetSpec>{}, 0, skips); }),
            "conversation mix: no datasets given; list at least one");
  const ConversationMix mix(synthetic({3}), {1.0}, 0);
  EXPECT_THROW(mix.locate(-1), DataError);
  EXPECT_THROW(mix.quota(1), DataError);
}
