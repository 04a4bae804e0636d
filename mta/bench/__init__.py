"""Benchmarks: ``python -m mta.bench <name>`` (see README).

* ``flash``: :mod:`mta.bench.flash`, ``mta.flash_attention`` against SDPA.
* ``conv``: :mod:`mta.bench.conv`, ``mta.conv_attention`` against the materialized
  reference, ``torch.compile`` of it, ``mta.flash_attention`` and SDPA.

Results go to ``figures/bench_<name>.json`` with a PNG beside it;
:mod:`mta.bench.plots` redraws them without a GPU. Submodules are imported
on use, so ``import mta.bench`` stays light.
"""
