"""Benchmarks, ``python -m mta.bench <name>`` (see README): ``flash`` (:mod:`mta.bench.flash`), ``conv``
(:mod:`mta.bench.conv`), ``order`` (:mod:`mta.bench.launch_order`), ``decode`` (:mod:`mta.bench.decode`) and
``startup`` (:mod:`mta.bench.startup`), each a :class:`mta.bench.harness.Benchmark`.

Results go to ``figures/bench_<name>.json`` with a PNG beside it; :mod:`mta.bench.plots` redraws them without a
GPU. Submodules are imported on use, so ``import mta.bench`` stays light.
"""
