// Questions -> token ids as mindvl.preprocess.TextTokenizer.encode makes them: [CLS] words [SEP], padded; or,
// for a decoder's SentencePiece vocabulary (preprocess.txt `tokenizer sentencepiece`: Gemma's), a chat turn's text
// as mindvl.chat.ChatEncoder reads it, through libsentencepiece (sentencepiece_model.h).
//
// Normalisation is ASCII only: ASCII letters are lowercased and text is split on ASCII whitespace with
// each ASCII punctuation character its own token (tokenizers' WhitespaceSplit + Punctuation(Isolated),
// or BertPreTokenizer). Python's NFKC / BERT normalisers also fold Unicode (full-width forms, accents,
// Unicode punctuation and spaces); here other bytes pass through unchanged as parts of words.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "assets.h"
#include "sentencepiece_model.h"

namespace mvl {

class Tokenizer {
 public:
  // Throws RunnerError when a SentencePiece package's model file is missing or unreadable.
  explicit Tokenizer(const Assets &assets);

  // ids int32 (max_text_length,) and mask float32 (1.0 for real tokens); throws RunnerError when the
  // question is empty or longer than max_text_length with [CLS]/[SEP].
  void encode(const std::string &question, std::vector<int32_t> &ids, std::vector<float> &mask) const;

  // Text taken literally (a user's turn in a chat prompt): its ids without [CLS]/[SEP] or padding, as
  // tokenizers' encode(text, add_special_tokens=False) gives them when no special token is spelt in it.
  // A special token's spelling splits like any text ("[CLS]" -> "[", "cls", "]"), which is what
  // mindvl.chat does to it, so it can never open a turn. SentencePiece: the text cut as ChatEncoder._literal
  // cuts it (each special token's spelling split after its first character), each piece encoded on its own.
  std::vector<int32_t> text_ids(const std::string &text) const;

  // Token ids -> text, as tokenizers' decode(ids, skip_special_tokens=True) for a WordLevel model without
  // a decoder (tokens joined by spaces); WordPiece continuation pieces are joined to their word (without
  // the WordPiece decoder's clean-up of spaces before punctuation). SentencePiece: the library's decode of the
  // ids left (tokenizers' decode of the same vocabulary). `skip`: the special ids.
  std::string decode(const std::vector<int32_t> &ids, const std::vector<int> &skip) const;

 private:
  std::vector<std::string> split(const std::string &text) const;
  void word_ids(const std::string &word, std::vector<int32_t> &out) const;
  void encode_piece(const std::string &piece, std::vector<int32_t> &out) const;

  std::vector<std::string> tokens_;  // id -> token

  Preprocess pre_;
  std::unordered_map<std::string, int32_t> vocab_;
  std::unique_ptr<SentencePieceModel> pieces_;  // SentencePiece packages only
  std::vector<std::string> specials_;  // their special tokens' spellings, longest first
};

}  // namespace mvl
