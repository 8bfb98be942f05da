// Questions -> token ids as mindvl.preprocess.TextTokenizer.encode makes them: [CLS] words [SEP], padded.
//
// Normalisation is ASCII only: ASCII letters are lowercased and text is split on ASCII whitespace with
// each ASCII punctuation character its own token (tokenizers' WhitespaceSplit + Punctuation(Isolated),
// or BertPreTokenizer). Python's NFKC / BERT normalisers also fold Unicode (full-width forms, accents,
// Unicode punctuation and spaces); here other bytes pass through unchanged as parts of words.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "assets.h"

namespace mvl {

class Tokenizer {
 public:
  explicit Tokenizer(const Assets &assets);

  // ids int32 (max_text_length,) and mask float32 (1.0 for real tokens); throws RunnerError when the
  // question is empty or longer than max_text_length with [CLS]/[SEP].
  void encode(const std::string &question, std::vector<int32_t> &ids, std::vector<float> &mask) const;

 private:
  std::vector<std::string> split(const std::string &text) const;
  void word_ids(const std::string &word, std::vector<int32_t> &out) const;

  Preprocess pre_;
  std::unordered_map<std::string, int32_t> vocab_;
};

}  // namespace mvl
