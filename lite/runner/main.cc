// mindvl_runner: what a mobile app does with the MindSpore Lite C++ API, on a mindvl model package.
//
//   mindvl_runner PKG --image FILE --question TEXT [--threads N] [--dump DIR] [--preprocess-only]
//
// Reads PKG/lite2/ (preprocess.txt, vocab.txt, labels.txt, vqa.mindir), preprocesses the image and the
// typed question as the server does (serving/servable.py: no audio, so audio_mel and audio_mask are zeros,
// use_text 1, use_audio 0), builds the model on N CPU threads, predicts and prints one JSON line:
//   {"answer", "confidence", "logits", "answer_ids", "preprocess_ms", "build_ms", "predict_ms"}
// --dump DIR writes the preprocessed image.f32 (3,S,S), question_ids.i32 and question_mask.f32 (T,) as raw
// little-endian arrays; --preprocess-only stops after that (no model needed).
//
//   mindvl_runner PKG --generate [--question TEXT] [--image FILE | --image-f32 FILE]
//                 [--mel FILE --frame-mask FILE] [--max-new-tokens N] [--ignore-eos] [--threads N]
//
// A generative package (PKG/lite2/generation.txt): the question in the package's chat template, its image
// (a PNG/JPEG file preprocessed as above, or an already preprocessed (3,S,S) float32 file as --dump writes
// it) and its spoken form (a log-mel (n_mels, T) and frame mask (T,), raw float32 as
// mindvl.preprocess.pad_mel makes them: the runner has no audio front end), then attachments, prefill and
// a greedy decode loop (generate.cc) to a stop token or N tokens (--ignore-eos: always N), printing one
// JSON line:
//   {"text", "tokens", "logprobs", "finish", "prompt_tokens", "bucket", "build_ms", "first_token_ms",
//    "decode_ms", "decode_tokens_per_s"}
//
//   mindvl_runner PKG --tokenize --question TEXT
//
// A generative package's tokenizer alone (no model built): TEXT as a user's turn reads it, the ids decoded again
// and the chat prompts of that question typed alone, with an image, spoken about no image and with both (the
// attachments' slots holding pad ids), printed as {"ids", "text", "prompt", "prompt_image", "prompt_audio",
// "prompt_image_audio"}: what mindvl.chat.ChatEncoder makes of the same text.
// Exit codes: 0 answered; 2 unusable arguments, package files or inputs (message on stderr); 1 the Lite
// runtime failed to build or run the model.
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "assets.h"
#include "error.h"
#include "generate.h"
#include "image.h"
#include "json.h"
#include "runtime.h"
#include "include/api/context.h"
#include "include/api/model.h"
#include "include/api/types.h"
#include "tokenizer.h"

namespace {

using mvl::elapsed_ms;
using mvl::json_number;
using mvl::json_string;
using mvl::RunnerError;
using mvl::RuntimeFailure;

struct Options {
  std::string package, image, question, dump;
  std::string image_f32, mel, frame_mask;  // --generate's preprocessed inputs
  int threads = 1;
  int max_new_tokens = 0;
  bool have_question = false;
  bool preprocess_only = false;
  bool generate = false;
  bool ignore_eos = false;
  bool tokenize = false;
};

const char *kUsage =
    "usage: mindvl_runner PKG --image FILE --question TEXT [--threads N] [--dump DIR] [--preprocess-only]\n"
    "       mindvl_runner PKG --generate [--question TEXT] [--image FILE | --image-f32 FILE] "
    "[--mel FILE --frame-mask FILE] [--max-new-tokens N] [--ignore-eos] [--threads N]\n"
    "       mindvl_runner PKG --tokenize --question TEXT";

int whole_number(const std::string &flag, const std::string &text, int low, int high) {
  char *end = nullptr;
  long number = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || number < low || number > high) {
    throw RunnerError(flag + " " + text + ": use a whole number from " + std::to_string(low) + " to " +
                      std::to_string(high));
  }
  return static_cast<int>(number);
}

