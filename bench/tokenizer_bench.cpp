// Throughput of BpeTokenizer encode and decode (MB/s of UTF-8 text) on English-like prose, Chinese
// and Python-like code generated here, with the piece cache warm and (nearly) cold.
//
//   build/loom_bench_tokenizer [--tokenizer=PATH] [Google Benchmark flags]
//
// PATH defaults to the Qwen3 tokenizer.json in tests/fixtures/tokenizers.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "loom/data/tokenizer/bpe_tokenizer.h"

namespace {

using loom::data::BpeTokenizer;

std::string g_tokenizer_path = LOOM_SOURCE_DIR "/tests/fixtures/tokenizers/qwen3_tokenizer.json";

const BpeTokenizer& tokenizer() {
  static const BpeTokenizer loaded = BpeTokenizer::load(g_tokenizer_path);
  return loaded;
}

// ---------------------------------------------------------------------------------------------
// Text generators. Each writes about `bytes` bytes of text from a fixed seed. With rare = true,
// English and code words are made of 3-4 syllables from a fixed list (about 4 * 10^7 words)
// instead of being drawn from the word list, so that a piece seldom repeats.

const std::vector<const char*> kWords = {
    "the",       "of",       "and",         "to",        "in",         "is",     "that",      "for",
    "it",        "as",       "was",         "with",      "be",         "by",     "on",        "not",
    "he",        "this",     "are",         "or",        "his",        "from",   "at",        "which",
    "but",       "have",     "an",          "had",       "they",       "you",    "were",      "their",
    "one",       "all",      "we",          "can",       "her",        "has",    "there",     "been",
    "if",        "more",     "when",        "will",      "would",      "who",    "so",        "no",
    "time",      "people",   "year",        "way",       "day",        "man",    "thing",     "woman",
    "life",      "child",    "world",       "school",    "state",      "family", "student",   "group",
    "country",   "problem",  "hand",        "part",      "place",      "case",   "week",      "company",
    "system",    "program",  "question",    "work",      "government", "number", "night",     "point",
    "home",      "water",    "room",        "mother",    "area",       "money",  "story",     "fact",
    "month",     "lot",      "right",       "study",     "book",       "eye",    "job",       "word",
    "business",  "issue",    "side",        "kind",      "head",       "house",  "service",   "friend",
    "father",    "power",    "hour",        "game",      "line",       "end",    "member",    "law",
    "car",       "city",     "community",   "name",      "president",  "team",   "minute",    "idea",
    "kid",       "body",     "information", "back",      "parent",     "face",   "others",    "level",
    "office",    "door",     "health",      "person",    "art",        "war",    "history",   "party",
    "result",    "change",   "morning",     "reason",    "research",   "girl",   "guy",       "moment",
    "air",       "teacher",  "force",       "education", "good",       "new",    "first",     "last",
    "long",      "great",    "little",      "own",       "other",      "old",    "big",       "high",
    "different", "small",    "large",       "next",      "early",      "young",  "important", "few",
    "public",    "bad",      "same",        "able",      "make",       "know",   "take",      "see",
    "come",      "think",    "look",        "want",      "give",       "use",    "find",      "tell",
    "ask",       "seem",     "feel",        "try",       "leave",      "call",   "keep",      "begin",
    "show",      "hear",     "play",        "run",       "move",       "live",   "believe",   "bring",
    "happen",    "write",    "provide",     "sit",       "stand",      "lose",   "pay",       "meet",
    "include",   "continue", "learn",       "lead",      "understand", "watch",  "follow",    "stop",
};

const std::vector<const char*> kSyllables = {
    "ba", "be", "bi",  "bo", "bu",  "ca",  "ce", "ci", "co", "da", "de", "di",  "do",   "fa",   "fe",   "fi",
    "ga", "ge", "go",  "ha", "he",  "hi",  "ja", "ka", "ke", "la", "le", "li",  "lo",   "lu",   "ma",   "me",
    "mi", "mo", "na",  "ne", "ni",  "no",  "pa", "pe", "pi", "po", "ra", "re",  "ri",   "ro",   "sa",   "se",
    "si", "so", "ta",  "te", "ti",  "to",  "va", "ve", "vi", "wa", "we", "za",  "ther", "tion", "ment", "ing",
    "er", "ly", "est", "al", "ous", "ive", "an", "en", "in", "on", "un", "str", "pl",   "gr",   "tr",   "br",
};

// Common Chinese characters; a sentence is runs of them between punctuation.
const char* const kChineseCharacters =
    "的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动同工也能下过子说产种面而"
    "方后"
    "多定行学法所民得经十三之进着等部度家电力里如水化高自二理起小物现实加量都两体制机当使点从业本去把性好应开"
    "它合"
    "还因由其些然前外天政四日那社义事平形相全表间样与关各重新线内数正心反你明看原又么利比或但质气第向道命此变"
    "条只"
    "没结解问意建月公无系军很情者最立代想已通并提直题党程展五果料象员革位入常文总次品式活设及管特件长求老头基"
    "资边"
    "流路级少图山统接知较将组见计别她手角期根论运农指几九区强放决西被干做必战先回则任取据处府研质";

const std::vector<std::string>& chinese_characters() {
  static const std::vector<std::string> chars = [] {
    std::vector<std::string> out;
    for (size_t i = 0; kChineseCharacters[i] != '\0'; i += 3)
      out.emplace_back(kChineseCharacters + i, 3);  // 3-byte UTF-8
    return out;
  }();
  return chars;
}

std::string rare_word(std::mt19937_64& rng) {
  std::string word;
  const int syllables = 3 + static_cast<int>(rng() % 2);
  for (int i = 0; i < syllables; ++i) word += kSyllables[rng() % kSyllables.size()];
  return word;
}

std::string word(std::mt19937_64& rng, bool rare) {
  return rare ? rare_word(rng) : std::string(kWords[rng() % kWords.size()]);
}

std::string english(size_t bytes, uint64_t seed, bool rare) {
  std::mt19937_64 rng(seed);
  std::string text;
  while (text.size() < bytes) {
    const int words = 5 + static_cast<int>(rng() % 15);
    for (int i = 0; i < words; ++i) {
      std::string w = word(rng, rare);
      if (i == 0) w[0] = static_cast<char>(w[0] - 'a' + 'A');
      text += w;
      if (i + 1 < words) text += (rng() % 9 == 0) ? ", " : " ";
    }
    const char* ends[] = {". ", ". ", ". ", "? ", "! ", ".\n\n"};
    text += ends[rng() % 6];
  }
  return text;
}

std::string chinese(size_t bytes, uint64_t seed) {
  const auto& chars = chinese_characters();
  std::mt19937_64 rng(seed);
  std::string text;
  while (text.size() < bytes) {
    const int run = 2 + static_cast<int>(rng() % 11);
    for (int i = 0; i < run; ++i) text += chars[rng() % chars.size()];
    const char* punctuation[] = {"，", "，", "。", "、", "；", "？", "！", "。\n"};
    text += punctuation[rng() % 8];
  }
  return text;
}

std::string code(size_t bytes, uint64_t seed, bool rare) {
  std::mt19937_64 rng(seed);
  auto name = [&] { return word(rng, rare) + "_" + word(rng, rare); };
  std::string text;
  while (text.size() < bytes) {
    const std::string fn = name(), arg = name(), acc = name();
    text += "def " + fn + "(" + arg + ", " + word(rng, rare) + "=None):\n";
    text += "    \"\"\"Return the " + word(rng, rare) + " of " + word(rng, rare) + ".\"\"\"\n";
    text += "    " + acc + " = []\n";
    text += "    for i in range(" + std::to_string(rng() % 1000) + "):\n";
    text += "        if " + arg + "[i] > " + std::to_string(rng() % 100) + ":\n";
    text += "            " + acc + ".append(" + arg + "[i] * " + std::to_string(rng() % 10) + ")\n";
    text += "    return {\"" + word(rng, rare) + "\": " + acc + ", 'n': len(" + acc + ")}\n\n\n";
  }
  return text;
}

enum Kind { kEnglish, kChinese, kCode };

std::string generate(Kind kind, size_t bytes, uint64_t seed, bool rare) {
  switch (kind) {
    case kEnglish:
      return english(bytes, seed, rare);
    case kChinese:
      return chinese(bytes, seed);
    case kCode:
      return code(bytes, seed, rare);
  }
  return {};
}

constexpr size_t kChunkBytes = 64 << 10;
constexpr size_t kColdChunks = 128;  // 8 MB per kind

// ---------------------------------------------------------------------------------------------
// Benchmarks

// Warm: the same 64 KB text every iteration, encoded once before timing, so every piece is found
// in the tokenizer's piece cache. This is the common case in training, where words repeat.
void BM_EncodeWarm(benchmark::State& state, Kind kind) {
  const BpeTokenizer& tok = tokenizer();
  const std::string text = generate(kind, kChunkBytes, 1, /*rare=*/false);
  const size_t tokens = tok.encode(text).size();
  for (auto _ : state) benchmark::DoNotOptimize(tok.encode(text));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
  state.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(state.iterations() * tokens), benchmark::Counter::kIsRate);
}

