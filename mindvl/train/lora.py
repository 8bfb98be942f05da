"""`mindvl lora merge`: a trained run with its LoRA adapters folded into their weights, written as a folder
that every loader reads (`load_model`, `mindvl eval`, `mindvl generate`, export): config.json (lora_rank 0,
no converted folders: all weights travel in the model), model.safetensors and merge.json (where it came
from). The merged model computes what the adapted one does (mindvl.model_factory.merge_lora) with plain
projections: no adapter matmuls at inference, and a single weight file to deploy."""
import json
from pathlib import Path
from typing import Dict

from safetensors.numpy import save_file

from mindvl.config import STACKS
from mindvl.errors import ConfigError
from mindvl.files import atomic_write
from mindvl.model_factory import load_model, merge_lora
from mindvl.runs import CONFIG_FILE, MODEL_FILE, parameter_paths

MERGE_FILE = "merge.json"


def merge_run(source: str, out: str) -> Dict[str, object]:
    """Merge the LoRA adapters of `source` (a run folder, a step_* folder or a model.safetensors) into `out`;
    returns the record written to out/merge.json."""
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise ConfigError(f"--out {out}: not empty; merge into a new folder")
    cfg, model, origin = load_model(source)
    stacks = [name for name in (*STACKS, "decoder") if getattr(cfg.model, name).lora_rank]
    if not stacks:
        raise ConfigError(f"{source}: has no LoRA adapters (every lora_rank is 0); nothing to merge")
    merged_cfg, merged = merge_lora(cfg, model)
    out.mkdir(parents=True, exist_ok=True)
    if merged_cfg.model.is_native:  # its tokenizer travels with it, as its weights do
        tokenizer = out.resolve() / "tokenizer.json"
        atomic_write(tokenizer, lambda tmp: tmp.write_bytes(Path(cfg.model.native.tokenizer).read_bytes()))
        merged_cfg.model.native.tokenizer = str(tokenizer)
    weights = {name: param.asnumpy() for name, param in parameter_paths(merged).items()}
    atomic_write(out / MODEL_FILE, lambda tmp: save_file(weights, str(tmp)))
    atomic_write(out / CONFIG_FILE, lambda tmp: tmp.write_text(json.dumps(merged_cfg.to_dict(), indent=2)))
    record = {"source": origin, "merged": [f"model.{name}" for name in stacks],
              "parameters": sum(int(v.size) for v in weights.values())}
    atomic_write(out / MERGE_FILE, lambda tmp: tmp.write_text(json.dumps(record, indent=2)))
    return record