Options parse(int argc, char **argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw RunnerError(arg + ": needs a value; " + kUsage);
      return argv[++i];
    };
    if (arg == "--image") {
      options.image = value();
    } else if (arg == "--question") {
      options.question = value();
      options.have_question = true;
    } else if (arg == "--dump") {
      options.dump = value();
    } else if (arg == "--preprocess-only") {
      options.preprocess_only = true;
    } else if (arg == "--generate") {
      options.generate = true;
    } else if (arg == "--tokenize") {
      options.tokenize = true;
    } else if (arg == "--ignore-eos") {
      options.ignore_eos = true;
    } else if (arg == "--image-f32") {
      options.image_f32 = value();
    } else if (arg == "--mel") {
      options.mel = value();
    } else if (arg == "--frame-mask") {
      options.frame_mask = value();
    } else if (arg == "--max-new-tokens") {
      options.max_new_tokens = whole_number(arg, value(), 1, 1 << 20);
    } else if (arg == "--threads") {
      options.threads = whole_number(arg, value(), 1, 256);
    } else if (arg.rfind("--", 0) == 0 || !options.package.empty()) {
      throw RunnerError("unexpected argument '" + arg + "'; " + kUsage);
    } else {
      options.package = arg;
    }
  }
  if (options.tokenize) {
    if (options.package.empty() || !options.have_question || options.generate) {
      throw RunnerError(std::string("--tokenize needs PKG and --question, and no --generate; ") + kUsage);
    }
    return options;
  }
  if (options.generate) {
    if (options.package.empty() || (!options.have_question && options.mel.empty())) {
      throw RunnerError(std::string("--generate needs PKG and --question, --mel or both; ") + kUsage);
    }
    if (!options.image.empty() && !options.image_f32.empty()) {
      throw RunnerError("--image and --image-f32: give the image one way");
    }
    if (options.mel.empty() != options.frame_mask.empty()) {
      throw RunnerError("--mel and --frame-mask go together (the log-mel and its frame mask, as pad_mel makes them)");
    }
    if (!options.dump.empty() || options.preprocess_only) {
      throw RunnerError("--dump and --preprocess-only belong to the vqa mode; leave them out with --generate");
    }
  } else if (options.package.empty() || options.image.empty() || !options.have_question) {
    throw RunnerError(std::string("PKG, --image and --question are required; ") + kUsage);
  } else if (!options.image_f32.empty() || !options.mel.empty() || !options.frame_mask.empty() ||
             options.max_new_tokens || options.ignore_eos) {
    throw RunnerError("--image-f32, --mel, --frame-mask, --max-new-tokens and --ignore-eos belong to --generate");
  }
  return options;
}

void write_raw(const std::string &folder, const std::string &name, const void *data, size_t bytes) {
  const std::string path = folder + "/" + name;
  std::ofstream file(path, std::ios::binary);
  file.write(static_cast<const char *>(data), static_cast<std::streamsize>(bytes));
  if (!file) throw RunnerError(path + ": cannot write the dump");
}


// One example's inputs, by the vqa graph's input names; each is copied into every row of the batch.
struct Example {
  std::vector<float> image, question_mask, audio_mel, audio_mask;
  std::vector<int32_t> question_ids;
  float use_text = 1.0f, use_audio = 0.0f;
};

std::vector<mindspore::MSTensor> fill_inputs(mindspore::Model &model, const Example &example) {
  struct Source {
    const void *data;
    size_t bytes;  // per row
    mindspore::DataType dtype;
  };
  const auto f32 = mindspore::DataType::kNumberTypeFloat32;
  const std::map<std::string, Source> sources = {
      {"image", {example.image.data(), example.image.size() * 4, f32}},
      {"question_ids", {example.question_ids.data(), example.question_ids.size() * 4,
                        mindspore::DataType::kNumberTypeInt32}},
      {"question_mask", {example.question_mask.data(), example.question_mask.size() * 4, f32}},
      {"audio_mel", {example.audio_mel.data(), example.audio_mel.size() * 4, f32}},
      {"audio_mask", {example.audio_mask.data(), example.audio_mask.size() * 4, f32}},
      {"use_text", {&example.use_text, 4, f32}},
      {"use_audio", {&example.use_audio, 4, f32}}};
  std::vector<mindspore::MSTensor> inputs = model.GetInputs();
  for (mindspore::MSTensor &tensor : inputs) {
    const std::string name = tensor.Name();
    auto found = sources.find(name);
    if (found == sources.end()) throw RunnerError("the model has an input '" + name + "' the vqa graph does not");
    const Source &source = found->second;
    const size_t rows = tensor.Shape().empty() ? 1 : static_cast<size_t>(tensor.Shape()[0]);
    if (tensor.DataType() != source.dtype || tensor.DataSize() != rows * source.bytes) {
      throw RunnerError("input " + name + ": the model expects " + std::to_string(tensor.DataSize()) + " bytes for " +
                        std::to_string(rows) + " row(s), preprocessing made " + std::to_string(source.bytes) +
                        " per row; lite2/preprocess.txt does not match the graph: export the package again");
    }
    auto *target = static_cast<uint8_t *>(tensor.MutableData());
    if (target == nullptr) throw RuntimeFailure("input " + name + ": the runtime gave no buffer");
    for (size_t row = 0; row < rows; ++row) std::memcpy(target + row * source.bytes, source.data, source.bytes);
  }
  return inputs;
}

