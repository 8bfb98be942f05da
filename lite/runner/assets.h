// The device assets a package's lite2/ folder holds (export/lite2_folder.py writes them): preprocess.txt (`key
// value...` lines), vocab.txt (token per line, line index = id) or a SentencePiece model (tokenizer_model), and
// labels.txt (a vqa package) or generation.txt (a generative package: the generation spec and the chat template
// as token ids).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace mvl {

struct Preprocess {
  int batch = 1;
  int image_size = 0;
  std::array<float, 3> image_mean{};
  std::array<float, 3> image_std{};
  int max_text_length = 0;
  int n_mels = 0;
  int max_audio_frames = 0;
  std::string tokenizer;  // "wordlevel", "wordpiece" or "sentencepiece" (a generative package's decoder vocabulary)
  std::string tokenizer_model;  // sentencepiece: the model file, relative to lite2/
  bool lowercase = true;
  std::string continuing_subword_prefix = "##";
  int pad_id = 0, unk_id = 0, cls_id = 0, sep_id = 0;
  std::map<std::string, std::string> graphs;  // graph name -> file, relative to the package
};

// generation.txt: mindvl.engine.decode_loop.GenerationSpec and the chat template's control strings, each
// as the token ids the package's tokenizer gives them (empty when the template has none).
struct Generation {
  int cache_len = 0, layers = 0, vocab_size = 0, width = 0, kv_width = 0;
  int image_tokens = 0, audio_tokens = 0, pad_id = 0, max_new_tokens = 0;
  std::vector<int> buckets, stop_ids, special_ids;
  std::string template_name;
  std::vector<int32_t> bos, user, assistant, end, image_open, image_close, audio_open, audio_close;
};

struct Assets {
  std::string package;  // the package folder
  Preprocess pre;
  std::vector<std::string> vocab;  // id -> token (empty for a SentencePiece package)
  std::vector<std::string> labels;  // answer index -> label (empty for a generative package)
  bool generative = false;  // generation.txt was there
  Generation generation;

  std::string graph_path(const std::string &graph) const;  // the graph's MindIR file; throws when absent
};

// Reads <package>/lite2/{preprocess,vocab}.txt and labels.txt or generation.txt (whichever is there);
// throws RunnerError naming the file and the line.
Assets read_assets(const std::string &package);

}  // namespace mvl
