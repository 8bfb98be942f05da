// Reads the plain-text device assets of a package's lite2/ folder: no JSON library on the device.
#include "assets.h"

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

#include "error.h"

namespace mvl {
namespace {

const char *kFix = "export the package with `mindvl export --target lite2`";

std::string read_text(const std::string &path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw RunnerError(path + ": no such file or not readable; " + kFix);
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

// One entry per line; the file's final line break ends the last entry, it does not add an empty one.
std::vector<std::string> read_lines(const std::string &path) {
  std::string text = read_text(path);
  std::vector<std::string> lines;
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    lines.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return lines;
}

// One "key value value ..." line of an asset file, and where it is (for messages).
struct Entry {
  std::string key;
  std::vector<std::string> values;
  std::string where;
};

// The entries of an asset file of "key value value ..." lines; blank lines are skipped.
std::vector<Entry> read_entries(const std::string &path) {
  std::vector<Entry> entries;
  std::vector<std::string> lines = read_lines(path);
  for (size_t i = 0; i < lines.size(); ++i) {
    std::istringstream line(lines[i]);
    Entry entry;
    std::string word;
    line >> entry.key;
    while (line >> word) entry.values.push_back(word);
    if (entry.key.empty()) continue;
    entry.where = path + " line " + std::to_string(i + 1) + " (" + entry.key + ")";
    entries.push_back(entry);
  }
  return entries;
}

// Values are parsed as Python wrote them: floats through double (then float32, as numpy casts them).
double number(const std::string &where, const std::string &word) {
  errno = 0;
  char *end = nullptr;
  double value = std::strtod(word.c_str(), &end);
  if (word.empty() || *end != '\0' || errno != 0) throw RunnerError(where + ": '" + word + "' is not a number");
  return value;
}

int integer(const std::string &where, const std::string &word) {
  double value = number(where, word);
  if (value != static_cast<int>(value)) throw RunnerError(where + ": '" + word + "' is not an integer");
  return static_cast<int>(value);
}

void parse_preprocess(const std::string &path, Preprocess &pre) {
  std::set<std::string> seen;
  for (const Entry &entry : read_entries(path)) {
    const std::string &key = entry.key, &where = entry.where;
    const std::vector<std::string> &values = entry.values;
    auto expect = [&](size_t count) {
      if (values.size() != count) {
        throw RunnerError(where + ": expected " + std::to_string(count) + " value(s), got " +
                          std::to_string(values.size()));
      }
    };
    seen.insert(key);
    if (key.rfind("graph_", 0) == 0) {
      expect(1);
      pre.graphs[key.substr(6)] = values[0];
    } else if (key == "image_mean" || key == "image_std") {
      expect(3);
      auto &target = key == "image_mean" ? pre.image_mean : pre.image_std;
      for (int c = 0; c < 3; ++c) target[c] = static_cast<float>(number(where, values[c]));
    } else if (key == "tokenizer" || key == "continuing_subword_prefix" || key == "tokenizer_model") {
      expect(1);
      (key == "tokenizer" ? pre.tokenizer : key == "tokenizer_model" ? pre.tokenizer_model
                                                                     : pre.continuing_subword_prefix) = values[0];
    } else {
      static const std::map<std::string, int Preprocess::*> integers = {
          {"batch", &Preprocess::batch}, {"image_size", &Preprocess::image_size},
          {"max_text_length", &Preprocess::max_text_length}, {"n_mels", &Preprocess::n_mels},
          {"max_audio_frames", &Preprocess::max_audio_frames}, {"pad_id", &Preprocess::pad_id},
          {"unk_id", &Preprocess::unk_id}, {"cls_id", &Preprocess::cls_id}, {"sep_id", &Preprocess::sep_id}};
      auto found = integers.find(key);
      if (found != integers.end()) {
        expect(1);
        pre.*(found->second) = integer(where, values[0]);
      } else if (key == "lowercase") {
        expect(1);
        pre.lowercase = integer(where, values[0]) != 0;
      }  // other keys: written by a newer exporter, not needed here
    }
  }
  const bool pieces = pre.tokenizer == "sentencepiece";
  std::vector<const char *> required = {"image_size", "image_mean", "image_std", "max_text_length", "n_mels",
                                        "max_audio_frames", "tokenizer"};
  for (const char *key : pieces ? std::vector<const char *>{"tokenizer_model"}
                                : std::vector<const char *>{"pad_id", "unk_id", "cls_id", "sep_id"}) {
    required.push_back(key);
  }
  for (const char *key : required) {
    if (!seen.count(key)) throw RunnerError(path + ": has no '" + key + "' line; " + kFix + " again");
  }
  if (pre.tokenizer != "wordlevel" && pre.tokenizer != "wordpiece" && !pieces) {
    throw RunnerError(path + ": tokenizer '" + pre.tokenizer + "' is not supported (wordlevel, wordpiece or "
                      "sentencepiece)");
  }
  if (pre.image_size <= 0 || pre.max_text_length < 2 || pre.batch < 1) {
    throw RunnerError(path + ": image_size, max_text_length (>= 2) and batch must be positive");
  }
  for (float s : pre.image_std) {
    if (s == 0.0f) throw RunnerError(path + ": image_std holds a 0");
  }
}

bool exists(const std::string &path) { return static_cast<bool>(std::ifstream(path)); }

// vocab_size: vocab.txt's lines, 0 for a SentencePiece package (the model's vocab_size bounds the ids).
void parse_generation(const std::string &path, Generation &generation, int vocab_size) {
  std::set<std::string> seen;
  const std::map<std::string, int Generation::*> integers = {
      {"cache_len", &Generation::cache_len}, {"layers", &Generation::layers},
      {"vocab_size", &Generation::vocab_size}, {"width", &Generation::width}, {"kv_width", &Generation::kv_width},
      {"image_tokens", &Generation::image_tokens}, {"audio_tokens", &Generation::audio_tokens},
      {"pad_id", &Generation::pad_id}, {"max_new_tokens", &Generation::max_new_tokens}};
  const std::map<std::string, std::vector<int> Generation::*> lists = {
      {"buckets", &Generation::buckets}, {"stop_ids", &Generation::stop_ids},
      {"special_ids", &Generation::special_ids}};
  const std::map<std::string, std::vector<int32_t> Generation::*> template_ids = {
      {"bos", &Generation::bos}, {"user", &Generation::user}, {"assistant", &Generation::assistant},
      {"end", &Generation::end}, {"image_open", &Generation::image_open},
      {"image_close", &Generation::image_close}, {"audio_open", &Generation::audio_open},
      {"audio_close", &Generation::audio_close}};
  std::map<std::string, std::string> template_lines;  // key -> where it was read
  for (const Entry &entry : read_entries(path)) {
    const std::string &key = entry.key, &where = entry.where;
    const std::vector<std::string> &values = entry.values;
    seen.insert(key);
    if (key == "template") {
      if (values.size() != 1) throw RunnerError(where + ": expected 1 value, got " + std::to_string(values.size()));
      generation.template_name = values[0];
    } else if (integers.count(key)) {
      if (values.size() != 1) throw RunnerError(where + ": expected 1 value, got " + std::to_string(values.size()));
      generation.*(integers.at(key)) = integer(where, values[0]);
    } else if (lists.count(key) || template_ids.count(key)) {
      std::vector<int> ids;
      for (const std::string &value : values) ids.push_back(integer(where, value));
      if (lists.count(key)) {
        generation.*(lists.at(key)) = ids;
      } else {
        generation.*(template_ids.at(key)) = std::vector<int32_t>(ids.begin(), ids.end());
        template_lines[key] = where;
      }
    }  // other keys: written by a newer exporter, not needed here
  }
  // the template's ids must be the vocabulary's: vocab.txt's lines, or the model's vocab_size (SentencePiece)
  const int tokens = vocab_size ? vocab_size : generation.vocab_size;
  const std::string vocabulary = vocab_size ? "vocab.txt" : "the model's vocabulary";
  for (const auto &[key, where] : template_lines) {
    for (int32_t id : generation.*(template_ids.at(key))) {
      if (id < 0 || id >= tokens) {
        throw RunnerError(where + ": token id " + std::to_string(id) + " is outside " + vocabulary + " (" +
                          std::to_string(tokens) + " tokens)");
      }
    }
  }
  for (const char *key : {"cache_len", "buckets", "layers", "vocab_size", "kv_width", "image_tokens", "audio_tokens",
                          "pad_id", "stop_ids", "max_new_tokens", "special_ids", "bos", "user", "assistant", "end"}) {
    if (!seen.count(key)) throw RunnerError(path + ": has no '" + key + "' line; " + kFix + " again");
  }
  if (generation.buckets.empty() || generation.stop_ids.empty() || generation.layers < 1 ||
      generation.cache_len <= generation.buckets.back()) {
    throw RunnerError(path + ": needs buckets, stop_ids, layers >= 1 and a cache longer than the largest bucket");
  }
}

}  // namespace

std::string Assets::graph_path(const std::string &graph) const {
  auto found = pre.graphs.find(graph);
  if (found == pre.graphs.end()) {
    throw RunnerError(package + "/lite2/preprocess.txt: has no graph_" + graph + " line; " + kFix);
  }
  std::string path = package + "/" + found->second;
  if (!std::ifstream(path)) throw RunnerError(path + ": no such file; " + kFix);
  return path;
}

Assets read_assets(const std::string &package) {
  Assets assets;
  assets.package = package;
  const std::string folder = package + "/lite2/";
  parse_preprocess(folder + "preprocess.txt", assets.pre);
  const Preprocess &pre = assets.pre;
  assets.generative = exists(folder + "generation.txt");
  if (pre.tokenizer == "sentencepiece") {  // the decoder's vocabulary: its size is the model's (generation.txt)
    if (!assets.generative) throw RunnerError(folder + "preprocess.txt: a SentencePiece vocabulary without "
                                              "generation.txt; " + kFix + " again");
    parse_generation(folder + "generation.txt", assets.generation, 0);
    return assets;
  }
  assets.vocab = read_lines(folder + "vocab.txt");
  if (assets.generative) {
    parse_generation(folder + "generation.txt", assets.generation, static_cast<int>(assets.vocab.size()));
  } else {
    assets.labels = read_lines(folder + "labels.txt");
    if (assets.labels.empty()) throw RunnerError(folder + "labels.txt: holds no labels; " + kFix);
  }
  const int size = static_cast<int>(assets.vocab.size());
  for (int id : {pre.pad_id, pre.unk_id, pre.cls_id, pre.sep_id}) {
    if (id < 0 || id >= size) {
      throw RunnerError(folder + "preprocess.txt: special token id " + std::to_string(id) + " is outside vocab.txt (" +
                        std::to_string(size) + " tokens)");
    }
  }
  return assets;
}

}  // namespace mvl