// A raw little-endian float32 file of exactly `count` values (what --dump writes, or numpy's tofile).
std::vector<float> read_floats(const std::string &path, size_t count, const std::string &what) {
  std::ifstream file(path, std::ios::binary | std::ios::ate);
  if (!file) throw RunnerError(path + ": no such file or not readable (" + what + ")");
  const auto bytes = static_cast<size_t>(file.tellg());
  if (bytes != count * 4) {
    throw RunnerError(path + ": " + std::to_string(bytes) + " bytes, but " + what + " is " + std::to_string(count) +
                      " float32 values (" + std::to_string(count * 4) + " bytes)");
  }
  std::vector<float> values(count);
  file.seekg(0);
  file.read(reinterpret_cast<char *>(values.data()), static_cast<std::streamsize>(bytes));
  return values;
}

std::string json_ids(const std::vector<int32_t> &ids) {
  std::string out = "[";
  for (size_t i = 0; i < ids.size(); ++i) out += (i ? ", " : "") + std::to_string(ids[i]);
  return out + "]";
}

int run_generate(const Options &options) {
  const mvl::Assets assets = mvl::read_assets(options.package);
  if (!assets.generative) {
    throw RunnerError(options.package + "/lite2/generation.txt: missing; --generate needs a generative package "
                      "exported with `mindvl export --target lite2` (a vqa package answers without --generate)");
  }
  const mvl::Preprocess &pre = assets.pre;
  mvl::GenerateRequest request;
  request.question = options.question;
  request.max_new_tokens = options.max_new_tokens;
  request.ignore_eos = options.ignore_eos;
  request.threads = options.threads;
  const size_t pixels = 3ull * pre.image_size * pre.image_size, frames = static_cast<size_t>(pre.max_audio_frames);
  if (!options.image.empty()) request.image = mvl::image_tensor(options.image, pre);
  if (!options.image_f32.empty()) request.image = read_floats(options.image_f32, pixels, "a (3, S, S) image");
  if (!options.mel.empty()) {
    request.mel = read_floats(options.mel, frames * pre.n_mels, "the (n_mels, max_audio_frames) log-mel");
    request.frame_mask = read_floats(options.frame_mask, frames, "the (max_audio_frames,) frame mask");
  }
  const mvl::GenerateResult result = mvl::generate(assets, request);
  std::string line = "{\"text\": " + json_string(result.text) + ", \"tokens\": " + json_ids(result.tokens) +
                     ", \"logprobs\": [";
  for (size_t i = 0; i < result.logprobs.size(); ++i) line += (i ? ", " : "") + json_number(result.logprobs[i]);
  const double steps = static_cast<double>(result.tokens.size() - 1);  // decode calls after the first token
  line += "], \"finish\": " + json_string(result.finish) + ", \"prompt_tokens\": " +
          std::to_string(result.prompt_tokens) + ", \"bucket\": " + std::to_string(result.bucket) +
          ", \"build_ms\": " + json_number(result.build_ms) + ", \"first_token_ms\": " +
          json_number(result.first_token_ms) + ", \"decode_ms\": " + json_number(result.decode_ms) +
          ", \"decode_tokens_per_s\": " + json_number(steps > 0 ? steps * 1000.0 / result.decode_ms : 0.0) + "}";
  std::printf("%s\n", line.c_str());
  return 0;
}

int run_tokenize(const Options &options) {
  const mvl::Assets assets = mvl::read_assets(options.package);
  if (!assets.generative) throw RunnerError(options.package + ": --tokenize reads a generative package's tokenizer");
  const mvl::Tokenizer tokenizer(assets);
  const std::vector<int32_t> ids = tokenizer.text_ids(options.question);
  std::string line = "{\"ids\": " + json_ids(ids) + ", \"text\": " + json_string(tokenizer.decode(ids, {}));
  for (const auto &[key, image, audio] : {std::make_tuple("prompt", false, false),
                                          std::make_tuple("prompt_image", true, false),
                                          std::make_tuple("prompt_audio", false, true),
                                          std::make_tuple("prompt_image_audio", true, true)}) {
    line += std::string(", \"") + key + "\": " + json_ids(mvl::chat_prompt(assets, tokenizer, options.question, image,
                                                                        audio).ids);
  }
  std::printf("%s}\n", line.c_str());
  return 0;
}

