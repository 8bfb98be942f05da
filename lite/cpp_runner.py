"""The C++ on-device runner (lite/runner/): build it with CMake against the Lite 2.0 wheel, and run it.

`mindvl_runner` is what a mobile app does with the MindSpore Lite C++ API: it reads a package's lite2/
folder, decodes and resizes the image (libpng / libjpeg, Pillow's bicubic in fixed point), tokenises the
question (a word vocabulary by hand, a decoder's SentencePiece model with libsentencepiece), builds lite2/vqa.mindir
(or generates over the generation graphs) and prints one JSON line with the answer. Python never links it: it
runs as a process, so it can sit next to MindSpore 2.10 (whose libmindspore_core.so clashes with the
wheel's). `build_runner` compiles it once per source into the runtime's cache, next to the bridge.
"""
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Optional, Sequence, Union

import numpy as np

from mindvl.errors import MindvlError
from mindvl.files import swap_folder, work_folder
from mindvl.lite import lite2_runtime
from mindvl.native import locked

SOURCE_DIR = Path(__file__).with_name("runner")
BINARY = "mindvl_runner"


class RunnerFailed(MindvlError, RuntimeError):
    """mindvl_runner exited non-zero: returncode 2 for unusable arguments, package files or inputs, 1 when
    the Lite runtime failed (None: timed out); the message is the runner's own error line."""

    def __init__(self, message: str, returncode: Optional[int], stderr: str = "") -> None:
        super().__init__(message)
        self.returncode, self.stderr = returncode, stderr


def _sources_digest(compiler: str) -> str:
    digest = hashlib.sha256(compiler.encode())
    for path in sorted(p for p in SOURCE_DIR.iterdir() if p.suffix in (".cc", ".h") or p.name == "CMakeLists.txt"):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def _build(folder: Path, runtime: Path, compiler: str, cmake: str) -> None:
    """Configure and compile into `folder` (a fresh build folder); Lite2Unavailable with the reason."""
    configure = [cmake, "-S", str(SOURCE_DIR), "-B", str(folder), f"-DMINDSPORE_LITE_DIR={runtime}",
                 f"-DCMAKE_CXX_COMPILER={compiler}", "-DCMAKE_BUILD_TYPE=Release"]
    for command, step in ((configure, "configuring"), ([cmake, "--build", str(folder), "-j", str(os.cpu_count() or 1)], "compiling")):
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode == 0:
            continue
        output = result.stdout + result.stderr
        for missing, package, fix in (("Could NOT find PNG", "PNG", "libpng-dev"),
                                      ("Could NOT find JPEG", "JPEG", "libjpeg-dev"),
                                      ("Could NOT find PkgConfig", "pkg-config", "pkg-config"),
                                      ("No package 'sentencepiece' found", "sentencepiece", "libsentencepiece-dev")):
            if missing in output:
                raise lite2_runtime.Lite2Unavailable(f"the C++ runner needs the {package} development files; install "
                                                     f"them (Debian: apt install {fix}; .ci/system-packages does)")
        raise lite2_runtime.Lite2Unavailable(f"{step} the C++ runner (lite/runner) failed: {output.strip()[-800:]}")


def build_runner() -> Path:
    """The compiled mindvl_runner for these sources and this runtime, building it on first use (~5 s):
    `lite2_runtime.home()/runner-<hash>/mindvl_runner`. Raises Lite2Unavailable when the runtime, cmake, a
    C++ compiler, libpng / libjpeg or libsentencepiece are missing, saying which."""
    if not (SOURCE_DIR / "CMakeLists.txt").is_file():
        raise lite2_runtime.Lite2Unavailable(f"{SOURCE_DIR}: the runner's C++ sources are not installed with this "
                                        f"mindvl; use a source checkout (pip install -e .)")
    runtime = lite2_runtime.ensure_runtime()
    compiler = shutil.which(os.environ.get("CXX", "g++"))
    cmake = shutil.which("cmake")
    for tool, name, fix in ((compiler, "a C++ compiler (g++)", "apt install g++, or set CXX"),
                            (cmake, "cmake", "apt install cmake, or pip install cmake"),
                            (shutil.which("make"), "make", "apt install make")):
        if tool is None:
            raise lite2_runtime.Lite2Unavailable(f"building the C++ runner needs {name} on PATH ({fix})")
    folder = lite2_runtime.home() / f"runner-{_sources_digest(compiler)}"
    binary = folder / BINARY
    if binary.is_file():
        return binary
    with locked(lite2_runtime.home()):
        if binary.is_file():  # another process built it while this one waited
            return binary
        work = work_folder(folder)
        try:
            _build(work, runtime, compiler, cmake)
            swap_folder(work, folder)  # whole or not at all (replacing a folder whose binary was deleted)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return binary


