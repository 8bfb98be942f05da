#include "generate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>

#include "error.h"
#include "include/api/model.h"
#include "include/api/types.h"
#include "runtime.h"

namespace mvl {
namespace {

using Clock = std::chrono::steady_clock;

void append(std::vector<int32_t> &ids, const std::vector<int32_t> &more) {
  ids.insert(ids.end(), more.begin(), more.end());
}

// One graph input's bytes and its name in the package's graph spec (export/prefill_decode.py graph_specs).
struct Input {
  std::string name;
  const void *data;
  size_t bytes;
};

// Copies each buffer into the model input at its position: the graphs' inputs come in their spec's order
// (the decode graph's MindIR names them Parameter_N), each in the size the model expects (batch 1).
std::vector<mindspore::MSTensor> fill(mindspore::Model &model, const std::vector<Input> &given,
                                      const std::string &graph) {
  std::vector<mindspore::MSTensor> inputs = model.GetInputs();
  if (inputs.size() != given.size()) {
    throw RunnerError(graph + ": " + std::to_string(inputs.size()) + " inputs, generation makes " +
                      std::to_string(given.size()) + "; export the package again");
  }
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].DataSize() != given[i].bytes) {
      throw RunnerError(graph + ": input " + given[i].name + " takes " + std::to_string(inputs[i].DataSize()) +
                        " bytes, generation made " + std::to_string(given[i].bytes) +
                        "; lite2/generation.txt does not match the graph: export the package again");
    }
    void *target = inputs[i].MutableData();
    if (target == nullptr) throw RuntimeFailure(graph + ": input " + given[i].name + ": the runtime gave no buffer");
    std::memcpy(target, given[i].data, given[i].bytes);
  }
  return inputs;
}

std::vector<mindspore::MSTensor> predict(mindspore::Model &model, const std::vector<mindspore::MSTensor> &inputs,
                                         size_t outputs_expected, const std::string &graph) {
  std::vector<mindspore::MSTensor> outputs;
  mindspore::Status status = model.Predict(inputs, &outputs);
  if (status != mindspore::kSuccess) throw RuntimeFailure(graph + ": predict failed: " + status.ToString());
  if (outputs.size() != outputs_expected) {
    throw RunnerError(graph + ": " + std::to_string(outputs.size()) + " outputs, generation expects " +
                      std::to_string(outputs_expected) + "; export the package again");
  }
  return outputs;
}

// The smallest bucket holding the prompt with room for max_new_tokens after it (prompting.choose_bucket).
int choose_bucket(const Generation &generation, int length, int max_new_tokens) {
  for (int bucket : generation.buckets) {
    if (bucket < length) continue;
    if (bucket + max_new_tokens > generation.cache_len) {
      throw RunnerError("a prompt of " + std::to_string(length) + " tokens (bucket " + std::to_string(bucket) +
                        ") + --max-new-tokens " + std::to_string(max_new_tokens) + " exceed the cache of " +
                        std::to_string(generation.cache_len) + " tokens; ask for at most " +
                        std::to_string(generation.cache_len - bucket) + " tokens");
    }
    return bucket;
  }
  throw RunnerError("question: the prompt is " + std::to_string(length) + " tokens, longer than the largest bucket (" +
                    std::to_string(generation.buckets.back()) + "); shorten the question");
}

// The chosen token (the first of equal maxima, as numpy's argmax) and its log-probability, in double.
std::pair<int32_t, double> greedy(const float *logits, int vocab) {
  const int32_t best = static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);
  double total = 0.0;
  for (int i = 0; i < vocab; ++i) total += std::exp(static_cast<double>(logits[i]) - logits[best]);
  return {best, -std::log(total)};
}

}  // namespace

Prompt chat_prompt(const Assets &assets, const Tokenizer &tokenizer, const std::string &question, bool image,
                   bool audio) {
  const Generation &g = assets.generation;
  Prompt prompt;
  std::vector<int32_t> &ids = prompt.ids;
  std::vector<int32_t> rows;  // per position: its modality row, -1 for text
  auto text = [&](const std::vector<int32_t> &more) {
    append(ids, more);
    rows.insert(rows.end(), more.size(), -1);
  };
  auto slots = [&](const std::vector<int32_t> &open, int count, int first_row, const std::vector<int32_t> &close) {
    text(open);
    for (int i = 0; i < count; ++i) {
      ids.push_back(g.pad_id);
      rows.push_back(first_row + i);
    }
    text(close);
  };
  text(g.bos);
  text(g.user);
  // the image, then the clip, then the typed question taken literally, with a line break after each attachment
  // that something follows (chat.question_turn: chat.separated's LLaVA-style "<image>\n<audio>\nWhat color?")
  if (image) slots(g.image_open, g.image_tokens, 0, g.image_close);
  if (audio) {
    if (image) text(tokenizer.text_ids("\n"));
    slots(g.audio_open, g.audio_tokens, g.image_tokens, g.audio_close);
  }
  if (!question.empty()) text(tokenizer.text_ids((image || audio ? "\n" : "") + question));
  text(g.end);
  text(g.assistant);
  const int zero_row = g.image_tokens + g.audio_tokens;  // the modality table's zero row: text keeps its embedding
  for (int32_t row : rows) prompt.slot_index.push_back(row < 0 ? zero_row : row);
  return prompt;
}