int run(const Options &options) {
  if (options.tokenize) return run_tokenize(options);
  if (options.generate) return run_generate(options);
  // 1. preprocess: package assets, the image, the question; audio absent
  auto start = std::chrono::steady_clock::now();
  const mvl::Assets assets = mvl::read_assets(options.package);
  if (assets.generative) {
    throw RunnerError(options.package + ": a generative package answers in words; run it with --generate");
  }
  const mvl::Preprocess &pre = assets.pre;
  Example example;
  example.image = mvl::image_tensor(options.image, pre);
  mvl::Tokenizer(assets).encode(options.question, example.question_ids, example.question_mask);
  example.audio_mel.assign(static_cast<size_t>(pre.n_mels) * pre.max_audio_frames, 0.0f);
  example.audio_mask.assign(static_cast<size_t>(pre.max_audio_frames), 0.0f);
  const double preprocess_ms = elapsed_ms(start);
  if (!options.dump.empty()) {
    mkdir(options.dump.c_str(), 0755);  // an existing folder is fine; a failure shows when writing
    write_raw(options.dump, "image.f32", example.image.data(), example.image.size() * 4);
    write_raw(options.dump, "question_ids.i32", example.question_ids.data(), example.question_ids.size() * 4);
    write_raw(options.dump, "question_mask.f32", example.question_mask.data(), example.question_mask.size() * 4);
  }
  if (options.preprocess_only) {
    std::printf("{\"preprocess_ms\": %s}\n", json_number(preprocess_ms).c_str());
    return 0;
  }

  // 2. build the model on the CPU with the requested threads
  const std::string graph = assets.graph_path("vqa");
  start = std::chrono::steady_clock::now();
  std::unique_ptr<mindspore::Model> built = mvl::build_model(graph, options.threads);
  mindspore::Model &model = *built;
  const double build_ms = elapsed_ms(start);

  // 3. predict; outputs: answer_logits float32 (B, answers), answer_ids int32 (B, steps); row 0 is ours
  std::vector<mindspore::MSTensor> inputs = fill_inputs(model, example);
  std::vector<mindspore::MSTensor> outputs;
  start = std::chrono::steady_clock::now();
  mindspore::Status status = model.Predict(inputs, &outputs);
  if (status != mindspore::kSuccess) throw RuntimeFailure(graph + ": predict failed: " + status.ToString());
  const double predict_ms = elapsed_ms(start);
  if (outputs.size() != 2 || outputs[0].DataType() != mindspore::DataType::kNumberTypeFloat32 ||
      outputs[1].DataType() != mindspore::DataType::kNumberTypeInt32 || outputs[0].Shape().size() != 2 ||
      outputs[1].Shape().size() != 2) {
    throw RunnerError(graph + ": expected the vqa graph's outputs answer_logits float32 (B, answers) and "
                      "answer_ids int32 (B, steps)");
  }
  const size_t answers = static_cast<size_t>(outputs[0].Shape()[1]);
  const size_t steps = static_cast<size_t>(outputs[1].Shape()[1]);
  if (answers != assets.labels.size()) {
    throw RunnerError(options.package + "/lite2/labels.txt: " + std::to_string(assets.labels.size()) +
                      " labels but the model scores " + std::to_string(answers) + " answers");
  }
  const auto *logits = static_cast<const float *>(outputs[0].MutableData());
  const auto *answer_ids = static_cast<const int32_t *>(outputs[1].MutableData());

  // 4. the answer: the most probable label and its softmax probability, in double as the server does
  const size_t best = static_cast<size_t>(std::max_element(logits, logits + answers) - logits);
  double total = 0.0;
  for (size_t i = 0; i < answers; ++i) total += std::exp(static_cast<double>(logits[i]) - logits[best]);
  const float confidence = static_cast<float>(1.0 / total);
  std::string line = "{\"answer\": " + json_string(assets.labels[best]) +
                     ", \"confidence\": " + json_number(confidence) + ", \"logits\": [";
  for (size_t i = 0; i < answers; ++i) line += (i ? ", " : "") + json_number(logits[i]);
  line += "], \"answer_ids\": [";
  for (size_t i = 0; i < steps; ++i) line += (i ? ", " : "") + std::to_string(answer_ids[i]);
  line += "], \"preprocess_ms\": " + json_number(preprocess_ms) + ", \"build_ms\": " + json_number(build_ms) +
          ", \"predict_ms\": " + json_number(predict_ms) + "}";
  std::printf("%s\n", line.c_str());
  return 0;
}

}  // namespace

int main(int argc, char **argv) {
  try {
    return run(parse(argc, argv));
  } catch (const RunnerError &error) {
    std::fprintf(stderr, "mindvl_runner: error: %s\n", error.what());
    return 2;
  } catch (const std::exception &error) {  // RuntimeFailure, or out of memory
    std::fprintf(stderr, "mindvl_runner: error: %s\n", error.what());
    return 1;
  }
}
