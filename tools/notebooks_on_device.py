"""Run the notebooks' code cells on this machine without Jupyter, and diff their text outputs with the stored ones.

    PYTHONPATH=. python tools/notebooks_on_device.py notebooks/0*.ipynb

For a GPU machine without nbval or Jupyter (the device image): the cells of a
notebook run in order in one namespace (matplotlib on Agg, ``plt.show`` a
no-op), stdout is captured per cell and compared, after the same sanitizing
as ``tests/nbval_sanitize.cfg``, with the notebook's stored stream output, as
nbval does. Cells marked ``# NBVAL_IGNORE_OUTPUT`` run but are not compared.
Exit status: the number of notebooks with an error or a differing cell.
"""
from __future__ import annotations

import configparser
import contextlib
import io
import json
import linecache
import os
import re
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def sanitizers():
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(ROOT, "tests", "nbval_sanitize.cfg"))
    return [(re.compile(cfg[s]["regex"]), cfg[s]["replace"]) for s in cfg.sections()]


def sanitize(text, rules):
    for rx, rep in rules:
        text = rx.sub(rep, text)
    return text


def stored_stdout(cell):
    return "".join("".join(o["text"]) for o in cell.get("outputs", [])
                   if o.get("output_type") == "stream" and o.get("name") == "stdout")


def run_notebook(path, rules):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    plt.show = lambda *a, **k: plt.close("all")
    nb = json.load(open(path))
    ns = {"__name__": "__main__"}
    cwd = os.getcwd()
    os.chdir(os.path.dirname(os.path.abspath(path)))
    bad = 0
    slowest = (0.0, None)
    try:
        for n, cell in enumerate(c for c in nb["cells"] if c["cell_type"] == "code"):
            src = "".join(cell["source"])
            # IPython magics (%matplotlib inline) are no Python; a cell's source goes into linecache, as IPython
            # does, so inspect (which @triton.jit uses) finds the source of functions defined in the notebook.
            src = "".join(ln for ln in src.splitlines(True) if not ln.lstrip().startswith("%"))
            name = f"<{os.path.basename(path)}[{n}]>"
            linecache.cache[name] = (len(src), None, src.splitlines(True), name)
            out = io.StringIO()
            t0 = time.time()
            try:
                with contextlib.redirect_stdout(out):
                    exec(compile(src, name, "exec"), ns)
            except Exception:  # noqa: BLE001
                print(f"  cell {n}: ERROR\n" + traceback.format_exc(limit=3))
                return bad + 1
            slowest = max(slowest, (time.time() - t0, n))
            if time.time() - t0 > 20:
                print(f"  cell {n}: {time.time() - t0:.0f}s", flush=True)
            if src.lstrip().startswith("# NBVAL_IGNORE_OUTPUT"):
                continue
            got, want = sanitize(out.getvalue(), rules), sanitize(stored_stdout(cell), rules)
            if got != want:
                bad += 1
                print(f"  cell {n}: output differs ({time.time() - t0:.1f}s)")
                for g, w in zip(got.splitlines(), want.splitlines()):
                    if g != w:
                        print(f"    stored: {w}\n    here:   {g}")
                if len(got.splitlines()) != len(want.splitlines()):
                    print(f"    {len(want.splitlines())} stored lines, {len(got.splitlines())} here")
    finally:
        os.chdir(cwd)
        print(f"  slowest cell: {slowest[1]} ({slowest[0]:.1f}s)")
    return bad


def main(paths):
    rules = sanitizers()
    failed = 0
    for path in paths:
        t0 = time.time()
        print(f"{path}:", flush=True)
        bad = run_notebook(path, rules)
        print(f"  {'ok' if bad == 0 else f'{bad} cell(s) differ or fail'} ({time.time() - t0:.0f}s)", flush=True)
        failed += bad > 0
    return failed


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
