"""`mindvl lora merge`: fold a run's LoRA adapters into its weights."""
import argparse


def _merge(args) -> None:
    from mindvl.train.lora import merge_run

    record = merge_run(args.run, args.out)
    print(f"merged {', '.join(record['merged'])} of {record['source']['checkpoint']} into {args.out} "
          f"({record['parameters']:,} parameters); load it like a run: mindvl eval --run {args.out}")


def register(commands: argparse._SubParsersAction) -> None:
    lora = commands.add_parser("lora", help="LoRA adapters of a trained run")
    sub = lora.add_subparsers(dest="lora_command", required=True, metavar="{merge}")
    merge = sub.add_parser("merge", help="fold the adapters into their weights: a run folder without LoRA",
                           description="Writes OUT/config.json, OUT/model.safetensors and OUT/merge.json; the merged "
                                       "model computes what the adapted one does.")
    merge.add_argument("run", help="run folder, step_* checkpoint folder or model.safetensors")
    merge.add_argument("--out", required=True, help="a new folder")
    merge.set_defaults(func=_merge)
