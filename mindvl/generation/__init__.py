"""Text generation with a converted pretrained decoder (mindvl convert llm): prefill and decode graphs
over a key/value cache, sampling on the host, streaming."""
from .model import Delta, Generation, LanguageModel, from_pretrained
from .sampling import SamplingConfig, next_tokens

__all__ = ["Delta", "Generation", "LanguageModel", "SamplingConfig", "from_pretrained", "next_tokens"]
