// A SentencePiece model file read with libsentencepiece (Debian's libsentencepiece-dev, found through pkg-config).
//
// Why a wall of plain types: the runner is compiled with the old std::string ABI (the Lite 2.0 wheel was built
// with GCC 7.3), the distribution's libsentencepiece with the new one, so no std::string may cross between them.
// sentencepiece_model.cc alone is compiled with the new ABI and talks to the library; this header passes only
// bytes (`const char *` + size, std::vector<char>) and ids (std::vector<int>), whose layout both ABIs share.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

namespace mvl {

class SentencePieceModel {
 public:
  // Loads the model file at `path` (a NUL-terminated path); on failure `error` holds the library's message and
  // loaded() is false.
  SentencePieceModel(const char *path, std::vector<char> &error);
  ~SentencePieceModel();
  SentencePieceModel(const SentencePieceModel &) = delete;
  SentencePieceModel &operator=(const SentencePieceModel &) = delete;

  bool loaded() const;
  int pieces() const;  // the model's piece count (ids 0 .. pieces() - 1)

  // The ids of `size` bytes of UTF-8 text, appended to `ids`; false (and `error`) when the library refuses.
  bool encode(const char *text, size_t size, std::vector<int> &ids, std::vector<char> &error) const;

  // The text of `ids` (byte pieces joined into UTF-8, the escaped spaces restored) into `text`.
  bool decode(const std::vector<int> &ids, std::vector<char> &text, std::vector<char> &error) const;

  // The piece of `id` as the model spells it (spaces escaped as U+2581); empty for an id outside the model.
  std::vector<char> piece(int id) const;

 private:
  struct Held;
  std::unique_ptr<Held> held_;
};

}  // namespace mvl
