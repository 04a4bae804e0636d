"""python -m mta.bench BENCHMARK: run a benchmark on a CUDA GPU, write JSON and a PNG (report: docs/performance.md)."""

from __future__ import annotations

import argparse
import functools
import inspect
import sys
from pathlib import Path

import torch
from tqdm.auto import tqdm

from . import report
from .conv import ConvBenchmark
from .decode import DecodeBenchmark
from .flash import FlashBenchmark
from .harness import REPO_ROOT, Tools, run_benchmark
from .host import HostBenchmark
from .launch_order import LaunchOrderBenchmark
from .model import ModelBenchmark
from .startup import StartupBenchmark
from .timing import peak_extra_memory_bytes, time_ms, wall_ms

BENCHMARKS = (FlashBenchmark, ConvBenchmark, LaunchOrderBenchmark, StartupBenchmark, DecodeBenchmark, HostBenchmark,
              ModelBenchmark)
#: Exit status when no CUDA device is present: the benchmarks only produce real GPU numbers.
EXIT_NO_CUDA = 2


def repo_path(path: str) -> Path:
    """``path`` as given if absolute, else relative to the repository root (not the working directory)."""
    p = Path(path)
    return p if p.is_absolute() else REPO_ROOT / p


def build_parser() -> argparse.ArgumentParser:
    """A subcommand per benchmark: ``--quick``, ``--out``, ``--resume``, for timed ones ``--warmup`` and ``--rep``,
    and the benchmark's own options."""
    parser = argparse.ArgumentParser(prog="python -m mta.bench", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="benchmark", required=True, metavar="BENCHMARK")
    for bench in BENCHMARKS:
        p = subparsers.add_parser(
            bench.name, help=bench.help,
            description=f"{inspect.cleandoc(bench.__doc__)} Writes JSON and a PNG next to it. Exit status: 0 ok, "
                        f"1 {bench.exit_1}, {EXIT_NO_CUDA} no CUDA device.")
        p.add_argument("--quick", action="store_true", help=f"reduced set for development: {bench.quick_help}")
        p.add_argument("--out", default=bench.out,
                       help=f"JSON path, relative to the repository root (default {bench.out}); "
                            "the PNG goes next to it")
        p.add_argument("--resume", action="store_true",
                       help="go on from the shapes already in --out (an interrupted run of the same code and machine)")
        if bench.timed:
            p.add_argument("--warmup", type=int, default=10, help="untimed calls before timing (default 10)")
            p.add_argument("--rep", type=int, default=30, help="timed calls; the median is reported (default 30)")
        for flag, kwargs in bench.options.items():
            p.add_argument(flag, **kwargs)
        p.set_defaults(bench=bench)
    p = subparsers.add_parser("report", help=report.HELP, description=f"{report.HELP[0].upper()}{report.HELP[1:]}. "
                              "Exit status: 0 ok (with --check: the page is up to date), 1 with --check: it is stale.")
    p.add_argument("--out", default=report.OUT,
                   help=f"the page, relative to the repository root (default {report.OUT})")
    p.add_argument("--figures", default=report.FIGURES,
                   help=f"the folder of bench_*.json, relative to the repository root (default {report.FIGURES})")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if the page differs from the render")
    return parser


def main(argv=None) -> int:
    """Runs the benchmark on the current CUDA GPU, timed by :mod:`mta.bench.timing` (``report``: renders the page)."""
    args = build_parser().parse_args(argv)
    if args.benchmark == "report":  # reads committed JSON: no GPU
        return report.main(out=repo_path(args.out), figures=repo_path(args.figures), check=args.check)
    if not torch.cuda.is_available():
        print(f"python -m mta.bench {args.benchmark}: no CUDA device (torch.cuda.is_available() is False). "
              "The benchmarks time GPU kernels and only run on a CUDA GPU (H100/H200); "
              "to plot committed results on this machine, use mta.bench.plots.", file=sys.stderr)
        return EXIT_NO_CUDA
    bench = args.bench(**{kw["dest"]: getattr(args, kw["dest"]) for kw in args.bench.options.values()})
    warmup, rep = getattr(args, "warmup", 10), getattr(args, "rep", 30)
    tools = Tools(timer=functools.partial(time_ms, warmup=warmup, rep=rep), memory=peak_extra_memory_bytes,
                  wall=functools.partial(wall_ms, warmup=warmup, rep=rep),
                  device=torch.device("cuda", torch.cuda.current_device()), warn=tqdm.write)
    return run_benchmark(bench, tools, out=repo_path(args.out), quick=args.quick, warmup=warmup, rep=rep,
                         resume=args.resume)


if __name__ == "__main__":
    sys.exit(main())
