// The one translation unit that includes libsentencepiece's header: compiled with the new std::string ABI
// (CMakeLists.txt), as the distribution's library was (sentencepiece_model.h says why).
#include "sentencepiece_model.h"

#include <sentencepiece_processor.h>

#include <string>

namespace mvl {
namespace {

void put(const std::string &text, std::vector<char> &out) { out.assign(text.begin(), text.end()); }

}  // namespace

struct SentencePieceModel::Held {
  sentencepiece::SentencePieceProcessor processor;
};

SentencePieceModel::SentencePieceModel(const char *path, std::vector<char> &error) : held_(new Held) {
  const auto status = held_->processor.Load(path);
  if (!status.ok()) {
    put(status.ToString(), error);
    held_.reset();
  }
}

SentencePieceModel::~SentencePieceModel() = default;

bool SentencePieceModel::loaded() const { return held_ != nullptr; }

int SentencePieceModel::pieces() const { return held_->processor.GetPieceSize(); }

bool SentencePieceModel::encode(const char *text, size_t size, std::vector<int> &ids, std::vector<char> &error) const {
  std::vector<int> found;
  const auto status = held_->processor.Encode(std::string_view(text, size), &found);
  if (!status.ok()) {
    put(status.ToString(), error);
    return false;
  }
  ids.insert(ids.end(), found.begin(), found.end());
  return true;
}

bool SentencePieceModel::decode(const std::vector<int> &ids, std::vector<char> &text, std::vector<char> &error) const {
  std::string joined;
  const auto status = held_->processor.Decode(ids, &joined);
  if (!status.ok()) {
    put(status.ToString(), error);
    return false;
  }
  put(joined, text);
  return true;
}

std::vector<char> SentencePieceModel::piece(int id) const {
  std::vector<char> out;
  if (id >= 0 && id < pieces()) put(held_->processor.IdToPiece(id), out);
  return out;
}

}  // namespace mvl
