"""Ahead-of-time compile of the mta Triton kernels for sm_90, on a machine with no GPU.

Usage (any Triton >= 3.5 venv with torch; the kernels' specialization is computed
by Triton's own binder, exactly as a launch would compute it):

    /tmp/t36/bin/python tools/compile_sm90.py [conv|conv-variants|flash|all] [--ptxas PATH] [--out DIR]

The arguments are the ones the package's own launchers pass (``mta.flash.flash_forward``,
``mta.conv.launch_conv_forward``): each launcher is called with a stand-in kernel that records its
launch instead of running it, as an sm_90 GPU would see it.

* conv: conv_forward_kernel, bf16, 6x11 and 11x11, D in (64, 128), causal and not, every autotuning
  candidate (tuning.CANDIDATES); resources (regs, spills, smem) and wgmma use.
* conv-variants: every dtype, awkward head dims and kernel sizes, at the table's tile: does it compile and fit?
* flash: flash_forward_kernel at every candidate, same report.
* conv-backward: every kernel the MTA backward launches (``mta.conv.conv_attention_backward``, its pre-passes
  included), at the table's tile as the launcher shrinks it, for a spread of dtypes, head dims and kernels.

--ptxas PATH sets TRITON_PTXAS_PATH (e.g. /usr/local/bin/ptxas for CUDA 13.0);
by default Triton's bundled ptxas is used.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

ap = argparse.ArgumentParser()
ap.add_argument("what", nargs="?", default="all", choices=["conv", "conv-variants", "flash", "conv-backward", "all"])
ap.add_argument("--ptxas", default=None, help="ptxas binary (sets TRITON_PTXAS_PATH)")
ap.add_argument("--out", default=None, help="where to keep PTX/cubin/SASS of interesting cases")
ap.add_argument("--keep-cache", action="store_true", help="use the default Triton cache dir")
cli = ap.parse_args()

# Must be set before mta is imported (mta.runtime sets TRITON_INTERPRET=1 when there is no GPU).
os.environ["TRITON_INTERPRET"] = "0"
if cli.ptxas:
    os.environ["TRITON_PTXAS_PATH"] = cli.ptxas
if not cli.keep_cache:
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="triton_cache_")
sys.path.insert(0, ROOT)

import torch  # noqa: E402
import triton  # noqa: E402
from triton import knobs  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource, make_backend  # noqa: E402
from triton.runtime.jit import create_function_from_signature  # noqa: E402

import mta  # noqa: E402,F401
from mta import tuning  # noqa: E402
from mta.conv import launch_conv_forward  # noqa: E402
from mta.conv_forward import conv_forward_kernel  # noqa: E402
from mta.flash import flash_forward  # noqa: E402
from mta.flash_forward import flash_forward_kernel  # noqa: E402

torch.cuda.get_device_capability = lambda *args: (9, 0)  # the launchers ask: answer as an H100/H200 would
torch.cuda.current_device = lambda: 0
assert not mta.runtime.INTERPRET, "TRITON_INTERPRET must be 0"

TARGET = GPUTarget("cuda", 90, 32)  # what the driver reports on H100/H200 (warp size 32)
NVBIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
CUOBJDUMP = shutil.which("cuobjdump") or os.path.join(NVBIN, "cuobjdump")
OUT = cli.out or os.path.join(tempfile.gettempdir(), f"sm90_out_triton{triton.__version__}")
os.makedirs(OUT, exist_ok=True)


def ptxas_path() -> str:
    return knobs.nvidia.ptxas.path


def ptxas_version() -> str:
    v = subprocess.run([ptxas_path(), "--version"], capture_output=True, text=True).stdout
    return v.strip().splitlines()[-1]


def jit_of(kernel):
    """The JITFunction under @triton.autotune / @triton.heuristics (or the kernel itself)."""
    while not isinstance(kernel, triton.runtime.jit.JITFunction):
        kernel = kernel.fn
    return kernel


def with_heuristics(kernel, args, kwargs):
    """``kwargs`` plus the values of every @triton.heuristics layer over the JITFunction."""
    kwargs = dict(kwargs)
    while not isinstance(kernel, triton.runtime.jit.JITFunction):
        if isinstance(kernel, triton.runtime.autotuner.Heuristics):
            named = {**dict(zip(kernel.arg_names, args)), **kwargs}
            for name, rule in kernel.values.items():
                kwargs[name] = rule(named)
        kernel = kernel.fn
    return kwargs


def specialize(jitfn, args, kwargs):
    """Triton's own binder: (signature, constexprs, attrs, options) exactly as a launch computes them."""
    backend = make_backend(TARGET)
    binder = create_function_from_signature(jitfn.signature, jitfn.params, backend)
    kwargs = dict(kwargs)
    kwargs["debug"] = kwargs.get("debug", jitfn.debug) or knobs.runtime.debug
    kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    bound_args, spec, opts = binder(*args, **kwargs)
    options, signature, constexprs, attrs = jitfn._pack_args(backend, kwargs, bound_args, spec, opts)
    return signature, constexprs, attrs, options