def _run(arguments: Sequence[str], timeout: float) -> dict:
    """mindvl_runner with `arguments` -> its last JSON line as a dict; RunnerFailed (exit code and the runner's
    message) when it fails or runs past `timeout` s."""
    command = [str(build_runner()), *map(str, arguments)]
    env = {**os.environ, "GLOG_v": os.environ.get("GLOG_v", "3")}  # Lite's INFO/WARNING lines off by default
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as exc:
        raise RunnerFailed(f"mindvl_runner: no answer within {timeout} s", None) from exc
    if result.returncode != 0:
        lines = result.stderr.strip().splitlines()
        mine = [line for line in lines if line.startswith("mindvl_runner:")]
        message = (mine or lines or [f"mindvl_runner exited with code {result.returncode}"])[-1]
        raise RunnerFailed(message, result.returncode, result.stderr)
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise RunnerFailed(f"mindvl_runner printed no JSON line: {result.stdout.strip()[-300:]!r}", 0, result.stderr)
    return json.loads(lines[-1])


def run_runner(package: Union[str, Path], image_path: Union[str, Path], question: str, threads: int = 1,
               timeout: float = 60, dump: Optional[Union[str, Path]] = None,
               preprocess_only: bool = False) -> dict:
    """Run mindvl_runner on one image and typed question -> its JSON line as a dict: answer, confidence,
    logits, answer_ids, preprocess_ms, build_ms, predict_ms (only preprocess_ms with preprocess_only).
    dump: a folder for the preprocessed tensors (image.f32, question_ids.i32, question_mask.f32).
    Raises RunnerFailed (exit code and the runner's message) when it fails or runs past `timeout` s."""
    arguments = [package, "--image", image_path, "--question", question, "--threads", int(threads)]
    if dump is not None:
        arguments += ["--dump", dump]
    if preprocess_only:
        arguments.append("--preprocess-only")
    return _run(arguments, timeout)


def run_generation(package: Union[str, Path], question: str, image: Optional[np.ndarray] = None,
                   mel: Optional[np.ndarray] = None, frame_mask: Optional[np.ndarray] = None, max_new_tokens: int = 0,
                   threads: int = 1, ignore_eos: bool = False, timeout: float = 300) -> dict:
    """mindvl_runner --generate on a generative package for one prompt: the typed `question` ('' when spoken), the
    preprocessed `image` (3, S, S) and the spoken question's `mel` (n_mels, T) and `frame_mask` (T,) as the package's
    stored samples hold them (None: absent) -> its JSON line: text, tokens, logprobs, finish, prompt_tokens, bucket,
    build_ms, first_token_ms, decode_ms, decode_tokens_per_s. max_new_tokens 0: the package's. RunnerFailed as
    run_runner."""
    with tempfile.TemporaryDirectory(prefix="mindvl-runner-") as scratch:
        arguments = [package, "--generate", "--question", question, "--threads", int(threads)]
        for flag, value in (("--image-f32", image), ("--mel", mel), ("--frame-mask", frame_mask)):
            if value is not None:
                path = Path(scratch) / flag.strip("-")
                np.ascontiguousarray(value, np.float32).tofile(path)
                arguments += [flag, path]
        if max_new_tokens:
            arguments += ["--max-new-tokens", int(max_new_tokens)]
        if ignore_eos:
            arguments.append("--ignore-eos")
        return _run(arguments, timeout)


def run_tokenize(package: Union[str, Path], text: str, timeout: float = 60) -> dict:
    """mindvl_runner --tokenize: `text` as a user's turn on the device -> {"ids", "prompt" (the chat prompt of that
    typed question), "text" (the ids decoded)}."""
    return _run([package, "--tokenize", "--question", text], timeout)
