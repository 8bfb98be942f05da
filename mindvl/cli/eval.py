"""`mindvl eval`: evaluate a trained run (the classifier's answers and retrieval, or a generative model's
generated answers and descriptions)."""
import argparse
import json

from mindvl.errors import ConfigError


def _eval(args) -> None:
    from mindvl.eval import evaluate
    from mindvl.eval.generated_answers import evaluate_generative
    from mindvl.model_factory import load_model
    cfg, model, _ = load_model(args.run, data_root=args.data_root)
    if not cfg.model.generative:
        for flag, given in (("--limit", args.limit), ("--weights", args.weights)):
            if given:
                raise ConfigError(f"{flag}: {args.run} is a classifier, whose evaluation reads the whole split (one "
                                  f"batched pass); {flag} is for a generative run's generated answers. Leave it out")
        report = evaluate(cfg, model)
    else:
        quantized = {}
        if args.weights:  # the decoder's products and token table, as `mindvl generate --weights` runs them
            from mindvl.cells.quantize import quantize_model
            quantized = {"weights": args.weights, "quantized": quantize_model(model.decoder, args.weights)}
        report = {**quantized, **evaluate_generative(cfg, model, limit=args.limit)}
    print(json.dumps(report, indent=2))


def _count(value: str) -> int:
    count = int(value)
    if count < 0:
        raise argparse.ArgumentTypeError(f"{value}: a count of questions, 0 (all) or more")
    return count


def register(commands: argparse._SubParsersAction) -> None:
    evaluate = commands.add_parser("eval", help="evaluate a trained run")
    evaluate.add_argument("--run", required=True, help="run folder, checkpoint folder or model.safetensors")
    evaluate.add_argument("--data-root", help="data set folder (default: the run's data.root)")
    evaluate.add_argument("--limit", type=_count, default=0, metavar="N",
                          help="a generative run: only the split's first N typed questions, N spoken questions and "
                               "N descriptions (over a pretrained decoder ~0.5 s each on 2 cores); 0: all (default)")
    evaluate.add_argument("--weights", choices=("int8", "int4"), default=None,
                          help="a generative run: its decoder quantized weight-only first (int8 per channel, int4 in "
                               "groups of 32), generating through the quantized kernels")
    evaluate.set_defaults(func=_eval)