def compile_kernel(jitfn, args, kwargs):
    signature, constexprs, attrs, options = specialize(jitfn, args, kwargs)
    src = ASTSource(jitfn, signature, constexprs, attrs)
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):  # Triton prints the whole PTX on a ptxas failure
            ck = triton.compile(src, target=TARGET, options=options.__dict__)
        return ck, None, signature, constexprs
    except Exception as e:  # noqa: BLE001
        return None, e, signature, constexprs


def int_consts(jitfn, constexprs):
    """Names of non-constexpr parameters that Triton turned into constants (e.g. ints equal to 1)."""
    names = [p.name for p in jitfn.params]
    out = {}
    for path, val in constexprs.items():
        p = jitfn.params[path[0]]
        if not p.is_constexpr:
            out[names[path[0]]] = val
    return out


def resources(ck, tag):
    """regs / spills (ptxas -v on the PTX, same ptxas as Triton), smem (Triton metadata), wgmma/HGMMA."""
    ptx = ck.asm["ptx"]
    cubin = ck.asm["cubin"]
    base = os.path.join(OUT, tag)
    with open(base + ".ptx", "w") as f:
        f.write(ptx)
    with open(base + ".cubin", "wb") as f:
        f.write(cubin)
    arch = "sm_90a"
    m = re.search(r"^\.target\s+(\S+)", ptx, re.M)
    if m:
        arch = m.group(1)
    r = subprocess.run([ptxas_path(), "-v", f"--gpu-name={arch}", base + ".ptx", "-o", base + ".ptxas.cubin"],
                       capture_output=True, text=True)
    log = r.stderr
    regs = re.search(r"Used (\d+) registers", log)
    st = re.search(r"(\d+) bytes spill stores", log)
    ld = re.search(r"(\d+) bytes spill loads", log)
    stack = re.search(r"(\d+) bytes stack frame", log)
    sass = subprocess.run([CUOBJDUMP, "-sass", base + ".cubin"], capture_output=True, text=True).stdout
    with open(base + ".sass", "w") as f:
        f.write(sass)
    res = subprocess.run([CUOBJDUMP, "--dump-resource-usage", base + ".cubin"], capture_output=True, text=True).stdout
    md = ck.metadata
    return dict(
        regs=int(regs.group(1)) if regs else None,
        spill_st=int(st.group(1)) if st else None,
        spill_ld=int(ld.group(1)) if ld else None,
        stack=int(stack.group(1)) if stack else None,
        smem=getattr(md, "shared", None),
        wgmma_ptx=len(re.findall(r"wgmma\.mma_async", ptx)),
        hgmma=len(re.findall(r"\bHGMMA\.", sass)),
        hmma=len(re.findall(r"\bHMMA\.", sass)),
        resource_line=" ".join(res.split("Resource usage:")[-1].split()) if "Resource usage" in res else "",
        arch=arch,
    )


def short_err(e):
    s = str(e)
    lines = [ln for ln in s.splitlines() if ln.strip()]
    return "\n      ".join(lines[:6])


# ----------------------------------------------------------------------------------------------------
# Launches recorded from the package's launchers

N_RES, B_RES, H_RES = 4096, 2, 8


class RecordedLaunch:
    """Stands in for a kernel in a launcher: records the arguments of its launch, runs nothing."""

    def __init__(self, kernel):
        self.kernel, self.arg_names, self.launches = kernel, kernel.arg_names, []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launches.append((args, kwargs))


def recorded(launcher, kernel, *args, **kwargs):
    """``(args, kwargs)`` of the launch that ``launcher(*args, kernel=..., **kwargs)`` makes, heuristics applied."""
    stand_in = RecordedLaunch(kernel)
    launcher(*args, kernel=stand_in, **kwargs)
    (args, kwargs), = stand_in.launches
    return args, with_heuristics(kernel, args, kwargs)


