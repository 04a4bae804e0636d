"""Benchmarks, ``python -m mta.bench {flash,conv,order,decode,startup}`` (see README and
:mod:`mta.bench.harness`): results go to ``figures/bench_<name>.json`` with a PNG beside it; :mod:`mta.bench.plots`
redraws them without a GPU. Submodules are imported on use, so ``import mta.bench`` stays light.
"""
