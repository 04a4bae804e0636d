"""python -m mta.bench BENCHMARK: run a benchmark on a CUDA GPU, write JSON and a PNG.

Each benchmark is one subcommand (``flash``, ``conv``, ``order``); to add one, give it an
``add_<name>_parser`` and a ``run_<name>`` below and list it in ``COMMANDS``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mta.figures import FIGURES_DIR

REPO_ROOT = FIGURES_DIR.parent

#: Exit status when no CUDA device is present: the benchmarks only produce real GPU numbers.
EXIT_NO_CUDA = 2


def repo_path(path: str) -> Path:
    """``path`` as given if absolute, else relative to the repository root (not the working directory)."""
    p = Path(path)
    return p if p.is_absolute() else REPO_ROOT / p


def add_common_args(parser: argparse.ArgumentParser, default_out: str, quick_help: str) -> None:
    """``--quick``, ``--out`` and the timing options, which every benchmark takes."""
    parser.add_argument("--quick", action="store_true", help=f"reduced set for development: {quick_help}")
    parser.add_argument("--out", default=default_out,
                        help=f"JSON path, relative to the repository root (default {default_out}); "
                             "the PNG goes next to it")
    parser.add_argument("--warmup", type=int, default=10, help="untimed calls before timing (default 10)")
    parser.add_argument("--rep", type=int, default=30, help="timed calls; the median is reported (default 30)")


def add_flash_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "flash", help="mta.flash_attention vs SDPA flash and cuDNN backends",
        description="Forward and backward TFLOPS of mta.flash_attention, SDPA's flash backend and SDPA's cuDNN "
                    "backend, after checking mta against SDPA. Writes JSON and a PNG next to it. Exit status: "
                    f"0 ok, 1 mta failed a correctness check, {EXIT_NO_CUDA} no CUDA device.")
    add_common_args(p, "figures/bench_flash.json", "bf16, N in {2048, 8192}")
    p.set_defaults(run=run_flash)


def run_flash(args) -> int:
    from .flash import run
    return run(quick=args.quick, out=repo_path(args.out), warmup=args.warmup, rep=args.rep)


def add_conv_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "conv", help="mta.conv_attention vs the materialized reference, torch.compile of it, mta.flash_attention, SDPA",
        description="Forward time and peak extra memory of mta.conv_attention (MTA), the materialized "
                    "conv_attention_reference (where it fits in memory), torch.compile of it, mta.flash_attention "
                    "and SDPA, causal bf16, after checking mta.conv_attention against the reference. Prints a table "
                    "and the bars at N=8192, kernel 6x11; writes JSON and a PNG next to it. Exit status: "
                    f"0 ok, 1 mta.conv_attention failed a correctness check, {EXIT_NO_CUDA} no CUDA device.")
    add_common_args(p, "figures/bench_conv.json", "kernel 6x11, N in {2048, 8192}")
    p.add_argument("--no-compile", dest="compile_reference", action="store_false",
                   help="leave out torch.compile of the reference (it recompiles for every shape)")
    p.add_argument("--resume", action="store_true",
                   help="go on from the shapes already in --out (an interrupted run of the same code and machine)")
    p.set_defaults(run=run_conv)


def run_conv(args) -> int:
    from .conv import run
    return run(quick=args.quick, out=repo_path(args.out), warmup=args.warmup, rep=args.rep,
               compile_reference=args.compile_reference, resume=args.resume)


def add_order_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "order", help="causal kernels with tiles launched heaviest first vs in the natural order",
        description="Times the causal flash forward and the MTA forward kernel with their tiles numbered "
                    "heaviest first (as shipped) and in the natural order, same tile config, same inputs, "
                    "and checks both give the same output. Writes JSON and a PNG next to it. Exit status: "
                    f"0 ok, 1 the outputs differ, {EXIT_NO_CUDA} no CUDA device.")
    add_common_args(p, "figures/bench_launch_order.json", "N in {2048, 8192}")
    p.set_defaults(run=run_order)


def run_order(args) -> int:
    from .launch_order import run
    return run(quick=args.quick, out=repo_path(args.out), warmup=args.warmup, rep=args.rep)


COMMANDS = (add_flash_parser, add_conv_parser, add_order_parser)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m mta.bench", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="benchmark", required=True, metavar="BENCHMARK")
    for add_parser in COMMANDS:
        add_parser(subparsers)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print(f"python -m mta.bench {args.benchmark}: no CUDA device (torch.cuda.is_available() is False). "
              "The benchmarks time GPU kernels and only run on a CUDA GPU (H100/H200); "
              "to plot committed results on this machine, use mta.bench.plots.", file=sys.stderr)
        return EXIT_NO_CUDA
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
