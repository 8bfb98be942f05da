"""Compiled C++ that mindvl builds on first use (the Lite 2.0 bridge, the fused CPU kernels): one way to
compile a shared library into a cache, once per source and flags, safe when several processes start at
once (tests, a server and a benchmark may all need it)."""
import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
from pathlib import Path
from typing import Iterator, Sequence

from mindvl.errors import BuildError
from mindvl.files import atomic_write


@contextlib.contextmanager
def locked(folder: Path) -> Iterator[None]:
    """One process at a time prepares `folder` (an exclusive lock on folder/.lock)."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def build_library(name: str, sources: Sequence[Path], folder: Path, flags: Sequence[str],
                  link: Sequence[str] = (), headers: Sequence[Path] = (), identity: str = "") -> Path:
    """folder/<name>-<hash>.so, compiled with $CXX (default g++) unless it exists; the hash covers the
    sources, the headers they include, the flags and `identity` (what else the build depends on, e.g. the
    CPU for -march=native). Written under another name and renamed, so a library is there whole or not at
    all. BuildError when there is no compiler or the compilation fails."""
    digest = hashlib.sha256(b"".join(Path(p).read_bytes() for p in [*sources, *headers])
                            + " ".join([*flags, *link, identity]).encode()).hexdigest()[:12]
    target = Path(folder) / f"{name}-{digest}.so"
    if target.is_file():
        return target
    compiler = shutil.which(os.environ.get("CXX", "g++"))
    if compiler is None:
        raise BuildError("no C++ compiler (g++) on PATH; install g++ (Debian: apt install g++) or set CXX")
    with locked(Path(folder)):
        if target.is_file():  # another process built it while this one waited
            return target

        def compile_into(partial: Path) -> None:
            done = subprocess.run([compiler, *flags, *map(str, sources), *link, "-o", str(partial)],
                                  capture_output=True, text=True)
            if done.returncode != 0:
                raise BuildError(f"compiling {name} failed: {done.stderr.strip()[-800:]}")

        atomic_write(target, compile_into)
    return target
