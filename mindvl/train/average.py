"""`mindvl average`: a weighted mean of checkpoints of one architecture (a "model soup").

Checkpoints fine-tuned from one start (runs at other sequence lengths, resolutions or seeds, or the
last checkpoints of one run) often average into a model at least as good as each. The mean is
element-wise, so every ingredient must hold the same parameters with the same shapes and come from a
run whose config has the same `model` section; the soup takes every other section (preprocess, data,
train) from the first ingredient and is evaluated with them. The one shape that follows a setting, the
vision position table (one row per patch of preprocess.image_size), is resized to the first
ingredient's patch grid, so runs trained at other resolutions join the soup at the first one's.

Output: a run-like folder that `mindvl eval --run`, `mindvl export --checkpoint` and `mindvl.model_factory.load_model` accept:
`config.json`, `model.safetensors` and `average.json` (ingredients with the sha256 of their weights,
normalised weights, and the evaluation once `evaluate_soup` ran).
"""
import json
import math
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Union

import numpy as np
from safetensors.numpy import save_file

from mindvl.config import config_from_dict
from mindvl.errors import CheckpointError, ConfigError
from mindvl.files import atomic_write, sha256_file
from mindvl.model_factory import load_model
from mindvl.progress import progress_bar
from mindvl.runs import CONFIG_FILE, MODEL_FILE, load_model_weights, read_run_config, read_weights, resolve_checkpoint

SOUP_FILE = "average.json"
# model.pretrained.cache names a folder of cached encoder states, not part of the architecture: runs of
# one recipe keep theirs in different places.
LOCATION_KEYS = frozenset({"model.pretrained.cache"})
PathLike = Union[str, Path]


def normalise_weights(weights: Optional[Sequence[float]], count: int) -> List[float]:
    """Uniform when `weights` is None; otherwise one finite value >= 0 per ingredient, scaled to sum to 1."""
    if count < 2:
        raise ConfigError(f"ingredients: averaging needs at least 2 checkpoints, got {count}")
    if weights is None:
        return [1.0 / count] * count
    weights = [float(w) for w in weights]
    if len(weights) != count:
        raise ConfigError(f"weights: expected one per ingredient ({count}), got {len(weights)}: {weights}")
    if any(not math.isfinite(w) or w < 0 for w in weights):
        raise ConfigError(f"weights: expected finite values >= 0, got {weights}")
    total = sum(weights)
    if total <= 0:
        raise ConfigError(f"weights: expected a sum > 0 (at least one ingredient weighted), got {weights}")
    return [w / total for w in weights]


def _differences(a: Any, b: Any, path: str, ignore=frozenset()) -> List[str]:
    """Dotted keys where two config mappings differ, with both values."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [diff for key in sorted(set(a) | set(b)) if f"{path}.{key}" not in ignore
                for diff in _differences(a.get(key), b.get(key), f"{path}.{key}", ignore)]
    return [] if a == b else [f"{path} {a!r} vs {b!r}"]


POSITION_TABLE = "vision.pos_embed"


def _grid(config: Dict[str, Any]) -> int:
    return config["preprocess"]["image_size"] // config["model"]["vision"]["patch_size"]


def _at_first_resolution(name: str, value: np.ndarray, config: Dict[str, Any], first: Dict[str, Any]):
    """A run trained at another image size joins the soup at the first ingredient's: its position table
    is resized (bicubic, as DINOv2 interpolates) to the first one's patch grid. None if that cannot be."""
    from mindvl.engine.position_table import resize_positions

    grid_in, grid_out = _grid(config), _grid(first)
    if name != POSITION_TABLE or grid_in == grid_out or value.shape[1] != 1 + grid_in * grid_in:
        return None
    return resize_positions(value, grid_in, grid_out)


def _shape_hint(name: str, config: Dict[str, Any], first: Dict[str, Any]) -> str:
    differing = _differences(config["preprocess"], first["preprocess"], "preprocess")
    return (f"their preprocess sections differ in {', '.join(differing)}" if differing else
            "checkpoints of one architecture share every shape; was it written by another version of mindvl?")


