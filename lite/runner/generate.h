// A generative package's answer on the device: the chat prompt, attachments, prefill and a greedy decode
// loop over the lite2 graphs, as mindvl.engine.decode_loop's DecodeBatch runs them for one sequence.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "assets.h"
#include "tokenizer.h"

namespace mvl {

struct GenerateRequest {
  std::string question;  // typed; may be empty when the question is spoken
  std::vector<float> image;  // (3, S, S) preprocessed, or empty: no image
  std::vector<float> mel, frame_mask;  // (n_mels, T) and (T,) as mindvl.preprocess.pad_mel gives them, or empty
  int max_new_tokens = 0;  // 0: the package's max_new_tokens
  bool ignore_eos = false;  // generate past the stop tokens, to max_new_tokens (fixed-length benchmarks)
  int threads = 1;
};

struct GenerateResult {
  std::string text;  // the answer, stop and special tokens left out
  std::vector<int32_t> tokens;  // every generated token, the stop token included when it stopped on one
  std::vector<double> logprobs;  // each token's log-probability under the model (log softmax of its logits)
  std::string finish;  // "stop" or "length"
  int prompt_tokens = 0, bucket = 0;
  double build_ms = 0, first_token_ms = 0, decode_ms = 0;  // first token: attachments, prefill, the first choice
};

// The chat prompt's ids and the modality rows of each position (mindvl.chat / mindvl.engine.prompts for one
// prompt): [bos] [user] (image slots) (audio slots) question [end] [assistant].
struct Prompt {
  std::vector<int32_t> ids, slot_index;
};
Prompt chat_prompt(const Assets &assets, const Tokenizer &tokenizer, const std::string &question, bool image,
                   bool audio);

// Greedy generation; throws RunnerError for an unusable request (no question, a prompt longer than the
// largest bucket, too many tokens asked) and RuntimeFailure when Lite fails.
GenerateResult generate(const Assets &assets, const GenerateRequest &request);

}  // namespace mvl