// Cold: a fresh tokenizer per iteration, or one with the cache turned off, is not possible (loading
// takes far longer than an encode, and the cache has no switch). Instead each iteration encodes the
// next 64 KB of an 8 MB corpus of rare words (English and code) or random character runs (Chinese),
// where most pieces occur once: the cache (2^18 pieces, emptied when full) has usually dropped a
// piece before it comes round again. Spaces, punctuation and short pieces still hit the cache.
void BM_EncodeCold(benchmark::State& state, Kind kind) {
  const BpeTokenizer& tok = tokenizer();
  static std::vector<std::string> corpora[3];
  static size_t next[3] = {0, 0, 0};  // carries on through the corpus across runs of this benchmark
  std::vector<std::string>& corpus = corpora[kind];
  if (corpus.empty()) {
    for (size_t i = 0; i < kColdChunks; ++i) corpus.push_back(generate(kind, kChunkBytes, 1000 + i, true));
  }
  int64_t bytes = 0, tokens = 0;
  for (auto _ : state) {
    const std::string& text = corpus[next[kind]++ % corpus.size()];
    const std::vector<int64_t> ids = tok.encode(text);
    bytes += static_cast<int64_t>(text.size());
    tokens += static_cast<int64_t>(ids.size());
  }
  state.SetBytesProcessed(bytes);
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(tokens), benchmark::Counter::kIsRate);
}