def conv_launch(D, causal, cfg, cq=6, ck=11, dtype=torch.bfloat16):
    """What :func:`mta.conv.launch_conv_forward` passes on an H100/H200 (TMA descriptors, boxes fitted)."""
    B, Hq, N = B_RES, H_RES, N_RES
    q, v = torch.empty(B, Hq, N, D, dtype=dtype), torch.empty(B, Hq, N, D, dtype=dtype)
    kf, cd = torch.empty(B, Hq, cq, N, D, dtype=dtype), torch.empty(B, Hq, N, 16, dtype=torch.float32)
    return recorded(launch_conv_forward, conv_forward_kernel, q, v, kf, cd, (cq, ck), causal, D ** -0.5,
                    **tuning.as_config(cfg))


def flash_launch(D, causal, cfg, dtype=torch.bfloat16):
    """What :func:`mta.flash.flash_forward` passes."""
    q, k, v = (torch.empty(B_RES, H_RES, N_RES, D, dtype=dtype) for _ in range(3))
    return recorded(flash_forward, flash_forward_kernel, q, k, v, causal, D ** -0.5, **tuning.as_config(cfg))


HDR = (f"{'kernel':6} {'D':>3} {'causal':6} {'BM':>4} {'BN':>4} {'w':>2} {'st':>2} | {'status':6} {'regs':>4} "
       f"{'spillST':>7} {'spillLD':>7} {'stack':>5} {'smem':>6} {'wgmma(ptx)':>10} {'HGMMA':>5} {'HMMA':>5}")


def report(name, D, causal, cfg, kernel, args, kw):
    bm, bn, w, st = cfg
    ck, err, _, _ = compile_kernel(jit_of(kernel), args, kw)
    head = f"{name:6} {D:>3} {causal!s:6} {bm:>4} {bn:>4} {w:>2} {st:>2} | "
    if "RESIDENT" in kw:
        head = head[:-2] + f"{'R' if kw['RESIDENT'] else ('T' if kw['TMA'] else 'S')} | "
    if err is not None:
        line = head + f"FAIL   {type(err).__name__}: {short_err(err)}"
        print(line, flush=True)
        return line
    tag = f"{name}_D{D}_c{int(causal)}_{bm}x{bn}_w{w}_s{st}".replace(":", "_")
    r = resources(ck, tag)
    line = head + (f"{'OK':6} {r['regs']!s:>4} {r['spill_st']!s:>7} {r['spill_ld']!s:>7} {r['stack']!s:>5} "
                   f"{r['smem']!s:>6} {r['wgmma_ptx']:>10} {r['hgmma']:>5} {r['hmma']:>5}")
    print(line, flush=True)
    return line


def run_conv():
    print(f"\n=== 2. conv_forward_kernel bf16 PRECISION=tf32; R: resident queries, S: streamed, T: streamed by TMA "
          f"(B={B_RES} H={H_RES} N={N_RES}) ===")
    print(HDR)
    rows = []
    for cq, ck in ((6, 11), (11, 11)):
        for D in (64, 128):
            for causal in (True, False):
                for cfg in tuning.CANDIDATES["conv_forward"]:
                    args, kw = conv_launch(D, causal, cfg, cq, ck)
                    rows.append(report(f"{cq}x{ck}", D, causal, cfg, conv_forward_kernel, args, kw))
    return rows


def run_conv_variants():
    """Every dtype, awkward head dims and kernel sizes, with the default (untuned) candidate: does it compile and fit?"""
    print("\n=== conv_forward_kernel variants, at the table's Hopper tile ===")
    print(HDR)
    rows = []
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        for D in (16, 96, 256):
            for cq, ck in ((1, 1), (2, 9), (6, 11), (11, 15)):
                for causal in (True, False):
                    cfg = tuple(tuning.config_for("conv_forward", mta.launch.head_dim_block(D), dtype, causal,
                                                  family="hopper").values())
                    args, kw = conv_launch(D, causal, cfg, cq, ck, dtype)
                    name = f"{ {torch.float16: 'f16', torch.bfloat16: 'bf16', torch.float32: 'f32'}[dtype]}:{cq}x{ck}"
                    rows.append(report(name, D, causal, cfg, conv_forward_kernel, args, kw))
    return rows


