"""Issue 6's comparison table: a trained tiny teacher against its INT8, pruned and distilled packages,
every figure measured on the exported MindIR graphs (not the Python model).

    python benchmarks/compression.py [--data mindvl_data] [--work runs/compression] [--teacher RUN]
                                     [--student-epochs 2] [--prune-steps 200] [--student-alone]

Runs, skipping any step whose package already holds an evaluation (so an interrupted run continues):
build the data when missing; train the teacher (`tiny`, 1 epoch) unless --teacher names one; then
`mindvl export --evaluate` (the reference), `mindvl export quantize`, `mindvl export prune` and
`mindvl export distill` (recipe `tiny-student`, a quarter of the parameters). --student-alone adds the
same student trained without a teacher, to show what distillation adds. Finally every package's VQA
latency is measured again in this one process, one after the other, so the latency columns compare
like with like, and the table is printed (markdown, for the README).
"""
import argparse
import json
import os
from pathlib import Path

os.environ.setdefault("GLOG_v", "3")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default="mindvl_data")
    parser.add_argument("--work", default="runs/compression")
    parser.add_argument("--teacher", help="a trained tiny run (default: train one into WORK/tiny)")
    parser.add_argument("--student-epochs", type=int, default=2)
    parser.add_argument("--prune-steps", type=int, default=200)
    parser.add_argument("--student-alone", action="store_true", help="also train the student without a teacher")
    args = parser.parse_args(argv)

    from mindvl.cli import main as cli
    from mindvl.config import load_config
    from mindvl.data.build.builder import build_dataset
    from mindvl.deploy.evaluate_package import EVALUATION, comparison_table, measure_latency
    from mindvl.train import train

    work, data = Path(args.work), f"data.root={args.data}"
    build_dataset(load_config("tiny", [data]), progress=True)
    teacher = args.teacher or str(work / "tiny")
    if not args.teacher:
        train(load_config("tiny", [data, f"train.output_dir={teacher}"]), resume="auto")
    packages = {"tiny": ["export", "--checkpoint", teacher, "--evaluate"],
                "tiny-int8": ["export", "quantize", "--checkpoint", teacher],
                "tiny-pruned": ["export", "prune", "--checkpoint", teacher, "--steps", str(args.prune_steps),
                                "--run-dir", str(work / "tiny-pruned.run")],
                "tiny-student-distilled": ["export", "distill", "--teacher", teacher, "--set", data,
                                           "--set", f"train.epochs={args.student_epochs}",
                                           "--run-dir", str(work / "tiny-student-distilled.run")]}
    if args.student_alone:
        packages["tiny-student-alone"] = ["export", "--checkpoint", str(work / "tiny-student-alone.run"), "--evaluate"]
    for name, command in packages.items():
        out = work / "packages" / name
        if (out / EVALUATION).is_file():
            print(f"{name}: evaluated already ({out / EVALUATION})")
            continue
        if name == "tiny-student-alone":
            train(load_config("tiny-student", [data, f"train.epochs={args.student_epochs}",
                                               f"train.output_dir={work / 'tiny-student-alone.run'}"]), resume="auto")
        if cli([*command, "--out", str(out), "--force"]) != 0:
            raise SystemExit(f"{name}: `mindvl {' '.join(command)}` failed")
    paths = [work / "packages" / name for name in packages]
    for path in paths:  # latency again, one package after the other in one quiet process
        row = json.loads((path / EVALUATION).read_text())
        row.update(measure_latency(path))
        (path / EVALUATION).write_text(json.dumps(row, indent=2))
    print(comparison_table(paths))


if __name__ == "__main__":
    main()
