"""`mindvl quickstart`: the whole path of a recipe in one folder, then its summary. A classifier recipe (the
default, tiny) goes from data to the served package, the device and the cascade (classifier.py); a generative
one (vlm-tiny, vlm-s, vlm-s-native) from data through its training stages to generated answers (vlm.py)."""
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

from mindvl.config import load_config
from mindvl.quickstart.classifier import run_classifier_quickstart
from mindvl.quickstart.vlm import run_generative_quickstart


def run_quickstart(workdir: str = "mindvl_quickstart", config: str = "tiny", overrides: Sequence[str] = (),
                   progress: bool = True, max_steps: Optional[int] = None) -> Dict[str, Any]:
    """`max_steps` bounds training (each stage of a generative recipe); 0 or None: the recipes' own."""
    work = Path(workdir)
    if load_config(config, overrides).model.generative:
        return run_generative_quickstart(work, config, overrides, progress, max_steps)
    bound = [f"train.max_steps={max_steps}"] if max_steps else []
    cfg = load_config(config, [f"data.root={work / 'data'}", f"train.output_dir={work / 'run'}", *overrides, *bound])
    return run_classifier_quickstart(work, cfg, progress)

__all__ = ["run_quickstart"]
