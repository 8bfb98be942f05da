"""One distribution, one namespace: cells/, export/, serving/ and lite/ install as mindvl.cells, ..."""
from setuptools import find_packages, setup

MAPPED = {"cells": "mindvl.cells", "export": "mindvl.export", "serving": "mindvl.serving", "lite": "mindvl.lite",
          "parallel_configs": "mindvl.parallel_configs"}  # the last holds only data: the strategy files

VERSION = {}
exec(open("mindvl/version.py", encoding="utf-8").read(), VERSION)  # the one place the version is written

packages = find_packages(include=["mindvl", "mindvl.*"])
package_dir = {"mindvl": "mindvl"}
for folder, package in MAPPED.items():
    package_dir[package] = folder
    packages.append(package)
    for sub in find_packages(where=folder):
        packages.append(f"{package}.{sub}")
        package_dir[f"{package}.{sub}"] = f"{folder}/{sub.replace('.', '/')}"

setup(
    name="mindvl",
    version=VERSION["__version__"],
    description="Native MindSpore multimodal (vision + text + audio) training and deployment",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.9,<3.12",
    packages=packages,
    package_dir=package_dir,
    # the C++ sources compiled on first use (the Lite 2.0 bridge, the on-device runner, the fused CPU kernels)
    package_data={"mindvl": ["configs/*.yaml"],
                  "mindvl.lite": ["bridge.cc", "runner/CMakeLists.txt", "runner/*.cc", "runner/*.h"],
                  "mindvl.serving": ["demo/*.html", "demo/*.js", "demo/*.css"],  # the demo page (mindvl serve)
                  "mindvl.parallel_configs": ["*.yaml", "README.md"], "mindvl.cells.kernels": ["*.cc", "*.h"]},
    install_requires=[
        "mindspore==2.10.0",
        "numpy>=1.26,<2",
        "pillow>=10,<14",
        "pyyaml>=6,<7",
        "librosa>=0.10,<0.12",
        "tokenizers>=0.19,<0.24",
        "sentencepiece>=0.2,<0.3",  # a GGUF vocabulary as a small model (mindvl.preprocess.sentencepiece_vocab)
        "safetensors>=0.4,<0.9",
        "tqdm>=4.66,<5",
        "tensorboardX>=2.6,<3",
        "easy-vqa==1.0",
        "espeakng-loader>=0.2.4,<0.3",
        "onnx==1.17.0",  # reads the DINOv2 weights (mindvl convert dinov2); 1.17 is the last for numpy 1.x
        "gguf==0.19.0",  # reads and dequantizes GGUF LLM weights (mindvl convert llm); works with numpy 1.26
        # its GGUF tokenizer builder (mindvl convert llm --gguf; no PyTorch needed): an internal module, so pinned
        "transformers==5.24.0",
        "aiohttp>=3.9,<4",  # the REST endpoint (mindvl serve)
        "grpcio>=1.60,<2",  # the gRPC endpoint, MindSpore Serving's MSService/Predict
        "prometheus_client>=0.17,<1",  # /metrics of mindvl serve
        "protobuf>=4.21",  # gRPC messages, built from descriptors at import (no generated code)
        "pycocoevalcap==1.2",  # BLEU-4 and CIDEr-D of the generative model's descriptions (mindvl eval)
        "matplotlib>=3.8,<4",  # the pictures (mindvl plot, plan --plot, the quickstart's plots), Agg only
        "jinja2>=3.1,<4",  # renders a checkpoint's chat template to check it against the family's (convert vlm)
        "av>=14,<19",  # decodes video files (PyAV, FFmpeg's libraries in the wheel) for native-resolution VLMs
        "llguidance>=1.9,<2",  # structured output: JSON schema / regex / choice compiled into per-token masks
    ],
    # onnxruntime: the peer runtime the ONNX export is checked against (tests only; mindvl never imports it)
    # import-linter: the import contracts in .importlinter, checked by tests/test_imports.py
    # openai: the real OpenAI client the chat API is tested with (tests/serving/test_generation.py)
    # jsonschema: validates the structured output the server generates against its schema (tests only)
    # pytest-xdist: the suite in two processes (pyproject.toml addopts, tests/conftest.py WORKERS)
    # selenium: drives the distribution's chromium + chromedriver for the demo page's tests (tests/serving/)
    extras_require={"test": ["pytest>=8,<10", "pytest-xdist>=3.8,<4", "onnxruntime==1.32.0", "import-linter>=2.1,<3",
                             "openai>=1.40,<4", "selenium>=4.20,<5", "jsonschema>=4,<5"]},
    entry_points={"console_scripts": ["mindvl = mindvl.cli:main"]},
)
