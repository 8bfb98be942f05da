"""Tiny random-weight decoders in the Hugging Face layout of the Llama, Qwen2 and Gemma 3 families, and
transformers' outputs on them: the layouts `mindvl convert llm --hf` reads, small enough to commit.

Each family gets a folder tests/references/tiny_<family>/ (config.json, model.safetensors,
generation_config.json, tokenizer.json: a 384-token byte-level BPE trained here on a few sentences) and the
arrays in tiny_llms.npz: per family and prompt, the ids, every position's logits and 12 greedy tokens.
Grouped-query attention (4 heads, 2 kv heads) everywhere; Gemma 3 with a 6-token sliding window on its
local layers so that the prompts cross it.
"""
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
FAMILIES = ("llama", "qwen2", "gemma3_text")
PROMPTS = ["the cat sat on the mat", "a red circle and a blue square are drawn on a white page"]
TRAINING_TEXT = [
    "the cat sat on the mat", "a red circle and a blue square", "what color is the shape in the image",
    "is there a green triangle", "the quick brown fox jumps over the lazy dog", "one two three four five",
    "a white page with a drawing", "mindspore compiles the network into a graph",
]
GREEDY_TOKENS = 12


def tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=384, special_tokens=["<pad>", "<bos>", "<eos>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(TRAINING_TEXT, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    return tok


def model(family: str, vocab: int):
    from transformers import (Gemma3ForCausalLM, Gemma3TextConfig, LlamaConfig, LlamaForCausalLM, Qwen2Config,
                              Qwen2ForCausalLM)

    common = dict(vocab_size=vocab, hidden_size=64, intermediate_size=160, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, pad_token_id=0,
                  bos_token_id=1, eos_token_id=2)
    if family == "llama":
        return LlamaForCausalLM(LlamaConfig(**common, rms_norm_eps=1e-5, tie_word_embeddings=False))
    if family == "qwen2":
        return Qwen2ForCausalLM(Qwen2Config(**common, rms_norm_eps=1e-6, tie_word_embeddings=True))
    return Gemma3ForCausalLM(Gemma3TextConfig(**common, head_dim=32, sliding_window=6, query_pre_attn_scalar=24,
                                              layer_types=["sliding_attention", "sliding_attention",
                                                           "full_attention"],
                                              rms_norm_eps=1e-6, tie_word_embeddings=True))


def generate(out: Path) -> None:
    import torch

    torch.manual_seed(0)
    tok = tokenizer()
    arrays = {"prompts": np.array(PROMPTS)}
    for family in FAMILIES:
        net = model(family, tok.get_vocab_size()).eval()
        with torch.no_grad():  # random weights, larger than the init so that the logits are not all alike
            for name, param in net.named_parameters():
                if "norm" in name:
                    param.copy_(torch.randn_like(param) * 0.1 + (0.0 if family == "gemma3_text" else 1.0))
                else:
                    param.normal_(0.0, 0.08)
        folder = HERE / f"tiny_{family}"
        net.save_pretrained(folder, safe_serialization=True)
        tok.save(str(folder / "tokenizer.json"))
        for index, prompt in enumerate(PROMPTS):
            ids = torch.tensor([tok.encode(prompt).ids])
            with torch.no_grad():
                logits = net(ids).logits[0].numpy().astype(np.float32)
                greedy = net.generate(ids, max_new_tokens=GREEDY_TOKENS, do_sample=False, eos_token_id=None,
                                      min_new_tokens=GREEDY_TOKENS)
            arrays[f"{family}_ids_{index}"] = ids[0].numpy().astype(np.int32)
            arrays[f"{family}_logits_{index}"] = logits
            arrays[f"{family}_greedy_{index}"] = greedy[0, ids.shape[1]:].numpy().astype(np.int32)
    np.savez_compressed(out, **arrays)
