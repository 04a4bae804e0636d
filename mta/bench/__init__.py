"""Benchmarks: ``python -m mta.bench <name>`` (see README), each a :class:`mta.bench.harness.Benchmark`.

* ``flash``: :mod:`mta.bench.flash`, ``mta.flash_attention`` against SDPA.
* ``conv``: :mod:`mta.bench.conv`, ``mta.conv_attention`` against the materialized
  reference, ``torch.compile`` of it, ``mta.flash_attention`` and SDPA.
* ``order``: :mod:`mta.bench.launch_order`, heaviest-first tile order against the natural one.
* ``decode``: :mod:`mta.bench.decode`, ``mta.decode_attention`` and ``mta.conv_decode_attention`` against
  SDPA, flash attention used for decode, the reference's last row and a plain read of the same bytes.
* ``startup``: :mod:`mta.bench.startup`, the wait on each public function's first call.

Results go to ``figures/bench_<name>.json`` with a PNG beside it;
:mod:`mta.bench.plots` redraws them without a GPU. Submodules are imported
on use, so ``import mta.bench`` stays light.
"""