def conv_backward_launches(D, causal, cq, ck, dtype, B=2, Hq=8, Hkv=4, N=N_RES):
    """Every launch of :func:`mta.conv.conv_attention_backward` (name, kernel, args, kwargs), heuristics applied:
    its kernels are swapped for stand-ins that record instead of running."""
    import mta.conv as conv
    names = ["fold_keys_kernel", "past_scores_kernel", "diagonal_scores_kernel", "rowsum_do_o_kernel",
             "conv_dq_kernel", "conv_dkdv_kernel", "conv_near_kernel", "conv_dq_fold_kernel", "conv_dk_fold_kernel"]
    saved = {n: getattr(conv, n) for n in names}
    saved_check = conv.check_kernel_device
    stand_ins = {n: RecordedLaunch(k) for n, k in saved.items()}
    saved_force = conv.conv_two_phase.FORCE
    try:
        conv.conv_two_phase.FORCE = False  # the one-pass kernels (the two-phase ones are not recorded here)
        for n, k in stand_ins.items():
            setattr(conv, n, k)
        conv.check_kernel_device = lambda **tensors: None  # CPU tensors stand in for the GPU's
        q, do, o = (torch.empty(B, Hq, N, D, dtype=dtype) for _ in range(3))
        k, v = (torch.empty(B, Hkv, N, D, dtype=dtype) for _ in range(2))
        lse, w = torch.empty(B, Hq, N), torch.empty(Hq, cq, ck)
        conv.conv_attention_backward(do, q, k, v, o, lse, w, causal, D ** -0.5)
    finally:
        for n, k in saved.items():
            setattr(conv, n, k)
        conv.check_kernel_device = saved_check
        conv.conv_two_phase.FORCE = saved_force
    out = []
    for n, stand_in in stand_ins.items():
        for args, kwargs in stand_in.launches:
            out.append((n, saved[n], args, with_heuristics(saved[n], args, kwargs)))
    return out


def run_conv_backward():
    """The backward's kernels at the table's Hopper tile (shrunk by the launcher as it would be)."""
    print("\n=== MTA backward kernels (mta.conv.conv_attention_backward), Hopper tiles ===")
    print(HDR)
    rows = []
    cases = [(torch.bfloat16, D, cq, ck, causal) for D in (64, 128) for cq, ck in ((6, 11), (11, 15))
             for causal in (True, False)]
    cases += [(torch.float16, 96, 2, 9, True), (torch.float16, 16, 16, 15, True), (torch.bfloat16, 256, 6, 11, True),
              (torch.float32, 64, 6, 11, True), (torch.float32, 128, 3, 3, False), (torch.bfloat16, 64, 1, 1, True)]
    for dtype, D, cq, ck, causal in cases:
        for name, kernel, args, kw in conv_backward_launches(D, causal, cq, ck, dtype):
            if name in ("fold_keys_kernel", "past_scores_kernel", "diagonal_scores_kernel", "rowsum_do_o_kernel"):
                continue  # the forward's pre-passes and flash's rowsum: compiled by the other modes
            cfg = (kw.get("BLOCK_M", kw.get("BLOCK_R", 0)), kw.get("BLOCK_N", 0), kw.get("num_warps", 4),
                   kw.get("num_stages", 0))
            dt = {torch.float16: "f16", torch.bfloat16: "bf16", torch.float32: "f32"}[dtype]
            label = f"{dt}:{cq}x{ck}:{name.replace('conv_', '').replace('_kernel', '')}"
            rows.append(report(label, D, causal, cfg, kernel, args, kw))
    return rows


def run_flash():
    print(f"\n=== flash_forward_kernel bf16 tuned configs (B={B_RES} H={H_RES} N={N_RES}) ===")
    print(HDR)
    rows = []
    for D in (64, 128):
        for causal in (True, False):
            for cfg in tuning.CANDIDATES["flash_forward"]:
                args, kw = flash_launch(D, causal, cfg)
                rows.append(report("flash", D, causal, cfg, flash_forward_kernel, args, kw))
    return rows


if __name__ == "__main__":
    print(f"triton {triton.__version__}, torch {torch.__version__}, target {TARGET}")
    print(f"ptxas: {ptxas_path()} ({ptxas_version()})")
    print(f"outputs: {OUT}")
    if cli.what in ("conv", "all"):
        run_conv()
    if cli.what in ("conv-variants", "all"):
        run_conv_variants()
    if cli.what in ("flash", "all"):
        run_flash()
    if cli.what in ("conv-backward", "all"):
        run_conv_backward()
