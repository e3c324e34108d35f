// What Loom's built-in visual question answering sets (shapes_vqa, fashion_mnist) share: the split a
// sample is drawn from, the sample itself, and the vocabulary of their fixed phrasings.
#pragma once
#include <initializer_list>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "loom/data/image/image.h"

namespace loom::data {

enum class Split { train, eval };

struct VqaSample {
  Image image;
  std::string question, answer, question_type;
};

// Every whitespace-separated word of the phrases, sorted and once each; slots such as "{color}",
// which a dataset fills in, are not words.
inline std::vector<std::string> vocabulary_of(
    std::initializer_list<const std::vector<std::string>*> phrase_lists) {
  std::set<std::string> words;
  for (const std::vector<std::string>* phrases : phrase_lists) {
    for (const std::string& phrase : *phrases) {
      std::istringstream in(phrase);
      for (std::string word; in >> word;)
        if (word.front() != '{' || word.back() != '}') words.insert(word);
    }
  }
  return {words.begin(), words.end()};
}

}  // namespace loom::data