def average_checkpoints(ingredients: Sequence[PathLike], weights: Optional[Sequence[float]], out: PathLike) -> Path:
    """Write the weighted mean of `ingredients` (run folders, step_* folders or model.safetensors files)
    to the folder `out` and return it. Means are taken in float64 and stored in float32; integer arrays
    must be equal in all ingredients. A CheckpointError names the ingredient and parameter that differ."""
    weights = normalise_weights(weights, len(ingredients))
    out = Path(out)
    files = [resolve_checkpoint(Path(source)) for source in ingredients]
    if (out / MODEL_FILE).resolve() in {f.resolve() for f in files}:
        raise CheckpointError(f"{out}: is one of the ingredients; pass another --out folder")
    configs = [read_run_config(f) for f in files]
    try:
        config_from_dict(configs[0])  # the soup's config must load
    except ConfigError as exc:
        raise ConfigError(f"{ingredients[0]}: its run config does not load in this mindvl: {exc}") from exc
    for source, config in zip(ingredients[1:], configs[1:]):
        differing = _differences(config["model"], configs[0]["model"], "model", LOCATION_KEYS)
        if differing:
            raise CheckpointError(f"{source}: its run config's model section differs from {ingredients[0]}'s in "
                                  f"{'; '.join(differing[:5])}; only checkpoints of one architecture can be averaged")

    total: Dict[str, np.ndarray] = {}
    resolutions: List[Dict[str, Any]] = []  # ingredients whose position table was resized
    for index, (source, path, weight) in enumerate(zip(ingredients, files, weights)):
        state = read_weights(path)
        if index == 0:
            shapes = {name: value.shape for name, value in state.items()}
            exact = {name: value for name, value in state.items() if not np.issubdtype(value.dtype, np.floating)}
        missing, unexpected = sorted(set(shapes) - set(state)), sorted(set(state) - set(shapes))
        if missing or unexpected:
            listed = ", ".join(f"{what} {names[:5]}" for what, names in
                               (("missing", missing), ("unexpected", unexpected)) if names)
            raise CheckpointError(f"{source}: holds other parameters than {ingredients[0]} ({listed}); only "
                                  f"checkpoints of one architecture can be averaged")
        for name, value in state.items():
            resized = _at_first_resolution(name, value, configs[index], configs[0]) if index else None
            if resized is not None and resized.shape == shapes[name]:
                resolutions.append({"source": str(source), "image_size": configs[index]["preprocess"]["image_size"],
                                    "grid": [_grid(configs[index]), _grid(configs[0])]})
                value = resized
            if value.shape != shapes[name]:
                raise CheckpointError(f"{source}: {name} has shape {value.shape} but {ingredients[0]} has "
                                      f"{shapes[name]}: {_shape_hint(name, configs[index], configs[0])}")
            if name in exact:
                if not np.array_equal(value, exact[name]):
                    raise CheckpointError(f"{source}: {name} is an integer array ({value.dtype}) that differs from "
                                          f"{ingredients[0]}'s; integer arrays cannot be averaged")
            else:
                total[name] = total.get(name, 0.0) + weight * value.astype(np.float64)
    soup = {name: exact[name] if name in exact else total[name].astype(np.float32) for name in shapes}

    atomic_write(out / MODEL_FILE, lambda tmp: save_file(soup, str(tmp)))
    atomic_write(out / CONFIG_FILE, lambda tmp: tmp.write_text(json.dumps(configs[0], indent=2)))
    differing_sections = sorted({key for config in configs[1:] for key in config
                                 if key != "model" and config.get(key) != configs[0].get(key)})
    record = {
        "ingredients": [{"source": str(source), "weights_file": str(path.resolve()), "sha256": sha256_file(path),
                         "weight": weight} for source, path, weight in zip(ingredients, files, weights)],
        "config": {"taken_from": str(ingredients[0]), "sections_differing": differing_sections},
        "resized_position_tables": resolutions,
        "evaluation": None,
    }
    _write_record(out, record)
    return out


