"""Ahead-of-time compile of the mta Triton kernels for sm_90, on a machine with no GPU.

Usage (any Triton >= 3.5 venv with torch; the kernels' specialization is computed
by Triton's own binder, exactly as a launch would compute it):

    /tmp/t36/bin/python tools/compile_sm90.py [repro|conv|flash|all] [--ptxas PATH] [--out DIR]

* repro: the N = 1 causal case (B=1, Hq=Hkv=1, Nq=Nk=1, D=16, fp16/bf16, BLOCK_M=64,
  BLOCK_N=32, 4 warps, 2 stages) for flash_forward_kernel, flash_dkdv_kernel,
  flash_dq_kernel and rowsum_do_o_kernel, under several specializations:
  "old" (everything specializable specialized, i.e. n_q = n_k = 1 become constants),
  "current" (the kernel as decorated now: do_not_specialize = tuning.NO_SPECIALIZE),
  and ablations (only num_heads/group_size unspecialized, everything int unspecialized).
* conv: conv_forward_kernel, bf16, CQ=6, CK=11, D in (64, 128), causal in (True, False),
  every config of tuning.CONV_FORWARD; resources (regs, spills, smem) and wgmma use.
* flash: flash_forward_kernel with tuning.FORWARD[64] / [128] configs, same report.

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
ap.add_argument("what", nargs="?", default="all", choices=["repro", "conv", "conv-variants", "flash", "all"])
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
from mta.conv import diagonal_reach  # noqa: E402
from mta import conv as conv_module  # noqa: E402
from mta.conv_forward import conv_forward_kernel, fit_stream_descriptors  # noqa: E402
from mta.flash import dot_precision, head_dim_block, size_bucket  # noqa: E402
from mta.flash_backward import flash_dkdv_kernel, flash_dq_kernel, rowsum_do_o_kernel  # noqa: E402
from mta.flash_forward import flash_forward_kernel  # noqa: E402

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


def rejit(jitfn, do_not_specialize):
    """A fresh JITFunction of the same Python function with another do_not_specialize list."""
    return triton.jit(jitfn.fn, do_not_specialize=do_not_specialize)


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
# 1. N = 1 causal repro


def repro_args(dtype, causal):
    B, Hq, Hkv, N, D = 1, 1, 1, 1, 16
    q = torch.empty(B, Hq, N, D, dtype=dtype)
    k = torch.empty(B, Hkv, N, D, dtype=dtype)
    v = torch.empty_like(k)
    o = torch.empty_like(q)
    do = torch.empty_like(q)
    lse = torch.empty(B, Hq, N, dtype=torch.float32)
    delta = torch.empty_like(lse)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    scale = D ** -0.5
    bucket = size_bucket(N)
    cfg = dict(BLOCK_M=64, BLOCK_N=32, num_warps=4, num_stages=2)  # MTA_AUTOTUNE=0 config
    common = dict(CAUSAL=causal, D=D, BLOCK_D=head_dim_block(D), PRECISION=dot_precision(dtype), **cfg)
    return {
        "flash_forward_kernel": (flash_forward_kernel,
                                 (q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
                                  N, N, Hq, Hq // Hkv, scale, bucket), common),
        "flash_dkdv_kernel": (flash_dkdv_kernel,
                              (q, k, v, do, lse, delta, dk, dv, *q.stride(), *k.stride(), *v.stride(),
                               *do.stride(), *dk.stride(), *dv.stride(), N, N, Hkv, Hq // Hkv, scale, bucket),
                              common),
        "flash_dq_kernel": (flash_dq_kernel,
                            (q, k, v, do, lse, delta, dq, *q.stride(), *k.stride(), *v.stride(), *do.stride(),
                             *dq.stride(), N, N, Hq, Hq // Hkv, scale, bucket), common),
        "rowsum_do_o_kernel": (rowsum_do_o_kernel,
                               (o, do, delta, *o.stride(), *do.stride(), N, Hq),
                               dict(D=D, BLOCK_D=head_dim_block(D), BLOCK_M=64)),
    }


SPECS = {
    # name: do_not_specialize list (None = the kernel as decorated in mta now)
    "old(all specialized)": [],
    "current(NO_SPECIALIZE)": None,
    "heads-only(num_heads,group_size unspecialized)": ["num_heads", "group_size"],
    "n+heads(n_q,n_k,num_heads,group_size unspecialized)": ["n_q", "n_k", "num_heads", "group_size"],
    "only n_q const (n_k unspecialized)": ["n_k"],
    "only n_k const (n_q unspecialized)": ["n_q"],
}


def run_repro():
    print("\n=== 1. N=1 repro: B=1 Hq=Hkv=1 Nq=Nk=1 D=16, BLOCK_M=64 BLOCK_N=32 warps=4 stages=2 ===")
    rows = []
    for causal in (True, False):
        for dtype in (torch.float16, torch.bfloat16):
            for kname, (kernel, args, kwargs) in repro_args(dtype, causal).items():
                base = jit_of(kernel)
                for sname, dns in SPECS.items():
                    if kname == "rowsum_do_o_kernel" and sname != "old(all specialized)":
                        if sname == "current(NO_SPECIALIZE)":
                            pass  # same as old: rowsum has no do_not_specialize
                        else:
                            continue
                    if dns is None:
                        fn = base
                    else:
                        valid = [n for n in dns if n in base.arg_names]
                        fn = rejit(base, valid)
                    ck, err, sig, consts = compile_kernel(fn, args, kwargs)
                    ints = int_consts(fn, consts)
                    status = "OK" if err is None else f"FAIL {type(err).__name__}: {short_err(err)}"
                    line = (f"causal={causal!s:5} {str(dtype)[6:]:8} {kname:21} {sname:52} "
                            f"int-consts={sorted(ints)} -> {status}")
                    print(line, flush=True)
                    rows.append(line)
                    if err is not None:
                        m = re.search(r"Repro command: (.*)", str(err))
                        if m:
                            ptx = [t for t in m.group(1).split() if t.endswith(".ptx")]
                            if ptx and os.path.exists(ptx[0]):
                                dst = os.path.join(OUT, f"crash_{kname}_{str(dtype)[6:]}_causal{causal}.ptx")
                                shutil.copy(ptx[0], dst)
                                print(f"      failing PTX kept at {dst}")
    return rows


# ----------------------------------------------------------------------------------------------------
# 2. conv forward and flash forward resources

N_RES, B_RES, H_RES = 4096, 2, 8


def conv_args(D, causal, cq=6, ck=11, dtype=torch.bfloat16, precision="tf32"):
    """Arguments of a launch on an H100/H200: TMA descriptors where mta.conv.stream_descriptors makes them
    there (16-bit inputs, 16-byte rows); ``report`` fits their boxes to each tile."""
    B, Hq, Hkv, N = B_RES, H_RES, H_RES, N_RES
    e, _ = diagonal_reach(cq, ck)
    e_pad = max(16, triton.next_power_of_2(e))
    q = torch.empty(B, Hq, N, D, dtype=dtype)
    v = torch.empty(B, Hkv, N, D, dtype=dtype)
    kf = torch.empty(B, Hq, cq, N, D, dtype=dtype)
    cd = torch.empty(B, Hq, N, e_pad, dtype=torch.float32)
    o = torch.empty_like(q)
    lse = torch.empty(B, Hq, N, dtype=torch.float32)
    descriptors = (None, None, None)
    if dtype != torch.float32 and all(conv_module._tma_ready(t) for t in (q, v, kf)):
        descriptors = tuple(conv_module.TensorDescriptor(t, list(t.shape), list(t.stride()), [1] * t.dim())
                            for t in (q, kf, v))
    args = (q, kf, v, cd, o, lse, *descriptors, *q.stride(), *v.stride(), *kf.stride(), *o.stride(),
            N, N, Hq, Hq // Hkv, D ** -0.5, size_bucket(N))
    kwargs = dict(CAUSAL=causal, CQ=cq, CK=ck, E=e, E_PAD=e_pad, D=D, BLOCK_D=head_dim_block(D), PRECISION=precision)
    return args, kwargs


def flash_args(D, causal, dtype=torch.bfloat16):
    B, Hq, Hkv, N = B_RES, H_RES, H_RES, N_RES
    q = torch.empty(B, Hq, N, D, dtype=dtype)
    k = torch.empty(B, Hkv, N, D, dtype=dtype)
    v = torch.empty_like(k)
    o = torch.empty_like(q)
    lse = torch.empty(B, Hq, N, dtype=torch.float32)
    args = (q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
            N, N, Hq, Hq // Hkv, D ** -0.5, size_bucket(N))
    kwargs = dict(CAUSAL=causal, D=D, BLOCK_D=head_dim_block(D), PRECISION=dot_precision(dtype))
    return args, kwargs


HDR = (f"{'kernel':6} {'D':>3} {'causal':6} {'BM':>4} {'BN':>4} {'w':>2} {'st':>2} | {'status':6} {'regs':>4} "
       f"{'spillST':>7} {'spillLD':>7} {'stack':>5} {'smem':>6} {'wgmma(ptx)':>10} {'HGMMA':>5} {'HMMA':>5}")


def report(name, D, causal, cfg, kernel, args, kwargs):
    bm, bn, w, st = cfg
    kw = with_heuristics(kernel, args, dict(kwargs, BLOCK_M=bm, BLOCK_N=bn, num_warps=w, num_stages=st))
    if kernel is conv_forward_kernel:
        named = dict(zip(jit_of(kernel).arg_names, args))
        fit_stream_descriptors({**named, **kw})
    ck, err, _, _ = compile_kernel(jit_of(kernel), args, kw)
    head = f"{name:6} {D:>3} {causal!s:6} {bm:>4} {bn:>4} {w:>2} {st:>2} | "
    if "RESIDENT" in kw:
        head = head[:-2] + f"{'R' if kw['RESIDENT'] else ('T' if kw['TMA'] else 'S')} | "
    if err is not None:
        line = head + f"FAIL   {type(err).__name__}: {short_err(err)}"
        print(line, flush=True)
        return line
    tag = f"{name}_D{D}_c{int(causal)}_{bm}x{bn}_w{w}_s{st}"
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
                for cfg in tuning.CONV_FORWARD:
                    args, kwargs = conv_args(D, causal, cq, ck)
                    rows.append(report(f"{cq}x{ck}", D, causal, cfg, conv_forward_kernel, args, kwargs))
    return rows


def run_conv_variants():
    """Every dtype, awkward head dims and kernel sizes, with the default (untuned) candidate: does it compile and fit?"""
    print("\n=== conv_forward_kernel variants, first candidate of tuning.CONV_FORWARD ===")
    print(HDR)
    rows = []
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        precision = dot_precision(dtype)
        for D in (16, 96, 256):
            for cq, ck in ((1, 1), (2, 9), (6, 11), (11, 15)):
                for causal in (True, False):
                    args, kwargs = conv_args(D, causal, cq, ck, dtype, precision)
                    name = f"{ {torch.float16: 'f16', torch.bfloat16: 'bf16', torch.float32: 'f32'}[dtype]}:{cq}x{ck}"
                    rows.append(report(name, D, causal, tuning.CONV_FORWARD[0], conv_forward_kernel, args, kwargs))
    return rows


def run_flash():
    print(f"\n=== flash_forward_kernel bf16 tuned configs (B={B_RES} H={H_RES} N={N_RES}) ===")
    print(HDR)
    rows = []
    for D in (64, 128):
        for causal in (True, False):
            for cfg in tuning.FORWARD[D]:
                args, kwargs = flash_args(D, causal)
                rows.append(report("flash", D, causal, cfg, flash_forward_kernel, args, kwargs))
    return rows


if __name__ == "__main__":
    print(f"triton {triton.__version__}, torch {torch.__version__}, target {TARGET}")
    print(f"ptxas: {ptxas_path()} ({ptxas_version()})")
    print(f"outputs: {OUT}")
    if cli.what in ("repro", "all"):
        run_repro()
    if cli.what in ("conv", "all"):
        run_conv()
    if cli.what in ("conv-variants", "all"):
        run_conv_variants()
    if cli.what in ("flash", "all"):
        run_flash()
