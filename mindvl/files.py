"""Files and folders that are whole or absent, and the sha256 that proves a file unchanged.

Every writer of mindvl whose output outlives a crash (checkpoints, data shards and their resume markers,
converted encoders, the encoder cache, model packages, servable versions, compiled C++) writes through
these helpers: the content goes into a temporary name next to its destination, is flushed, and is renamed
into place, so a reader never sees half a file. Temporaries are named `.tmp_<name>_<pid>` (the folder an
old version is moved aside to: `.tmp_old_<name>_<pid>`), so a killed writer's leftovers can be told from a
live writer's by the pid. A leaf module: the standard library only.
"""
import hashlib
import os
import shutil
from pathlib import Path
from typing import Callable, Union

PathLike = Union[str, Path]


def sha256_file(path: PathLike, block: int = 1 << 20) -> str:
    """Hex sha256 of a file, read in `block`-byte chunks so multi-GB weights never sit in memory twice."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(block), b""):
            digest.update(chunk)
    return digest.hexdigest()


def fsync_dir(directory: PathLike) -> None:
    """Make a rename inside `directory` durable; skipped where directories cannot be opened (Windows)."""
    try:
        handle = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(handle)
    except OSError:
        pass
    finally:
        os.close(handle)


def fsync_file(path: PathLike) -> None:
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def fsync_tree(folder: PathLike) -> None:
    """fsync every file under `folder` and the folders themselves, before the folder is renamed into place."""
    for dirpath, _, filenames in os.walk(folder):
        for name in filenames:
            fsync_file(Path(dirpath) / name)
        fsync_dir(dirpath)


def pid_alive(pid: int) -> bool:
    """Whether process `pid` runs (a temporary or a lock named after it belongs to a live writer)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    except OSError:
        return False
    return True


def atomic_write(path: PathLike, write: Callable[[Path], None], durable: bool = True) -> Path:
    """Write a file so that `path` is either absent, the old file or the complete new one: `write`
    fills a temporary file next to it, which is fsynced and renamed over `path`. An exception in `write`
    leaves `path` untouched and removes the temporary file. durable=False skips the fsyncs: for caches,
    whose entries a crash may lose (they are recomputed) but never leave half written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_name(path)
    try:
        write(tmp)
        if durable:
            fsync_file(tmp)
        os.replace(tmp, path)
        if durable:
            fsync_dir(path.parent)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def temporary_name(target: PathLike, kind: str = "tmp") -> Path:
    """`.<kind>_<name>_<pid>` next to `target`: on the same file system, so the final rename is atomic."""
    target = Path(target)
    return target.with_name(f".{kind}_{target.name}_{os.getpid()}")


def work_folder(target: PathLike) -> Path:
    """An empty folder next to `target` to assemble it in (a leftover of this pid is cleared first)."""
    work = temporary_name(target)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    return work


def swap_folder(work: PathLike, target: PathLike, exclusive: bool = False) -> Path:
    """Rename the finished folder `work` to `target`, durably. An existing `target` is renamed aside first
    and deleted after the swap, so `target` is always the old folder or the new one, whole. `exclusive`:
    never replace; OSError (EEXIST/ENOTEMPTY) when `target` exists (a concurrent writer won the name)."""
    work, target = Path(work), Path(target)
    fsync_tree(work)
    target.parent.mkdir(parents=True, exist_ok=True)
    if exclusive:
        os.rename(work, target)
        fsync_dir(target.parent)
        return target
    old = None
    if target.exists():
        old = temporary_name(target, "tmp_old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(target, old)
    os.replace(work, target)
    fsync_dir(target.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return target
