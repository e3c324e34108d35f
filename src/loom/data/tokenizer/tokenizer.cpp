// load_tokenizer: the file's kind picks the tokenizer.
#include "loom/data/tokenizer/tokenizer.h"

#include <fstream>
#include <nlohmann/json.hpp>

#include "loom/data/tokenizer/bpe_tokenizer.h"
#include "loom/data/tokenizer/sentencepiece_tokenizer.h"
#include "loom/data/tokenizer/word_tokenizer.h"
#include "loom/util/errors.h"
#include "loom/util/filesystem.h"

namespace loom::data {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& path) {
  if (const std::string why = unreadable_file_reason(path); !why.empty())
    throw DataError(fmt::format("cannot read tokenizer file {}: it {}", path, why));
  if (ends_with(path, ".model")) {
    return std::make_unique<SentencePieceTokenizer>(SentencePieceTokenizer::load(path));
  }
  if (!ends_with(path, ".json")) {
    throw DataError(fmt::format(
        "tokenizer file {} is neither a HuggingFace tokenizer .json nor a SentencePiece .model file", path));
  }
  std::ifstream file(path, std::ios::binary);
  if (!file) throw DataError(fmt::format("cannot open tokenizer file {}", path));
  nlohmann::json root;
  try {
    root = nlohmann::json::parse(file);
  } catch (const nlohmann::json::exception& e) {
    throw DataError(fmt::format("tokenizer file {} is not valid JSON: {}", path, e.what()));
  }
  const nlohmann::json type = root.is_object() && root.contains("model") && root["model"].is_object()
                                  ? root["model"].value("type", nlohmann::json())
                                  : nlohmann::json();
  if (type == "BPE") return std::make_unique<BpeTokenizer>(BpeTokenizer::from_json(root, path));
  if (type == "WordLevel") return std::make_unique<WordTokenizer>(WordTokenizer::load(path));
  throw DataError(fmt::format("tokenizer file {}: model.type is {}; Loom reads \"BPE\" and \"WordLevel\"",
                              path, type.is_null() ? "missing" : type.dump()));
}

}  // namespace loom::data