def read_record(out: PathLike) -> Dict[str, Any]:
    path = Path(out) / SOUP_FILE
    if not path.is_file():
        raise CheckpointError(f"{out}: no {SOUP_FILE}; it is not a folder written by `mindvl average`")
    return json.loads(path.read_text())


def _write_record(out: Path, record: Dict[str, Any]) -> None:
    atomic_write(out / SOUP_FILE, lambda tmp: tmp.write_text(json.dumps(record, indent=2)))


def _vqa(cfg, model, progress: bool) -> Dict[str, Dict[str, float]]:
    """VQA accuracy with text and with spoken questions, the way `mindvl eval` measures it (a run trained
    from cached encoder states answers from that cache, filled for the test inputs first)."""
    from mindvl.data.reading.loader import split_inputs
    from mindvl.eval.vqa import vqa_accuracy
    from mindvl.pretrained.tokens import token_cache

    tokens = token_cache(cfg, model)
    if tokens is not None:
        tokens.fill(model, *split_inputs(cfg, "test"), progress=progress)
    return {"text": vqa_accuracy(cfg, model, "text", progress, tokens),
            "spoken": vqa_accuracy(cfg, model, "audio", progress, tokens)}


def evaluate_soup(out: PathLike, data_root: Optional[str] = None, progress: bool = True) -> List[Dict[str, Any]]:
    """VQA accuracy (text and spoken questions, test split) of each ingredient and of the average in `out`,
    all with the soup's config (the first ingredient's preprocess and data; `data_root` overrides the
    data set). Returns one row per model, the average last, and records them in average.json."""
    record = read_record(out)
    cfg, model, _ = load_model(out, data_root=data_root)  # builds the model once; each row loads its weights
    entries = [(item["source"], item["weight"], Path(item["weights_file"])) for item in record["ingredients"]]
    entries.append(("average", None, Path(out) / MODEL_FILE))
    rows = []
    for label, weight, path in progress_bar(entries, desc="evaluate soup", disable=not progress):
        load_model_weights(model, path)
        rows.append({"ingredient": label, "weight": weight, **_vqa(cfg, model, progress)})
    record["evaluation"] = {"data_root": str(cfg.data.root), "rows": rows}
    _write_record(Path(out), record)
    return rows


def format_report(record: Dict[str, Any]) -> str:
    """The soup as a table: ingredient, weight, text and spoken VQA accuracy, the best ingredient marked
    (mean of both accuracies) and the average last."""
    ingredients = record["ingredients"]
    lines = [f"model soup of {len(ingredients)} checkpoints; config (preprocess, data) from "
             f"{ingredients[0]['source']}"]
    if record["config"]["sections_differing"]:
        lines[0] += f" (its {', '.join(record['config']['sections_differing'])} differ between ingredients)"
    evaluation = record.get("evaluation")
    if not evaluation:
        lines += [f"  {item['weight']:.3f}  {item['source']}" for item in ingredients]
        return "\n".join(lines + ["not evaluated"])
    rows = evaluation["rows"]
    score = [(row["text"]["accuracy"] + row["spoken"]["accuracy"]) / 2 for row in rows]
    best = max(range(len(rows) - 1), key=score.__getitem__)
    width = max(len("ingredient"), *(len(row["ingredient"]) for row in rows))
    lines.append(f"test split of {evaluation['data_root']} ({rows[-1]['text']['count']} questions per modality)")
    lines.append(f"  {'ingredient':<{width}}  weight  text VQA  spoken VQA")
    for index, row in enumerate(rows):
        weight = "-" if row["weight"] is None else f"{row['weight']:.3f}"
        lines.append(f"{'*' if index == best else ' '} {row['ingredient']:<{width}}  {weight:>6}  "
                     f"{row['text']['accuracy']:>8.1%}  {row['spoken']['accuracy']:>10.1%}")
    gain = [100 * (rows[-1][key]["accuracy"] - rows[best][key]["accuracy"]) for key in ("text", "spoken")]
    lines.append(f"* best ingredient (mean of text and spoken VQA); the average is {gain[0]:+.1f} (text) and "
                 f"{gain[1]:+.1f} (spoken) points from it")
    return "\n".join(lines)
