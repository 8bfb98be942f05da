"""`mindvl generate`: text from a converted LLM or VLM folder or a generative run, printed as it is generated."""
import argparse
import sys
from pathlib import Path

from mindvl.choices import GENERATION_WEIGHTS, KERNELS
from mindvl.errors import ConfigError


def _generate(args) -> None:
    from mindvl.generation.multimodal_generator import prompt_from_files
    from mindvl.loading import GENERATIVE_RUN, LLM, VLM, describe, from_pretrained

    from mindvl.generation.native_generator import NativeGenerator

    found = describe(args.model)
    if args.weights != GENERATION_WEIGHTS.default and found.kind != LLM:
        raise ConfigError(f"--weights {args.weights}: quantized generation takes a converted LLM folder (mindvl convert "
                          f"llm); --model {args.model} is a {found.description}")
    model = from_pretrained(args.model, cache_len=args.cache_len, kernels=args.kernels) \
        if found.kind in (VLM, GENERATIVE_RUN) else None
    native = isinstance(model, NativeGenerator)  # a converted VLM, or a native run trained from one
    if not native and (args.video or args.fps is not None or len(args.image) > 1):
        raise ConfigError(f"--model {args.model}: {found.description}; several --image, --video and --fps need a "
                          f"native-resolution VLM (mindvl convert vlm, or a run trained from one)")
    if native:  # --audio: a run that hears (model.native.audio); another refuses it by name
        if args.audio and not Path(args.audio).is_file():
            raise ConfigError(f"--audio {args.audio}: no such file")
        prompt = model.prompt(args.prompt, images=args.image, video=args.video, fps=args.fps, audio=args.audio)
    elif found.kind == LLM:
        if args.image or args.audio:
            raise ConfigError(f"--model {args.model}: a converted LLM reads text only; --image and --audio need "
                              f"a trained generative run (mindvl train --config vlm-tiny)")
        model = from_pretrained(args.model, cache_len=args.cache_len, kernels=args.kernels, weights=args.weights)
        prompt = args.prompt
        print(args.prompt, end="", flush=True)
    elif found.kind == GENERATIVE_RUN:  # the question, with the image and the spoken question if given
        prompt = prompt_from_files(args.prompt, model.pre, args.image[0] if args.image else None, args.audio)
    else:
        raise ConfigError(f"--model {args.model}: {found.description}; `mindvl generate` answers with a converted "
                          f"LLM or VLM or a generative run (train a generative recipe, e.g. vlm-tiny); a classifier answers "
                          f"with `mindvl serve` or `mindvl eval`")
    finish = None
    for delta in model.stream(prompt, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                              top_k=args.top_k, top_p=args.top_p, repetition_penalty=args.repetition_penalty,
                              stop_strings=args.stop, seed=args.seed, grammar=_grammar(args)):
        print(delta.text, end="", flush=True)
        finish = delta.finish or finish
    print()
    print(f"[{finish}]", file=sys.stderr)


def _grammar(args):
    """The structured output asked for (at most one of --json-schema, --json-object, --regex, --choice), or None."""
    import json

    from mindvl.engine.grammar import Grammar

    asked = [(flag, value) for flag, value in (("--json-schema", args.json_schema), ("--json-object", args.json_object),
                                               ("--regex", args.regex), ("--choice", args.choice)) if value]
    if len(asked) > 1:
        raise ConfigError(f"{asked[0][0]} and {asked[1][0]}: one structured output at a time")
    if not asked:
        return None
    flag, value = asked[0]
    if flag == "--json-schema":
        path = Path(value)
        if not path.is_file():
            raise ConfigError(f"--json-schema {value}: no such file; give a JSON schema file")
        try:
            return Grammar("json_schema", json.loads(path.read_text()))
        except ValueError as error:
            raise ConfigError(f"--json-schema {value}: not JSON ({error})") from None
    return {"--json-object": Grammar("json_object"), "--regex": Grammar("regex", value),
            "--choice": Grammar("choice", value)}[flag]


def register(commands: argparse._SubParsersAction) -> None:
    generate = commands.add_parser("generate", help="generate text with a converted LLM or a generative run",
                                   description="Greedy by default (temperature 0); the answer is printed token by "
                                               "token, the reason it ended ([stop] or [length]) on stderr. With a "
                                               "trained generative run: the question about --image, typed or "
                                               "spoken (--audio, a WAV file; the text may then be empty). With a "
                                               "converted VLM: the question about any number of --image and a "
                                               "--video, each at its own resolution.")
    generate.add_argument("prompt", help="the prompt (a converted LLM) or the question (a generative run)")
    generate.add_argument("--model", required=True,
                          help="a folder written by `mindvl convert llm` or `mindvl convert vlm`, or a generative "
                               "run (its folder or a step_* checkpoint)")
    generate.add_argument("--image", action="append", default=[],
                          help="an image file the question is about (a generative run: one; a VLM: repeatable, in "
                               "order)")
    generate.add_argument("--video", help="a video file the question is about (a converted VLM)")
    generate.add_argument("--fps", type=float, help="frames a second sampled from --video (default: the folder's, 2)")
    generate.add_argument("--audio", help="the question spoken, a WAV file (a generative run)")
    generate.add_argument("--max-new-tokens", type=int, default=64)
    generate.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    generate.add_argument("--top-k", type=int, default=0, help="0: off")
    generate.add_argument("--top-p", type=float, default=1.0, help="1: off")
    generate.add_argument("--repetition-penalty", type=float, default=1.0, help="1: off")
    generate.add_argument("--stop", action="append", default=[], metavar="TEXT", help="a stop string (repeatable)")
    generate.add_argument("--seed", type=int, help="makes sampling reproducible")
    generate.add_argument("--json-schema", metavar="FILE", help="the answer is JSON valid against this JSON schema")
    generate.add_argument("--json-object", action="store_true", help="the answer is a JSON object")
    generate.add_argument("--regex", help="the answer matches this regular expression (Rust's regex syntax)")
    generate.add_argument("--choice", action="append", metavar="TEXT", help="the answer is one of these (repeatable)")
    generate.add_argument("--cache-len", type=int, default=1024, help="prompt + new tokens at most")
    generate.add_argument("--kernels", choices=KERNELS.values, default=KERNELS.default,
                          help="auto (default) and fused: mindvl's CPU kernels (a converted LLM: RMSNorm, the "
                               "rotation and the LM head); standard: MindSpore's operators only")
    generate.add_argument("--weights", choices=GENERATION_WEIGHTS.values, default=GENERATION_WEIGHTS.default,
                          help="a converted LLM: stored (default) generates with the weights the folder stores; int8 "
                               "or int4 quantize a float32 folder as it loads (convert with --weights to load no "
                               "float32 copy)")
    generate.set_defaults(func=_generate)
