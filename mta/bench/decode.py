"""Benchmark of a decode step, one new query per sequence against a KV cache of N tokens: :class:`DecodeBenchmark`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from mta import conv_attention_reference, conv_decode_attention, decode_attention, flash_attention
from mta.conv_decode_rows import conv_decode_rows

from . import conv
from .flash import tflops
from .harness import Benchmark, Pass, cuda_free_bytes, describe_error, measured, median_ratios, rel_err, shape_rows
from .plots import plot_decode  # chapter 06 plots the committed results through this module
from .timing import timing_config

DTYPE = "bfloat16"
NEW_QUERIES = 1
BATCHES = (1, 8)
CONFIGS = ((8, 8, 64), (32, 8, 128))  # (query heads, kv heads, head dim)
SEQ_LENS = tuple(1024 * 2 ** i for i in range(8))  # 1k .. 128k
QUICK_SEQ_LENS = (4096, 65536)
KERNEL = (6, 11)
WEIGHT_STD = conv.WEIGHT_STD

IMPLS = ("mta_decode", "mta_conv_decode", "sdpa", "mta_flash", "conv_reference", "read")
#: The implementations checked before timing, and the largest relative error each may have (bf16).
CHECKED = ("mta_decode", "mta_conv_decode")
TOLERANCE = 2e-2
KEYS = ("batch", "heads", "kv_heads", "head_dim", "seq_len")
#: The summary: per (batch, configuration), the medians over N >= 16384 (shorter is launch-bound) of mta_decode's
#: and mta_conv_decode's TB/s as a fraction of the plain read's, and of mta_decode's speedup over SDPA.
SUMMARY_RATIOS = {"decode_of_read_tbps": ("mta_decode", "read", "tbps"),
                  "conv_decode_of_read_tbps": ("mta_conv_decode", "read", "tbps"),
                  "sdpa_over_decode_time": ("sdpa", "mta_decode", "ms")}
SUMMARY_MIN_SEQ_LEN = 16384


@dataclass(frozen=True)
class DecodeShape:
    """``q [B, Hq, 1, D]``, caches ``k, v [B, Hkv, N, D]`` and ``q_cache [B, Hq, N, D]`` (MTA)."""

    dtype: str
    batch: int
    heads: int
    kv_heads: int
    head_dim: int
    seq_len: int
    new_queries: int = NEW_QUERIES

    def label(self) -> str:
        return f"{self.dtype} B={self.batch} Hq={self.heads} Hkv={self.kv_heads} D={self.head_dim} N={self.seq_len}"


def decode_shapes(quick: bool = False) -> list[DecodeShape]:
    """Grouped by (batch, configuration), N increasing."""
    return [DecodeShape(DTYPE, b, h, hkv, d, n) for b in BATCHES for (h, hkv, d) in CONFIGS
            for n in (QUICK_SEQ_LENS if quick else SEQ_LENS)]


def bytes_read(shape: DecodeShape, impl: str) -> int:
    """What a decode step must read: K and V; MTA also its ``cq - 1 + n`` query rows per head."""
    elem = torch.finfo(getattr(torch, shape.dtype)).bits // 8
    kv = 2 * shape.batch * shape.kv_heads * shape.seq_len * shape.head_dim * elem
    if impl in ("mta_conv_decode", "conv_reference"):
        kv += shape.batch * shape.heads * (KERNEL[0] - 1 + shape.new_queries) * shape.head_dim * elem
    return kv


def random_inputs(shape: DecodeShape, device) -> dict:
    """:func:`conv.random_inputs` as caches (``q_cache, k, v``, ``weight``) and the new queries, the last ``n`` rows
    of ``q_cache``."""
    q_cache, k, v, weight = conv.random_inputs(conv.ConvShape(shape.dtype, shape.batch, shape.heads, shape.kv_heads,
                                                              shape.head_dim, *KERNEL, shape.seq_len), device)
    return {"q": q_cache[:, :, -shape.new_queries:].contiguous(), "q_cache": q_cache, "k": k, "v": v, "weight": weight}


def sdpa(x: dict) -> torch.Tensor:
    return F.scaled_dot_product_attention(x["q"], x["k"], x["v"], enable_gqa=x["q"].shape[1] != x["k"].shape[1])


def default_impls() -> dict[str, Callable[[dict], torch.Tensor]]:
    return {
        "mta_decode": lambda x: decode_attention(x["q"], x["k"], x["v"]),
        "mta_conv_decode": lambda x: conv_decode_attention(x["q_cache"], x["k"], x["v"], x["weight"],
                                                           num_queries=x["q"].shape[2]),
        "sdpa": sdpa,
        "mta_flash": lambda x: flash_attention(x["q"], x["k"], x["v"], causal=True),
        "conv_reference": lambda x: conv_attention_reference(x["q_cache"], x["k"], x["v"],
                                                             x["weight"])[:, :, -x["q"].shape[2]:],
        "read": lambda x: x["k"].sum() + x["v"].sum(),
    }


def last_rows_reference(q_cache, k, v, weight, n: int = 1) -> torch.Tensor:
    """Rows ``N - n .. N - 1`` (``[B, Hq, n, D]``) of the causal MTA forward, in ``q_cache``'s dtype, fp32 compute,
    from the last ``cq - 1 + n`` query rows (``O(cq N)`` memory): :func:`mta.conv_decode_rows.conv_decode_rows`."""
    return conv_decode_rows(q_cache, k, v, weight, None, n, q_cache.shape[-1] ** -0.5)


def check(impl: str, fn: Callable, x: dict) -> dict:
    """Relative error of ``fn(x)`` against its reference on fp32 copies of the inputs, one sequence at a time (to
    bound memory): SDPA for mta_decode, :func:`last_rows_reference` for mta_conv_decode."""
    result = {"rel_err": None, "tolerance": TOLERANCE, "ok": False, "error": None}
    try:
        out = fn(x).float()
        refs = []
        for b in range(x["k"].shape[0]):
            one = {key: (t[b:b + 1].float() if key != "weight" else t) for key, t in x.items()}
            refs.append(sdpa(one) if impl == "mta_decode" else
                        last_rows_reference(one["q_cache"], one["k"], one["v"], one["weight"], one["q"].shape[2]))
        result["rel_err"] = rel_err(out, torch.cat(refs))
        result["ok"] = result["rel_err"] <= TOLERANCE
    except Exception as exc:  # noqa: BLE001  (a failing kernel is a result)
        result["error"] = describe_error(exc)
    return result


class DecodeBenchmark(Benchmark):
    """Time and TB/s (bytes of K and V, for MTA also its cq - 1 + n query rows, over the time) of one decode step
    (one new query, bf16, every position of KV caches of 1k to 128k tokens valid) for mta.decode_attention,
    mta.conv_decode_attention (6x11), SDPA (unmasked: its causal mask is top-left aligned), mta.flash_attention, the
    materialized MTA reference where it fits, and a plain read of K and V, after checking both mta decoders against
    fp32 references, a sequence at a time."""

    name, out = "decode", "figures/bench_decode.json"
    help = "a decode step: mta.decode_attention and mta.conv_decode_attention vs SDPA, flash, a plain read"
    quick_help = "N in {4k, 64k}"
    Shape, checked, passes = DecodeShape, CHECKED, (Pass("fwd", "ms"),)
    shapes, default_impls = staticmethod(decode_shapes), staticmethod(default_impls)
    inputs, plot = staticmethod(random_inputs), staticmethod(plot_decode)

    def __init__(self, impls: Optional[dict] = None, free_bytes: Callable[[], int] = cuda_free_bytes):
        super().__init__(impls)
        self._free_bytes = free_bytes

    def check(self, name, fn, shape, x):
        return check(name, fn, x)

    def calls(self, fn, shape, x):
        return {"fwd": (lambda: fn(x), None)}

    def skip(self, impl, shape, x):
        """The reference where it does not fit in the memory left beside the inputs (:func:`conv.reference_fit`)."""
        reason = conv.reference_fit(shape, self._free_bytes())["reason"] if impl == "conv_reference" else None
        return {"fwd": reason} if reason else {}

    def finish(self, r):
        r["bytes"] = bytes_read(self.shape_of(r), r["impl"])
        r["us"] = r["ms"] * 1e3 if r["ms"] is not None else None
        r["tbps"] = tflops(r["bytes"], r["ms"])

    @staticmethod
    def format_check(c):
        return c.get("error") or f"rel err {c['rel_err']:.1e} (tol {c['tolerance']:.0e})"

    def summarize(self, results):
        return {"summary": median_ratios(results, KEYS[:-1], SUMMARY_RATIOS, SUMMARY_MIN_SEQ_LEN)}

    def config(self, quick, warmup, rep):
        return {"benchmark": "decode", "quick": quick, "dtype": DTYPE, "new_queries": NEW_QUERIES,
                "batches": list(BATCHES), "configs": [list(c) for c in CONFIGS],
                "seq_lens": list(QUICK_SEQ_LENS if quick else SEQ_LENS), "kernel": list(KERNEL),
                "weight_std": WEIGHT_STD, "impls": list(IMPLS), **timing_config(warmup, rep),
                "bytes": "K and V of every cache position; MTA also cq - 1 + n query rows per query head",
                "check": "mta_decode vs SDPA on fp32 copies, mta_conv_decode vs last_rows_reference in fp32, "
                         "per sequence; relative Frobenius error",
                "tolerance": TOLERANCE}

    def tables(self, data):
        config = [("B", "{}", "batch"), ("Hq", "{}", "heads"), ("Hkv", "{}", "kv_heads"), ("D", "{}", "head_dim")]
        rates = ("mta_decode", "mta_conv_decode", "read")
        columns = config + [("N", "{}", "seq_len")] + [(f"{n} us", "{:.1f}", measured(n, "us")) for n in IMPLS]
        columns += [(f"{n} TB/s", "{:.2f}", measured(n, "tbps")) for n in rates]
        return [("microseconds per decode step (! = an mta decoder failed its check)", columns,
                 shape_rows(data["results"], KEYS)),
                (f"medians over N >= {SUMMARY_MIN_SEQ_LEN}: TB/s as a fraction of the plain read's; SDPA time / mta "
                 "time (> 1: mta is faster)", config + [(k, "{:.2f}", k) for k in SUMMARY_RATIOS], data["summary"])]
