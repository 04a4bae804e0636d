"""Decode at long ragged caches (up to 100k keys), random GQA, head dims, dtypes, new queries, split counts and
storage layouts, caches poisoned with NaN past each length: ``decode_attention`` against float64 attention per
sequence, ``conv_decode_attention`` against float64 MTA rows built here from the definition (only the rows the
convolution reaches: ``[cq - 1 + n, L]`` scores per sequence, so long caches fit).
``python notes/h100_2026-11-25c/fuzz_decode_long.py SEED CASES``; one line a case."""
import os
import random
import sys

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]
import mta  # noqa: E402
from test_random_shapes import OUT_TOL, layout, off, poison  # noqa: E402

DEV = "cuda"


def mta_rows64(q, k, v, w, n):
    """Rows ``L - n .. L - 1`` of causal MTA for one sequence: q ``[1, Hq, L, D]``, k, v ``[1, Hkv, L, D]``."""
    _, hq, L, d = q.shape
    cq, ck = w.shape[1:]
    pk = (ck - 1) // 2
    g = hq // k.shape[1]
    q, k, v, w = q.double(), k.double().repeat_interleave(g, 1), v.double().repeat_interleave(g, 1), w.double()
    rows = torch.arange(L - n - (cq - 1), L, device=q.device)  # the convolution's reach; before 0: zero rows
    qr = torch.where((rows >= 0)[None, None, :, None], q[:, :, rows.clamp(min=0)], 0.0)
    s = d ** -0.5 * qr @ k.transpose(-1, -2)  # [1, Hq, cq - 1 + n, L]
    keys = torch.arange(L, device=q.device)
    s = s.masked_fill(keys[None, :] > rows[:, None], 0.0)  # no future key before the convolution
    c = F.conv2d(F.pad(s, (pk, pk)), w[:, None], groups=hq)  # [1, Hq, n, L]
    c = c.masked_fill(keys[None, :] > rows[cq - 1:, None], float("-inf"))
    return torch.softmax(c, -1) @ v


def case(rng):
    group, hkv = rng.choice([1, 2, 4, 8]), rng.choice([1, 2, 3])
    dtype = rng.choice([torch.float32, torch.float16, torch.bfloat16])
    d = rng.choice([16, 40, 64, 96, 128, 200, 256])
    nq = rng.choice([1, 1, 1, 2, 4, 16])
    n_max = rng.randint(5000, 100_000)
    b = rng.randint(1, 4)
    lengths = [rng.choice([rng.randint(nq, n_max), n_max, nq, rng.randint(nq, 300)]) for _ in range(b)]
    conv = rng.random() < 0.5
    kernel = (rng.choice([1, 2, 6, 11, 16]), rng.choice([1, 3, 11, 15])) if conv else None
    return dict(dtype=dtype, d=d, nq=nq, n_max=n_max, lengths=lengths, hq=group * hkv, hkv=hkv, conv=conv,
                kernel=kernel, splits=rng.choice([None, None, None, 1, 3, 64, 200]), transposed=rng.random() < 0.5,
                device_lengths=rng.random() < 0.5)


def run(c):
    torch.manual_seed(c["n_max"])
    B, dt = len(c["lengths"]), c["dtype"]
    k, v = (layout(poison(torch.randn(B, c["hkv"], c["n_max"], c["d"], device=DEV, dtype=dt), c["lengths"]),
                   c["transposed"]) for _ in range(2))
    lens = torch.tensor(c["lengths"], dtype=torch.int32, device=DEV if c["device_lengths"] else "cpu")
    if c["conv"]:
        q = layout(poison(torch.randn(B, c["hq"], c["n_max"], c["d"], device=DEV, dtype=dt), c["lengths"]),
                   c["transposed"])
        w = 0.2 * torch.randn(c["hq"], *c["kernel"], device=DEV)
        o = mta.conv_decode_attention(q, k, v, w, cache_seqlens=lens, num_queries=c["nq"], num_splits=c["splits"])
        ref = torch.cat([mta_rows64(q[i:i + 1, :, :n], k[i:i + 1, :, :n], v[i:i + 1, :, :n], w, c["nq"])
                         for i, n in enumerate(c["lengths"])])
        tol = 2 * OUT_TOL[dt]
    else:
        q = layout(torch.randn(B, c["hq"], c["nq"], c["d"], device=DEV, dtype=dt), c["transposed"])
        o = mta.decode_attention(q, k, v, cache_seqlens=lens, num_splits=c["splits"])
        ref = torch.cat([mta.naive_attention(q[i:i + 1].double(), k[i:i + 1, :, :n].double(),
                                             v[i:i + 1, :, :n].double(), causal=True)
                         for i, n in enumerate(c["lengths"])])
        tol = OUT_TOL[dt]
    e = off(o, ref, tol)
    return e <= 1, e


if __name__ == "__main__":
    seed, cases = int(sys.argv[1]), int(sys.argv[2])
    rng = random.Random(seed)
    fails = 0
    for _ in range(cases):
        c = case(rng)
        try:
            ok, e = run(c)
        except Exception as exc:  # noqa: BLE001
            ok, e = False, f"{type(exc).__name__}: {str(exc)[:300]}"
        fails += not ok
        print("ok  " if ok else "FAIL", e if isinstance(e, str) else f"{e:.3f}", c, flush=True)
        torch.cuda.empty_cache()
    print(f"{cases - fails} ok, {fails} failed")
