"""`mindvl kernels`: the machine the fused CPU kernels run on and what train.kernels "auto" chose there."""
import argparse
import os


def _kernels(args) -> None:
    from mindvl.cells.kernels import ARCH_ENV, cache_dir, library
    from mindvl.cells.kernels.auto import CHOICES_FILE, build_key, forget, table
    from mindvl.cells.kernels.machine import describe

    folder = cache_dir()
    if args.clear:
        print(f"{'removed' if forget(folder) else 'no decisions in'} {folder / CHOICES_FILE}")
        return
    arch = os.environ.get(ARCH_ENV, "native")
    print(describe(arch))
    path = library(arch)
    print(f"kernels: {path}" if path else "kernels: not available here (the warning above says why); training keeps "
          "MindSpore's standard operators")
    print(f"decisions: {folder / CHOICES_FILE}")
    builds = [] if args.all else [build_key(path)] if path else []
    for line in table(folder, builds):
        print(line)


def register(commands: argparse._SubParsersAction) -> None:
    kernels = commands.add_parser("kernels", help="the machine the fused CPU kernels run on and which operations "
                                  "train.kernels=auto runs fused there, with the timings it decided on")
    kernels.add_argument("--all", action="store_true", help="the decisions of every build and thread count cached "
                         "here, not only this one's")
    kernels.add_argument("--clear", action="store_true", help="forget the decisions: the next training run times "
                         "its operations again")
    kernels.set_defaults(func=_kernels)
