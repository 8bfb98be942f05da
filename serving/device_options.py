"""MindSpore Serving 2.0's device settings for `declare_model(context=..., options=...)`, as mindvl reads them.

A servable_config.py written for MindSpore Serving may build a `Context` with device infos (thread
counts, fp16 precision on a GPU, Ascend operator options) and pass it to `declare_model`. mindvl runs the
model on the CPU with MindSpore's own settings, so these are checked as MindSpore Serving checks them (an
unknown option is still an error, naming it) and kept on the Model for the log, but change nothing: the
file loads unedited, and `mindvl serve` says at load that the settings are not applied.
"""
from typing import Any, Dict, List, Sequence, Tuple


def _checked(options: Dict[str, Any], allowed: Sequence[str], what: str) -> Dict[str, Any]:
    """`options`, unless one is not `allowed`: then RuntimeError as MindSpore Serving words it."""
    unknown = [name for name in options if name not in allowed]
    if unknown:
        raise RuntimeError(f"Set {what} failed, unsupported option {unknown[0]} (it takes {', '.join(allowed)})")
    return dict(options)


class DeviceInfoContext:
    """One device's settings; subclasses name the options MindSpore Serving accepts for that device."""

    device_type = ""
    OPTIONS: Tuple[str, ...] = ()

    def __init__(self, **options: Any) -> None:
        self.options = _checked(options, self.OPTIONS, f"{self.device_type} device info")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.options.items())})"


class CPUDeviceInfo(DeviceInfoContext):
    device_type = "cpu"
    OPTIONS = ("precision_mode",)


class GPUDeviceInfo(DeviceInfoContext):
    device_type = "gpu"
    OPTIONS = ("precision_mode",)


class AscendDeviceInfo(DeviceInfoContext):
    device_type = "ascend"
    OPTIONS = ("insert_op_cfg_path", "input_format", "input_shape", "output_type", "precision_mode",
               "op_select_impl_mode", "fusion_switch_config_path", "buffer_optimize_mode")


class Context:
    """Runtime settings of a model: thread_num, thread_affinity_core_list, enable_parallel, and device infos."""

    OPTIONS = ("thread_num", "thread_affinity_core_list", "enable_parallel")

    def __init__(self, **options: Any) -> None:
        self.options = _checked(options, self.OPTIONS, "context")
        self.device_infos: List[DeviceInfoContext] = []

    def append_device_info(self, device_info: DeviceInfoContext) -> None:
        if not isinstance(device_info, DeviceInfoContext):
            raise RuntimeError(f"Parameter 'device_info' should instance of CPUDeviceInfo, GPUDeviceInfo, or "
                               f"AscendDeviceInfo, but actually {type(device_info)}")
        if any(info.device_type == device_info.device_type for info in self.device_infos):
            raise RuntimeError(f"Device info of type {device_info.device_type} has already been appended")
        self.device_infos.append(device_info)

    def __repr__(self) -> str:
        settings = [f"{k}={v!r}" for k, v in self.options.items()] + [repr(info) for info in self.device_infos]
        return f"Context({', '.join(settings)})"


class _DeviceOptions:
    """The options objects MindSpore Serving deprecated in 1.6 (still accepted there, and here): a Context
    holding one device's info."""

    DEVICE = DeviceInfoContext

    def __init__(self, **options: Any) -> None:
        self.context = Context()
        self.context.append_device_info(self.DEVICE(**options))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.context!r})"


class AclOptions(_DeviceOptions):
    DEVICE = AscendDeviceInfo


class GpuOptions(_DeviceOptions):
    DEVICE = GPUDeviceInfo
