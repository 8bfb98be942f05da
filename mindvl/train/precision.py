"""The precision policy (train.precision), defined once and applied to the network the objectives see.

A low-precision policy goes through mindspore.amp: `custom_mixed_precision` with a black list runs
every cell in the low dtype except the kinds the policy keeps in float32 (plus amp's own black list and
mindvl's fused CPU kernels, which compute in float32),
which run in float32 and hand their output back in the low dtype; the network's outputs come back in
float32, so the objectives run in float32 unless `loss` says otherwise. Parameters stay float32.
"""
from typing import Sequence

import mindspore as ms
from mindspore import amp, nn

from mindvl.cells.activation import ScaledMaskedSoftmax
from mindvl.cells.kernels.cpu import CPU_CELLS
from mindvl.cells.norm import LayerNorm
from mindvl.config import PrecisionConfig
from mindvl.errors import ConfigError

KIND_CELLS = {"norm": (LayerNorm,), "softmax": (ScaledMaskedSoftmax,)}  # the cell classes of each kind the policy names


def apply_precision(network: nn.Cell, policy: PrecisionConfig) -> nn.Cell:
    """Return `network` converted to `policy` (amp converts its cells in place and wraps it so that its
    outputs are float32); a float32 policy returns `network` untouched."""
    if policy.compute == "float32":
        return network
    if policy.compute == "bfloat16" and ms.get_context("device_target") == "CPU":
        raise ConfigError("train.precision.compute: bfloat16 needs an Ascend chip; on the CPU use float16 "
                          "(correct, slower than float32) or float32")
    black_list = amp.get_black_list() + list(CPU_CELLS) + [cls for kind, classes in KIND_CELLS.items()
                                                               if getattr(policy, kind) == "float32" for cls in classes]
    return amp.custom_mixed_precision(network, black_list=black_list, dtype=getattr(ms, policy.compute))


def set_objective_precision(objectives: Sequence[nn.Cell], policy: PrecisionConfig) -> None:
    """The objectives compute in float32 unless train.precision.loss names the low dtype."""
    if policy.loss != "float32":
        for objective in objectives:
            objective.to_float(getattr(ms, policy.loss))


class NoLossScaling(amp.StaticLossScaler):
    """Loss scaling off: StaticLossScaler(1.0) whose scale and unscale return their input, so a float32
    step spends no multiply per gradient on a factor of 1 (on the CPU one kernel launch each, ~170 for
    the tiny model). `scale_value` stays a Parameter at 1 for the logs and checkpoints."""

    def __init__(self):
        super().__init__(1.0)

    def scale(self, inputs):
        return inputs

    def unscale(self, inputs):
        return inputs