// Decode has no cache: ids to bytes, joined, then checked as UTF-8.
void BM_Decode(benchmark::State& state, Kind kind) {
  const BpeTokenizer& tok = tokenizer();
  const std::string text = generate(kind, kChunkBytes, 1, /*rare=*/false);
  const std::vector<int64_t> ids = tok.encode(text);
  if (tok.decode(ids) != text) {
    state.SkipWithError("decode(encode(text)) differs from text");
    return;
  }
  for (auto _ : state) benchmark::DoNotOptimize(tok.decode(ids));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * text.size()));
  state.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(state.iterations() * ids.size()), benchmark::Counter::kIsRate);
}

BENCHMARK_CAPTURE(BM_EncodeWarm, english, kEnglish)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_EncodeWarm, chinese, kChinese)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_EncodeWarm, code, kCode)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_EncodeCold, english, kEnglish)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_EncodeCold, chinese, kChinese)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_EncodeCold, code, kCode)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Decode, english, kEnglish)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Decode, chinese, kChinese)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(BM_Decode, code, kCode)->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  // --tokenizer=PATH is ours; the rest go to Google Benchmark.
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], "--tokenizer=", 12) == 0) {
      g_tokenizer_path = argv[i] + 12;
    } else {
      argv[kept++] = argv[i];
    }
  }
  argc = kept;
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  try {
    tokenizer();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loom_bench_tokenizer: error: %s\n", e.what());
    return 1;
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
