// The device assets a package's lite2/ folder holds (export/lite2.py device_assets writes them):
// preprocess.txt (`key value...` lines), vocab.txt (token per line, line index = id), labels.txt.
#pragma once

#include <array>
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
  std::string tokenizer;  // "wordlevel" or "wordpiece"
  bool lowercase = true;
  std::string continuing_subword_prefix = "##";
  int pad_id = 0, unk_id = 0, cls_id = 0, sep_id = 0;
  std::map<std::string, std::string> graphs;  // graph name -> file, relative to the package
};

struct Assets {
  std::string package;  // the package folder
  Preprocess pre;
  std::vector<std::string> vocab;  // id -> token
  std::vector<std::string> labels;  // answer index -> label

  std::string graph_path(const std::string &graph) const;  // the graph's MindIR file; throws when absent
};

// Reads <package>/lite2/{preprocess,vocab,labels}.txt; throws RunnerError naming the file and the line.
Assets read_assets(const std::string &package);

}  // namespace mvl
