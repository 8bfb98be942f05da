#include "tokenizer.h"

#include <algorithm>

#include "error.h"

namespace mvl {
namespace {

// the ASCII sets of Rust's char::is_whitespace / is_ascii_punctuation, which tokenizers uses
bool is_space(unsigned char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }
bool is_punct(unsigned char c) {
  return (c >= '!' && c <= '/') || (c >= ':' && c <= '@') || (c >= '[' && c <= '`') || (c >= '{' && c <= '~');
}
bool is_continuation(unsigned char c) { return (c & 0xC0) == 0x80; }  // a UTF-8 byte inside a character

const size_t kMaxWordChars = 100;  // tokenizers' WordPiece max_input_chars_per_word default
const std::string kEscapedSpace = "\xe2\x96\x81";  // U+2581, how SentencePiece spells a space in a piece

std::string text_of(const std::vector<char> &bytes) { return std::string(bytes.begin(), bytes.end()); }

// A piece's spelling as text: its escaped spaces back to spaces.
std::string unescaped(std::string piece) {
  for (size_t at = piece.find(kEscapedSpace); at != std::string::npos; at = piece.find(kEscapedSpace, at + 1)) {
    piece.replace(at, kEscapedSpace.size(), " ");
  }
  return piece;
}

size_t char_bytes(unsigned char lead) { return lead < 0xC0 ? 1 : lead < 0xE0 ? 2 : lead < 0xF0 ? 3 : 4; }

}  // namespace

Tokenizer::Tokenizer(const Assets &assets) : tokens_(assets.vocab), pre_(assets.pre) {
  for (size_t id = 0; id < assets.vocab.size(); ++id) {
    if (!assets.vocab[id].empty()) vocab_.emplace(assets.vocab[id], static_cast<int32_t>(id));
  }
  if (pre_.tokenizer != "sentencepiece") return;
  const std::string path = assets.package + "/lite2/" + pre_.tokenizer_model;
  std::vector<char> error;
  pieces_.reset(new SentencePieceModel(path.c_str(), error));
  if (!pieces_->loaded()) {
    throw RunnerError(path + ": not a readable SentencePiece model (" + text_of(error) +
                      "); export the package again with `mindvl export --target lite2`");
  }
  for (int id : assets.generation.special_ids) {
    std::string spelling = unescaped(text_of(pieces_->piece(id)));
    if (spelling.empty()) {
      throw RunnerError(path + ": special token id " + std::to_string(id) + " of lite2/generation.txt is outside "
                        "the model; export the package again");
    }
    specials_.push_back(spelling);
  }
  // longest first, as ChatEncoder's pattern lists them: at one position the longer spelling wins
  std::stable_sort(specials_.begin(), specials_.end(),
                   [](const std::string &a, const std::string &b) { return a.size() > b.size(); });
}

std::vector<std::string> Tokenizer::split(const std::string &text) const {
  std::vector<std::string> words;
  std::string word;
  auto flush = [&]() {
    if (!word.empty()) words.push_back(word);
    word.clear();
  };
  for (unsigned char c : text) {
    if (pre_.lowercase && c >= 'A' && c <= 'Z') c = static_cast<unsigned char>(c - 'A' + 'a');
    bool control = (c < 0x20 && c != '\t' && c != '\n' && c != '\r') || c == 0x7f;
    if (control && pre_.tokenizer == "wordpiece") continue;  // BERT's normaliser deletes them; NFKC keeps them
    if (is_space(c)) {
      flush();
    } else if (is_punct(c)) {
      flush();
      words.emplace_back(1, static_cast<char>(c));
    } else {
      word += static_cast<char>(c);
    }
  }
  flush();
  return words;
}

// WordLevel: the word or [UNK]. WordPiece: greedy longest-prefix match, the continuation pieces carrying
// the subword prefix ("##"); a word with a part that matches nothing is one [UNK], as in tokenizers.
void Tokenizer::word_ids(const std::string &word, std::vector<int32_t> &out) const {
  auto found = vocab_.find(word);
  if (pre_.tokenizer == "wordlevel") {
    out.push_back(found == vocab_.end() ? pre_.unk_id : found->second);
    return;
  }
  size_t chars = 0;
  for (unsigned char c : word) chars += !is_continuation(c);
  if (chars > kMaxWordChars) {
    out.push_back(pre_.unk_id);
    return;
  }
  std::vector<int32_t> pieces;
  for (size_t start = 0; start < word.size();) {
    size_t end = word.size();
    int32_t piece = -1;
    while (end > start) {
      std::string candidate = (start > 0 ? pre_.continuing_subword_prefix : "") + word.substr(start, end - start);
      auto match = vocab_.find(candidate);
      if (match != vocab_.end()) {
        piece = match->second;
        break;
      }
      do --end;  // back to the previous character boundary
      while (end > start && is_continuation(static_cast<unsigned char>(word[end])));
    }
    if (piece < 0) {
      out.push_back(pre_.unk_id);
      return;
    }
    pieces.push_back(piece);
    start = end;
  }
  out.insert(out.end(), pieces.begin(), pieces.end());
}

void Tokenizer::encode_piece(const std::string &piece, std::vector<int32_t> &out) const {
  if (piece.empty()) return;
  std::vector<int> ids;
  std::vector<char> error;
  if (!pieces_->encode(piece.data(), piece.size(), ids, error)) {
    throw RunnerError("question: SentencePiece could not encode it (" + text_of(error) + ")");
  }
  out.insert(out.end(), ids.begin(), ids.end());
}

std::vector<int32_t> Tokenizer::text_ids(const std::string &text) const {
  std::vector<int32_t> ids;
  if (!pieces_) {
    for (const std::string &word : split(text)) word_ids(word, ids);
    return ids;
  }
  size_t start = 0;  // the text not yet encoded begins here
  for (size_t at = 0; at < text.size();) {
    const std::string *found = nullptr;
    for (const std::string &special : specials_) {
      if (text.compare(at, special.size(), special) == 0) {
        found = &special;
        break;
      }
    }
    if (found == nullptr) {
      ++at;
      continue;
    }
    const size_t first = char_bytes(static_cast<unsigned char>((*found)[0]));
    encode_piece(text.substr(start, at - start), ids);
    encode_piece(found->substr(0, first), ids);
    encode_piece(found->substr(first), ids);
    at += found->size();
    start = at;
  }
  encode_piece(text.substr(start), ids);
  return ids;
}

std::string Tokenizer::decode(const std::vector<int32_t> &ids, const std::vector<int> &skip) const {
  if (pieces_) {
    std::vector<int> kept;
    for (int32_t id : ids) {
      if (std::find(skip.begin(), skip.end(), id) != skip.end()) continue;
      if (id < 0 || id >= pieces_->pieces()) {
        throw RunnerError("token id " + std::to_string(id) + " is outside the SentencePiece model");
      }
      kept.push_back(id);
    }
    std::vector<char> text, error;
    if (!pieces_->decode(kept, text, error)) throw RunnerError("SentencePiece could not decode: " + text_of(error));
    return text_of(text);
  }
  const std::string &prefix = pre_.continuing_subword_prefix;
  std::string text;
  for (int32_t id : ids) {
    if (std::find(skip.begin(), skip.end(), id) != skip.end()) continue;
    if (id < 0 || static_cast<size_t>(id) >= tokens_.size()) throw RunnerError("token id " + std::to_string(id) +
                                                                               " is outside vocab.txt");
    const std::string &token = tokens_[id];
    if (pre_.tokenizer == "wordpiece" && !text.empty() && token.rfind(prefix, 0) == 0) {
      text += token.substr(prefix.size());
    } else {
      text += (text.empty() ? "" : " ") + token;
    }
  }
  return text;
}

void Tokenizer::encode(const std::string &question, std::vector<int32_t> &ids, std::vector<float> &mask) const {
  if (split(question).empty()) throw RunnerError("question: it is empty; ask a question in words");
  std::vector<int32_t> tokens{pre_.cls_id};
  const std::vector<int32_t> words = text_ids(question);
  tokens.insert(tokens.end(), words.begin(), words.end());
  tokens.push_back(pre_.sep_id);
  const size_t limit = static_cast<size_t>(pre_.max_text_length);
  if (tokens.size() > limit) {
    throw RunnerError("question: '" + question + "' is " + std::to_string(tokens.size()) +
                      " tokens with [CLS]/[SEP] but at most " + std::to_string(limit) +
                      " fit (max_text_length in lite2/preprocess.txt); shorten the question");
  }
  ids.assign(limit, pre_.pad_id);
  mask.assign(limit, 0.0f);
  for (size_t i = 0; i < tokens.size(); ++i) {
    ids[i] = tokens[i];
    mask[i] = 1.0f;
  }
}

}  // namespace mvl
