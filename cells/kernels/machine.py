"""What machine the kernels run on, in words: CPU model, the vector ISA extensions it has, the -march target
the kernels are built for (and what g++ resolves "native" to) and the kernel threads. Benchmarks print it
(speed figures mean little without it: the same code ran 3-5x slower on an AVX2 EPYC than on an AVX-512
Xeon, issue 22) and `mindvl kernels` shows it above the decisions of train.kernels "auto"."""
import os
import shutil
import subprocess
from functools import lru_cache
from pathlib import Path
from typing import Dict, List

# the extensions that decide which code paths compilers and libraries pick, oldest first
ISA_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
             "avx512_fp16", "amx_tile", "amx_bf16")


@lru_cache(maxsize=None)
def _cpuinfo() -> Dict[str, str]:
    """The first processor's fields of /proc/cpuinfo ({} where there is none), read once."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    fields = {}
    for line in text.split("\n\n", 1)[0].splitlines():
        if ":" in line:
            key, value = line.split(":", 1)
            fields[key.strip()] = value.strip()
    return fields


def cpu_model() -> str:
    return _cpuinfo().get("model name", "unknown CPU")


def cpu_identity() -> str:
    """-march=native code runs on this CPU model only: its name and flags go into the kernels' build hash."""
    info = _cpuinfo()
    return f"{info.get('model name', 'unknown')};{info.get('flags', '')}"


def isa_flags() -> List[str]:
    """The ISA_FLAGS this CPU has."""
    present = set(_cpuinfo().get("flags", "").split())
    return [flag for flag in ISA_FLAGS if flag in present]


def machine_kind() -> str:
    """"AVX-512", "AVX2" or "pre-AVX2": the kinds the README keeps one table each for."""
    flags = isa_flags()
    return "AVX-512" if "avx512f" in flags else "AVX2" if {"avx2", "fma"} <= set(flags) else "pre-AVX2"


def machine_line() -> str:
    """The CPU, its kind, its ISA flags and its cores: the line every benchmark prints first."""
    return f"{cpu_model()}; {machine_kind()} ({' '.join(isa_flags())}); {os.cpu_count()} cores"


@lru_cache(maxsize=None)
def resolved_march(arch: str) -> str:
    """What g++ makes of -march=`arch` (e.g. native -> sapphirerapids), or `arch` where it cannot say."""
    compiler = shutil.which(os.environ.get("CXX", "g++"))
    if compiler is None:
        return arch
    done = subprocess.run([compiler, f"-march={arch}", "-Q", "--help=target"], capture_output=True, text=True)
    for line in done.stdout.splitlines():
        words = line.split()
        if len(words) == 2 and words[0] == "-march=":
            return words[1]
    return arch


def kernel_threads() -> int:
    """The kernels' pool size (pool.h reads the same variable)."""
    return int(os.environ.get("MINDVL_KERNEL_THREADS") or os.cpu_count() or 1)


def describe(arch: str) -> str:
    """One line: CPU, kind, ISA flags, kernel build target, cores and kernel threads."""
    resolved = resolved_march(arch)
    target = arch if resolved == arch else f"{arch} ({resolved})"
    return (f"{cpu_model()}; {machine_kind()} ({' '.join(isa_flags()) or 'no vector flags read'}); kernels built "
            f"-march={target}; {os.cpu_count()} cores, {kernel_threads()} kernel threads")
