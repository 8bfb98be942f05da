"""Text generation with a converted pretrained decoder (mindvl convert llm): prefill and decode graphs
over a key/value cache, sampling on the host, streaming."""
from mindvl.decoding import Delta, Generation, SamplingConfig, next_tokens

from .model import LanguageModel, from_pretrained

__all__ = ["Delta", "Generation", "LanguageModel", "SamplingConfig", "from_pretrained", "next_tokens"]
