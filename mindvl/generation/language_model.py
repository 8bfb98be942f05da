"""A converted LLM folder as a model that generates: `LanguageModel.generate` and `.stream`.

Generation runs two kinds of graph over one set of weights (cells.decoder): a prefill per prompt-length
bucket (16, 24, 32, 48, 64, ... tokens; a batch is left-padded to the smallest bucket that holds its longest
prompt) and ONE decode graph for every step of every call of a given batch size, its cache slot and
positions tensors rather than constants. The loop over them is the engine's (mindvl.engine.decode_loop), the one
the server and the device run: each sequence of a batch is masked, positioned, sampled and stopped on its
own, so a prompt gives the same tokens in a batch as alone.

Open a folder with `mindvl.from_pretrained(folder)`; `LanguageModel(folder)` is what it builds.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator, List, Sequence, Union

import numpy as np

from mindvl.choices import GENERATION_WEIGHTS, KERNELS
from mindvl.errors import ConfigError
from mindvl.engine.decode_loop import DecodeBatch
from mindvl.engine.prompts import GenerationLimits, TextLayout
from mindvl.engine.sampling import Delta, Generation, sampling_config
from mindvl.generation.cell_graphs import CellGraphs
from mindvl.pretrained.llm import FORMAT, load_llm_tokenizer, load_llm_weights, read_llm_config, stored_shapes

Prompt = Union[str, Sequence[int]]  # text, or its token ids


def decoder_kernels(lm, kernels: str) -> None:
    """Swap the generation kernels `kernels` names into a decoder `lm`: "auto" and "fused" run RMSNorm and the
    rotary rotation as mindvl's CPU kernels (one pass each instead of five or six MindSpore kernels: 2x faster
    alone at every prefill and decode shape timed) and the LM head as one sgemm per worker over its share of
    the vocabulary: decode ~25% faster on Gemma 3 270M, the same tokens (docs/llm.md), and a quantized model's
    products as kernels that read the int8 / int4 weights as they are, and each decoder block's decode step as
    one kernel (cells/kernels/decoder_step.cc; Gemma 3 270M int4: ~37 -> ~55-79 tokens/s, docs/llm.md) where the
    block allows (no LoRA, a gated GELU-tanh or SiLU MLP). "standard" keeps MindSpore's operators. A float model's
    prefill products stay MindSpore's: at few rows they are no faster as the kernels' sgemm."""
    from mindvl.cells.kernels import use_kernels
    from mindvl.cells.kernels.cpu import (FusedDecodeStep, FusedHeadMatMul, FusedInt4MatMul, FusedInt8MatMul,
                                          FusedRMSNorm, FusedRotateHalf)

    KERNELS.check("kernels", kernels)
    use_kernels(lm, "standard" if kernels == "standard" else "fused",
                only=(FusedRMSNorm, FusedRotateHalf, FusedHeadMatMul, FusedInt8MatMul, FusedInt4MatMul, FusedDecodeStep))


def load_decoder(folder: Path, config: dict, cfg, cache_len: int, weights: str):
    """The folder's CausalLM with its weights, and the layout it generates with ("float32", "int8", "int4" or
    "gguf"). A quantized folder builds its quantized layers empty and loads them: the model is never held in
    float32. weights: mindvl.choices.GENERATION_WEIGHTS (checked by the caller); int8 / int4 quantize a float32
    folder once loaded."""
    from mindspore.nn.utils import no_init_parameters

    from mindvl.cells.decoder import CausalLM
    from mindvl.cells.quantize import quantize_model

    stored = config.get("weights", "float32")
    if stored != "float32" and weights not in ("stored", stored):
        raise ConfigError(f"weights={weights}: {folder} stores {stored} weights; convert the source again with "
                          f"`mindvl convert llm --weights {weights}`, or generate with the stored weights")
    with no_init_parameters():  # no random weights drawn only to be replaced (1 GB at Gemma 3 270M)
        lm = CausalLM(cfg, cache_len)
        if stored != "float32":
            quantize_model(lm, stored=stored_shapes(folder))
    load_llm_weights(folder, lm)
    if stored == "float32" and weights != "stored":
        quantize_model(lm, weights)
        return lm, weights
    return lm, stored


class LanguageModel:
    """A converted decoder (mindvl convert llm) with its tokenizer, ready to generate.

    cache_len: the key/value cache's length, the most prompt + new tokens one call holds (a bigger cache
    costs memory and a little time per step: layers * batch * cache_len * kv_width * 8 bytes).
    kernels: mindvl.choices.KERNELS; see `decoder_kernels`. weights: mindvl.choices.GENERATION_WEIGHTS, see
    `load_decoder`; `self.weights` says which layout generates."""

    def __init__(self, folder: Union[str, Path], cache_len: int = 1024, kernels: str = KERNELS.default,
                 weights: str = GENERATION_WEIGHTS.default):
        import mindspore as ms

        from mindvl.cells.decoder import Decode, Prefill

        self.folder = Path(folder)
        self.config, self.cfg = read_llm_config(self.folder)
        KERNELS.check("kernels", kernels)  # before the weights load
        GENERATION_WEIGHTS.check("weights", weights)
        limits = GenerationLimits.for_cache(min(cache_len, self.cfg.max_positions))
        self.cache_len = limits.cache_len
        self.tokens = self.config["tokens"]
        self.stop_ids = {int(t) for t in self.tokens.get("stop") or [] if t is not None}
        self.pad_id = int(self.tokens.get("pad") if self.tokens.get("pad") is not None else 0)
        self.tokenizer = load_llm_tokenizer(self.folder, self.config)
        ms.set_context(mode=ms.GRAPH_MODE)
        lm, self.weights = load_decoder(self.folder, self.config, self.cfg, self.cache_len, weights)
        self.lm = lm
        lm.set_train(False)
        decoder_kernels(lm, kernels)
        self.prefill_graph = Prefill(lm)
        self.decode_graph = Decode(lm)
        self.layout = TextLayout(self.tokenizer, limits, self.cfg.vocab_size, self.pad_id, self.stop_ids)
        self.graphs = CellGraphs(self.prefill_graph, self.decode_graph)

    # ------------------------------------------------------------------ tokens

    def encode(self, text: str) -> List[int]:
        """The prompt's ids as the model was trained to read them (BOS first where the tokenizer adds it)."""
        return self.tokenizer.encode(text).ids

    def decode_text(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    def logits(self, ids: Sequence[int]) -> np.ndarray:
        """Every position's logits (seq, vocab) of one sequence (parity checks, scoring)."""
        from mindspore import Tensor

        ids = np.asarray(ids, np.int32)[None]
        return self.lm(Tensor(ids), Tensor(np.ones_like(ids, bool))).asnumpy()[0]

    # ------------------------------------------------------------------ generation

    def _batch(self, prompts) -> list:
        return [prompts] if self.layout.is_single(prompts) else list(prompts)

    def stream(self, prompts, **settings) -> Iterator[Delta]:
        """Deltas as tokens are chosen, step by step, for every sequence still running; a Delta's `index` is
        its prompt's place in `prompts`. prompts: one prompt or a list (see `generate`)."""
        config = sampling_config(**settings)
        batch = self._batch(prompts)
        for _, delta in DecodeBatch(self.layout, self.graphs, sizes=(len(batch),)).stream(batch, config):
            yield delta

    def generate(self, prompts, **settings) -> Union[Generation, List[Generation]]:
        """The finished generation of each prompt: one Generation for one prompt, a list for a list. A prompt is
        text or its token ids (a list or 1-D array of ints, as `encode` gives them); settings: SamplingConfig's
        (max_new_tokens, temperature, top_k, top_p, repetition_penalty, stop_tokens, stop_strings, seed)."""
        batch = self._batch(prompts)
        results = DecodeBatch(self.layout, self.graphs, sizes=(len(batch),)).generate(batch, sampling_config(**settings))
        return results[0] if self.layout.is_single(prompts) else results


def is_llm_folder(folder: Union[str, Path]) -> bool:
    """A folder `mindvl convert llm` wrote (its config.json says so)."""
    from mindvl.pretrained.store import has_format

    return has_format(folder, FORMAT)
