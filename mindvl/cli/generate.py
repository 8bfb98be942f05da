"""`mindvl generate`: text from a converted LLM folder, printed as it is generated."""
import argparse
import sys

from mindvl.choices import KERNELS
from mindvl.errors import ConfigError


def _generate(args) -> None:
    from mindvl.generation.multimodal_generator import prompt_from_files
    from mindvl.loading import GENERATIVE_RUN, LLM, describe, from_pretrained

    found = describe(args.model)
    if found.kind == LLM:
        if args.image or args.audio:
            raise ConfigError(f"--model {args.model}: a converted LLM reads text only; --image and --audio need "
                              f"a trained generative run (mindvl train --config vlm-tiny)")
        model = from_pretrained(args.model, cache_len=args.cache_len, kernels=args.kernels)
        prompt = args.prompt
        print(args.prompt, end="", flush=True)
    elif found.kind == GENERATIVE_RUN:  # the question, with the image and the spoken question if given
        model = from_pretrained(args.model, cache_len=args.cache_len, kernels=args.kernels)
        prompt = prompt_from_files(args.prompt, model.pre, args.image, args.audio)
    else:
        raise ConfigError(f"--model {args.model}: {found.description}; `mindvl generate` answers with a converted "
                          f"LLM or a generative run (train a generative recipe, e.g. vlm-tiny); a classifier answers "
                          f"with `mindvl serve` or `mindvl eval`")
    finish = None
    for delta in model.stream(prompt, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                              top_k=args.top_k, top_p=args.top_p, repetition_penalty=args.repetition_penalty,
                              stop_strings=args.stop, seed=args.seed):
        print(delta.text, end="", flush=True)
        finish = delta.finish or finish
    print()
    print(f"[{finish}]", file=sys.stderr)


def register(commands: argparse._SubParsersAction) -> None:
    generate = commands.add_parser("generate", help="generate text with a converted LLM or a generative run",
                                   description="Greedy by default (temperature 0); the answer is printed token by "
                                               "token, the reason it ended ([stop] or [length]) on stderr. With a "
                                               "trained generative run: the question about --image, typed or "
                                               "spoken (--audio, a WAV file; the text may then be empty).")
    generate.add_argument("prompt", help="the prompt (a converted LLM) or the question (a generative run)")
    generate.add_argument("--model", required=True,
                          help="a folder written by `mindvl convert llm`, or a generative run (its folder or a "
                               "step_* checkpoint)")
    generate.add_argument("--image", help="an image file the question is about (a generative run)")
    generate.add_argument("--audio", help="the question spoken, a WAV file (a generative run)")
    generate.add_argument("--max-new-tokens", type=int, default=64)
    generate.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    generate.add_argument("--top-k", type=int, default=0, help="0: off")
    generate.add_argument("--top-p", type=float, default=1.0, help="1: off")
    generate.add_argument("--repetition-penalty", type=float, default=1.0, help="1: off")
    generate.add_argument("--stop", action="append", default=[], metavar="TEXT", help="a stop string (repeatable)")
    generate.add_argument("--seed", type=int, help="makes sampling reproducible")
    generate.add_argument("--cache-len", type=int, default=1024, help="prompt + new tokens at most")
    generate.add_argument("--kernels", choices=KERNELS.values, default=KERNELS.default,
                          help="auto (default) and fused: mindvl's CPU kernels (a converted LLM: RMSNorm, the "
                               "rotation and the LM head); standard: MindSpore's operators only")
    generate.set_defaults(func=_generate)
