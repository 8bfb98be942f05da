"""Generation with the framework's cells: a converted decoder (LanguageModel) or a trained multimodal model
(MultimodalGenerator), driven by the engine's one decode loop (mindvl.engine). Open either with
`mindvl.from_pretrained(folder)`."""
from mindvl.engine.sampling import Delta, Generation, SamplingConfig
from mindvl.generation.language_model import LanguageModel
from mindvl.generation.multimodal_generator import MultimodalGenerator, MultimodalPrompt
from mindvl.generation.native_generator import NativeGenerator

__all__ = ["Delta", "Generation", "LanguageModel", "MultimodalGenerator", "MultimodalPrompt", "NativeGenerator",
           "SamplingConfig"]
