"""`mindvl average`: a model soup of checkpoints of one architecture."""
import argparse


def _average(args) -> None:
    from mindvl.train.average import average_checkpoints, evaluate_soup, format_report, read_record
    out = average_checkpoints(args.ingredients, args.weights, args.out)
    if not args.no_eval:
        evaluate_soup(out, args.data_root)
    print(format_report(read_record(out)))
    print(f"wrote {out} (mindvl eval --run {out})")


def register(commands: argparse._SubParsersAction) -> None:
    average = commands.add_parser("average", help="average checkpoints of one architecture (a model soup) and "
                                  "compare its VQA accuracy with each ingredient's")
    average.add_argument("ingredients", nargs="+", metavar="RUN_OR_CKPT",
                         help="run folder, checkpoint folder or model.safetensors (at least 2)")
    average.add_argument("--out", required=True, help="folder to write: config.json, model.safetensors, average.json")
    average.add_argument("--weights", nargs="+", type=float, metavar="W",
                         help="one weight >= 0 per ingredient, normalised to sum 1 (default: uniform)")
    average.add_argument("--data-root", help="data set to evaluate on (default: the first ingredient's data.root)")
    average.add_argument("--no-eval", action="store_true", help="only write the average")
    average.set_defaults(func=_average)
