"""train.kernels "auto" (cells/kernels/auto.py): it keeps whichever implementation is faster, shown on kernels
slowed on purpose (the fused one, then the standard one: no assertion rests on the machine's own speed), caches
the decision and reads it back, times again when the shapes or the kernel build change, survives a damaged
cache, refuses to run without a probe, and `mindvl kernels` shows the decisions."""
import json

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn

from mindvl.cells import kernels
from mindvl.cells.activation import GELU
from mindvl.cells.kernels import auto, cpu, use_kernels
from mindvl.cells.kernels.auto import CHOICES_FILE

SLOWDOWN = 40  # the slowed implementation runs its operation this many times in a row


class Repeated(nn.Cell):
    """`operation` applied SLOWDOWN times in a row: the same shapes, SLOWDOWN times the work."""

    def __init__(self, operation):
        super().__init__()
        self.operation = operation

    def construct(self, x):
        for _ in range(SLOWDOWN):
            x = self.operation(x)
        return x


class SlowFusedGELU(cpu.FusedGELU):
    """The fused GELU, then the standard GELU SLOWDOWN times: a kernel that loses to the standard operators by
    their own work many times over, on a loaded machine too (the fused kernel merely repeated may not lose there,
    where each of the standard operators waits for its threads to get a core while the kernel runs in one)."""

    def __init__(self, path):
        super().__init__(path)
        self.slowdown = Repeated(GELU())

    def construct(self, x):
        return self.slowdown(self.forward(x))


class SlowStandardGELU(cpu.FusedGELU):
    """The fused GELU against a slowed standard GELU: auto must keep the kernel."""

    def standard(self):
        return Repeated(GELU())


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.act = GELU()

    def construct(self, x):
        return self.act(x)


@pytest.fixture
def cache(monkeypatch, tmp_path):
    """An empty decision cache; the compiled kernels stay where they are (one build per machine)."""
    if kernels.library() is None:  # built (or found) in the usual cache first
        pytest.skip(f"no fused kernels here: {kernels._library}")
    monkeypatch.setattr(kernels, "_library", {arch: dict(value) for arch, value in kernels._library.items()})
    monkeypatch.setattr(kernels, "cache_dir", lambda: tmp_path)
    return tmp_path


def _choose(shape=(8, 64, 256)):
    """A GELU net after use_kernels "auto" probed at `shape` -> (net, swapped, the log lines)."""
    net, lines = Net(), []
    x = ms.Tensor(np.random.default_rng(0).normal(size=shape).astype(np.float32))
    swapped = use_kernels(net, "auto", device="CPU", probe=lambda: net(x), log=lines.append)
    return net, swapped, lines


def _decisions(folder):
    builds = json.loads((folder / CHOICES_FILE).read_text())["builds"]
    return {name: choice for build in builds.values() for name, choice in build.items()}


def test_auto_keeps_the_standard_operator_where_the_kernel_is_slower(cache, monkeypatch):
    monkeypatch.setattr(cpu, "FusedGELU", SlowFusedGELU)
    net, swapped, lines = _choose()
    assert swapped == 0 and type(net.act) is GELU
    (decision,) = _decisions(cache).values()
    assert decision["choice"] == "standard" and decision["fused_ms"] > decision["standard_ms"]
    assert decision["signature"] == "SlowFusedGELU[] (8,64,256)"
    assert len(lines) == 1 and "0 of 1 operations fused (SlowFusedGELU 0/1); 1 signature(s) timed" in lines[0]


def test_auto_keeps_the_kernel_where_it_is_faster_then_reads_the_decision_back(cache, monkeypatch):
    monkeypatch.setattr(cpu, "FusedGELU", SlowStandardGELU)
    net, swapped, lines = _choose()
    assert swapped == 1 and isinstance(net.act, SlowStandardGELU)
    (decision,) = _decisions(cache).values()
    assert decision["choice"] == "fused" and decision["fused_ms"] < decision["standard_ms"]
    timed = []
    monkeypatch.setattr(auto, "time_signature", lambda *a: timed.append(a) or (0.0, 1.0))
    net, swapped, lines = _choose()  # the same build and shapes: read back, nothing timed
    assert swapped == 1 and not timed and "all decisions cached" in lines[0]
    net, swapped, lines = _choose((4, 64, 256))  # new shapes: timed again
    assert len(timed) == 1 and timed[0][1] == [((4, 64, 256),)] and len(_decisions(cache)) == 2


def test_a_new_kernel_build_is_timed_again(cache, monkeypatch):
    flags = open("/proc/cpuinfo").read()
    if not all(f" {flag}" in flags for flag in ("avx2", "fma", "bmi2")):
        pytest.skip("no AVX2 + FMA: the x86-64-v3 build cannot run here")
    timed = []
    monkeypatch.setattr(auto, "time_signature", lambda *a: timed.append(a) or (1.0, 2.0))
    _choose()
    monkeypatch.setenv(kernels.ARCH_ENV, "x86-64-v3")
    _choose()
    builds = json.loads((cache / CHOICES_FILE).read_text())["builds"]
    assert len(timed) == 2 and len(builds) == 2  # one decision per build
    monkeypatch.setenv("MINDVL_KERNEL_THREADS", "1")  # another pool size: timed again as well
    _choose()
    assert len(timed) == 3


def test_a_damaged_cache_is_timed_again_and_rewritten(cache, monkeypatch):
    (cache / CHOICES_FILE).write_text('{"version": 1, "builds": {"trunc')
    monkeypatch.setattr(auto, "time_signature", lambda *a: (1.0, 2.0))
    net, swapped, _ = _choose()
    assert swapped == 1 and len(_decisions(cache)) == 1


def test_auto_without_a_probe_is_refused_naming_the_choices(cache):
    with pytest.raises(ValueError, match="'auto' times each operation .* needs a probe .* 'fused' or 'standard'"):
        use_kernels(Net(), "auto", device="CPU")


def test_operations_the_probe_does_not_reach_keep_the_standard_operators(cache, monkeypatch):
    class TwoBranches(nn.Cell):
        def __init__(self):
            super().__init__()
            self.used, self.unused = GELU(), GELU()

        def construct(self, x):
            return self.used(x)

    monkeypatch.setattr(auto, "time_signature", lambda *a: (1.0, 2.0))
    mode = ms.get_context("mode")
    net = TwoBranches()
    x = ms.Tensor(np.ones((2, 8), np.float32))
    assert use_kernels(net, "auto", device="CPU", probe=lambda: net(x), log=lambda line: None) == 1
    assert isinstance(net.used, cpu.FusedGELU) and type(net.unused) is GELU
    assert ms.get_context("mode") == mode  # the probe's PyNative mode is undone


def test_the_kernels_command_shows_the_machine_and_the_decisions(cache, monkeypatch, capsys):
    from mindvl.cli.main import main

    monkeypatch.setattr(auto, "time_signature", lambda *a: (1.25, 2.5))
    _choose()
    assert main(["kernels"]) == 0
    out = capsys.readouterr().out
    assert "kernels built -march=" in out and "kernel threads" in out
    assert "| fused | 1.250 | 2.500 | FusedGELU[] (8,64,256) |" in out
    assert main(["kernels", "--clear"]) == 0 and not (cache / CHOICES_FILE).exists()
    assert main(["kernels"]) == 0 and "nothing timed yet" in capsys.readouterr().out
