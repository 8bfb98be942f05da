"""`mindvl export hf`: a native-resolution VLM back to the ecosystem as a Hugging Face folder of its family, which
transformers, vLLM and vllm-mindspore load: a converted folder as it was read, or a run trained from one (LoRA
merged into the weights first, mindvl.model_factory.merge_lora) in the layout and with the files of the checkpoint
it came from (model.native.converted)."""
from pathlib import Path
from typing import Callable, Union

from mindvl.errors import ConfigError


def export_hf(source: Union[str, Path], out: Union[str, Path], log: Callable[[str], None] = print) -> Path:
    """Write `source` (a folder of `mindvl convert vlm`, or a native run: its folder, a step_* or a merged run) as
    the Hugging Face folder `out`."""
    from mindvl.model_factory import load_model, merge_lora
    from mindvl.pretrained.vlm import is_vlm_folder, write_hf
    from mindvl.runs import is_run_folder, parameter_paths

    if is_vlm_folder(source):
        return write_hf(source, out, log=log)
    if not (is_run_folder(Path(source)) or str(source).endswith(".safetensors")):
        raise ConfigError(f"{source}: neither a converted VLM (mindvl convert vlm) nor a training run; `mindvl export "
                          f"hf` writes those")
    cfg, model, _ = load_model(source)
    native = cfg.model.native
    if not cfg.model.is_native or not native.converted:
        raise ConfigError(f"{source}: not a run of a converted Qwen2-VL / Qwen2.5-VL (model.native.converted is "
                          f"empty); `mindvl export hf` writes those back")
    if not Path(native.converted).is_dir():
        raise ConfigError(f"model.native.converted: {native.converted} does not exist; the run is written back with "
                          f"the files of the checkpoint it came from: convert that checkpoint there again")
    merged_cfg, merged = merge_lora(cfg, model)
    tensors = {name: param.asnumpy() for name, param in parameter_paths(merged).items()}
    log(f"{source}: {cfg.model.native.family}, {'LoRA merged, ' if merged is not model else ''}written back with "
        f"the files of {native.converted}")
    return write_hf(native.converted, out, tensors, merged_cfg.model.decoder, Path(native.tokenizer), log=log)