GenerateResult generate(const Assets &assets, const GenerateRequest &request) {
  const Generation &g = assets.generation;
  const Preprocess &pre = assets.pre;
  const bool image = !request.image.empty(), audio = !request.mel.empty();
  if (request.question.find_first_not_of(" \t\n\r\f\v") == std::string::npos && !audio) {
    throw RunnerError("question: give the question as text (--question) or as audio (--mel and --frame-mask)");
  }
  const int max_new = request.max_new_tokens ? request.max_new_tokens : g.max_new_tokens;
  if (max_new < 1 || max_new > g.max_new_tokens) {
    throw RunnerError("--max-new-tokens " + std::to_string(max_new) + ": this package generates 1 to " +
                      std::to_string(g.max_new_tokens) + " tokens per answer");
  }
  GenerateResult result;
  const Tokenizer tokenizer(assets);
  const Prompt prompt = chat_prompt(assets, tokenizer, request.question, image, audio);
  const int length = static_cast<int>(prompt.ids.size());
  const int bucket = choose_bucket(g, length, max_new);
  result.prompt_tokens = length;
  result.bucket = bucket;

  // One graph in memory at a time (a phone's budget: vlm-s's prefill and decode graphs each hold the decoder's
  // weights): each is built when its turn comes and released after it; build_ms sums the builds, which
  // first_token_ms and decode_ms leave out.
  auto build = [&](const std::string &graph) {
    const auto began = Clock::now();
    std::unique_ptr<mindspore::Model> model = build_model(assets.graph_path(graph), request.threads);
    result.build_ms += elapsed_ms(began);
    return model;
  };
  double first_token_ms = 0;  // the compute before the first token, builds left out
  auto timed = [&](auto &&work) {
    const auto began = Clock::now();
    work();
    first_token_ms += elapsed_ms(began);
  };

  // 1. the prompt left-padded into its bucket (prompting.PromptLayout.batch for one prompt)
  const int pad = bucket - length;
  std::vector<int32_t> ids(bucket, g.pad_id), valid(bucket, 0), slot_index(bucket, g.image_tokens + g.audio_tokens);
  std::copy(prompt.ids.begin(), prompt.ids.end(), ids.begin() + pad);
  std::fill(valid.begin() + pad, valid.end(), 1);
  std::copy(prompt.slot_index.begin(), prompt.slot_index.end(), slot_index.begin() + pad);

  // 2. the attachments' decoder-width tokens (zeros without attachments, as DecodeBatch.prefill_inputs)
  const size_t image_bytes = static_cast<size_t>(g.image_tokens) * g.width * 4;
  const size_t audio_bytes = static_cast<size_t>(g.audio_tokens) * g.width * 4;
  std::vector<float> image_tokens(image_bytes / 4, 0.0f), audio_tokens(audio_bytes / 4, 0.0f);
  if (image || audio) {
    std::unique_ptr<mindspore::Model> attachments = build("attachments");
    timed([&] {
      const size_t pixels = 3ull * pre.image_size * pre.image_size, frames = static_cast<size_t>(pre.max_audio_frames);
      const std::vector<float> no_image(image ? 0 : pixels, 0.0f), no_mel(audio ? 0 : frames * pre.n_mels, 0.0f),
          no_mask(audio ? 0 : frames, 0.0f);
      const std::vector<float> &pixel_data = image ? request.image : no_image;
      const std::vector<float> &mel = audio ? request.mel : no_mel, &mask = audio ? request.frame_mask : no_mask;
      auto inputs = fill(*attachments, {{"image", pixel_data.data(), pixel_data.size() * 4},
                                        {"audio_mel", mel.data(), mel.size() * 4},
                                        {"audio_mask", mask.data(), mask.size() * 4}}, "attachments");
      auto outputs = predict(*attachments, inputs, 2, "attachments");
      if (outputs[0].DataSize() != image_bytes || outputs[1].DataSize() != audio_bytes) {
        throw RunnerError("attachments: its outputs do not hold image_tokens x width floats; export the package again");
      }
      std::memcpy(image_tokens.data(), outputs[0].MutableData(), image_bytes);
      std::memcpy(audio_tokens.data(), outputs[1].MutableData(), audio_bytes);
    });
  }

  // 3. prefill: the last position's logits and every layer's key and value caches, kept past the graph
  const std::string prefill_graph = "prefill_" + std::to_string(bucket);
  const size_t caches = 2 * static_cast<size_t>(g.layers);
  const size_t cache_bytes = static_cast<size_t>(g.cache_len) * g.kv_width * 4;
  std::vector<float> logits(g.vocab_size);
  std::vector<std::vector<float>> prefilled(caches, std::vector<float>(cache_bytes / 4));
  {
    std::unique_ptr<mindspore::Model> prefill = build(prefill_graph);
    timed([&] {
      const size_t row_bytes = static_cast<size_t>(bucket) * 4;
      auto inputs = fill(*prefill, {{"ids", ids.data(), row_bytes}, {"valid", valid.data(), row_bytes},
                                    {"slot_index", slot_index.data(), row_bytes},
                                    {"image_tokens", image_tokens.data(), image_bytes},
                                    {"audio_tokens", audio_tokens.data(), audio_bytes}}, prefill_graph);
      std::vector<mindspore::MSTensor> outputs = predict(*prefill, inputs, 1 + caches, prefill_graph);
      for (size_t i = 0; i <= caches; ++i) {
        if (outputs[i].DataSize() != (i ? cache_bytes : static_cast<size_t>(g.vocab_size) * 4)) {
          throw RunnerError(prefill_graph + ": output " + std::to_string(i) + " is not (1, vocab) logits or a (1, "
                            "cache_len, kv_width) cache; lite2/generation.txt does not match the graph: export the "
                            "package again");
        }
        std::memcpy(i ? prefilled[i - 1].data() : logits.data(), outputs[i].MutableData(), outputs[i].DataSize());
      }
    });
  }

  // 4. the decode loop: choose, stop, or write the token at the next cache slot (DecodeBatch.sample / decode);
  // each step's caches are the previous step's outputs (the prefill's copies first)
  std::unique_ptr<mindspore::Model> decode;
  std::vector<mindspore::MSTensor> outputs;
  const float *step_logits = logits.data();
  std::vector<const void *> step_caches;
  for (const std::vector<float> &cache : prefilled) step_caches.push_back(cache.data());
  std::vector<int32_t> slot_valid(g.cache_len, 0);
  std::copy(valid.begin(), valid.end(), slot_valid.begin());
  int32_t slot = bucket, position = length;
  auto decode_start = Clock::now();
  while (true) {
    auto choose = Clock::now();
    const auto [token, logprob] = greedy(step_logits, g.vocab_size);
    if (result.tokens.empty()) result.first_token_ms = first_token_ms + elapsed_ms(choose);
    result.tokens.push_back(token);
    result.logprobs.push_back(logprob);
    if (!request.ignore_eos && std::find(g.stop_ids.begin(), g.stop_ids.end(), token) != g.stop_ids.end()) {
      result.finish = "stop";
      break;
    }
    if (static_cast<int>(result.tokens.size()) >= max_new) {
      result.finish = "length";
      break;
    }
    if (!decode) {
      decode = build("decode");
      decode_start = Clock::now();
    }
    slot_valid[slot] = 1;
    std::vector<Input> step = {{"token", &result.tokens.back(), 4}, {"position", &position, 4}, {"slot", &slot, 4},
                               {"slot_valid", slot_valid.data(), slot_valid.size() * 4}};
    for (size_t i = 0; i < caches; ++i) {  // every layer's keys, then every layer's values; fill() copies them
      const size_t layers = caches / 2;
      const std::string name = std::string("cache_") + (i < layers ? "k_" : "v_") + std::to_string(i % layers);
      step.push_back({name, step_caches[i], cache_bytes});  // in before the outputs are replaced
    }
    outputs = predict(*decode, fill(*decode, step, "decode"), 1 + caches, "decode");
    step_logits = static_cast<const float *>(outputs[0].MutableData());
    for (size_t i = 0; i < caches; ++i) step_caches[i] = outputs[1 + i].MutableData();
    ++slot;
    ++position;
  }
  result.decode_ms = elapsed_ms(decode_start);
  std::vector<int> skip = g.special_ids;
  skip.insert(skip.end(), g.stop_ids.begin(), g.stop_ids.end());
  result.text = tokenizer.decode(result.tokens, skip);
  return result;
}

}  // namespace mvl
