"""`mindvl eval`: evaluate a trained run (the classifier's answers and retrieval, or a generative model's
generated answers and descriptions)."""
import argparse
import json


def _eval(args) -> None:
    from mindvl.eval import evaluate
    from mindvl.eval.generative import evaluate_generative
    from mindvl.models import load_model
    cfg, model, _ = load_model(args.run, data_root=args.data_root)
    report = (evaluate_generative if cfg.model.generative else evaluate)(cfg, model)
    print(json.dumps(report, indent=2))


def register(commands: argparse._SubParsersAction) -> None:
    evaluate = commands.add_parser("eval", help="evaluate a trained run")
    evaluate.add_argument("--run", required=True, help="run folder, checkpoint folder or model.safetensors")
    evaluate.add_argument("--data-root", help="data set folder (default: the run's data.root)")
    evaluate.set_defaults(func=_eval)
