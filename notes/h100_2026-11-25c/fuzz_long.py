"""Random shapes with longer sequences than tests/test_random_shapes.py draws (N up to 2000: many tiles, every
pipeline stage, causal tiles skipped), through the same test functions (same references and tolerances), spread
over worker processes. ``python notes/h100_2026-11-25c/fuzz_long.py SEED CASES WORKERS``; prints one line a case."""
import os
import random
import sys
import traceback
from concurrent.futures import ProcessPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]


def draw(seed, cases):
    import torch
    rng = random.Random(seed)
    dtypes = [torch.float32, torch.float16, torch.bfloat16]
    dims = [16, 32, 48, 64, 80, 96, 128, 160, 256]
    out = []
    for i in range(cases):
        group, hkv = rng.choice([1, 2, 4, 8]), rng.choice([1, 2])
        hq, dtype, d = group * hkv, rng.choice(dtypes), rng.choice(dims)
        n = rng.randint(260, 2000)
        b = rng.randint(1, 2)
        if rng.random() < 0.5:
            out.append(("flash", (dtype, d, n, n if rng.random() < 0.6 else rng.randint(260, 2000), hq, hkv,
                                  rng.random() < 0.7, b, rng.random() < 0.5, rng.choice([None, 0.05]))))
        else:
            cq, ck = rng.choice([1, 2, 3, 6, 8, 11, 12]), rng.choice([1, 3, 5, 11, 15])
            out.append(("conv", (dtype, d, cq, ck, n, hq, hkv, rng.random() < 0.8, b, rng.random() < 0.5,
                                 rng.choice([None, 0.1]))))
    return out


def run(job):
    kind, args = job
    import test_random_shapes as t
    try:
        (t.test_flash if kind == "flash" else t.test_conv)(*args)
        return f"ok   {kind} {args}"
    except Exception as exc:  # noqa: BLE001
        return f"FAIL {kind} {args}: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}" + (
            "" if isinstance(exc, AssertionError) else "\n" + traceback.format_exc()[-1500:])


if __name__ == "__main__":
    seed, cases, workers = (int(a) for a in sys.argv[1:4])
    import multiprocessing as mp
    with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as pool:
        for line in pool.map(run, draw(seed, cases)):
            print(line, flush=True)
