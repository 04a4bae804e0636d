"""Per-program timeline of decode_attention's split kernel: %globaltimer at entry and after the key loop, and the
SM each program ran on (a source patch of mta/decode_kernels.py with one more buffer; launched directly with the
shipped tile). Is the fixed cost of a stream a late start, or programs that end after the others?
bf16, Nq = 1, d = 64, Hq = Hkv = 8."""
import importlib.util
import json
import pathlib
import sys
import tempfile
import torch
import mta
import mta.decode as dec

SRC = pathlib.Path(mta.__file__).with_name("decode_kernels.py").read_text()
SIG = "def decode_split_kernel(Q, W, K, V, LENS, O, M_PART, L_PART, ACC_PART,"
START = "    split = tl.program_id(0)\n    b = tl.program_id(1) // num_kv_heads\n"
END = "    d_ok = offs_d < D\n    if ONE_SPLIT:\n"
TIMER = '''
@triton.jit
def _now():
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _smid():
    return tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)

'''
for s in (SIG, START, END):
    assert SRC.count(s) == 1, s
src = (SRC.replace("from .kernel_parts import", "from mta.kernel_parts import")
       .replace("@triton.jit(do_not_specialize=NO_SPECIALIZE)\ndef decode_split_kernel", TIMER + "@triton.jit(do_not_specialize=NO_SPECIALIZE)\ndef decode_split_kernel")
       .replace(SIG, SIG + " TIMES,")
       .replace(START, "    t_enter = _now()\n" + START)
       .replace(END, "    t_loop = _now()\n    pid = tl.program_id(0) + tl.num_programs(0) * tl.program_id(1)\n"
                "    tl.store(TIMES + pid * 3, t_enter)\n    tl.store(TIMES + pid * 3 + 1, t_loop)\n"
                "    tl.store(TIMES + pid * 3 + 2, _smid().to(tl.int64))\n" + END))
path = pathlib.Path(tempfile.mkdtemp()) / "dk_timeline.py"
path.write_text(src)
spec = importlib.util.spec_from_file_location("dk_timeline", path)
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
kern = mod.decode_split_kernel

dev = torch.device("cuda")
out = {}
for B, N, S in ((16, 65536, 1), (16, 32768, 1), (8, 65536, 2)):
    H, D = 8, 64
    q = torch.randn(B, H, 1, D, device=dev, dtype=torch.bfloat16)
    k = torch.randn(B, H, N, D, device=dev, dtype=torch.bfloat16)
    v = torch.randn(B, H, N, D, device=dev, dtype=torch.bfloat16)
    o = torch.empty_like(q)
    parts = dec.split_states(S, B * H, D, dev)
    times = torch.zeros(S * B * H * 3, dtype=torch.int64, device=dev)
    block_n, warps, stages = dec.decode_tile(64, torch.bfloat16)
    flush = torch.empty(256 << 20, dtype=torch.int8, device=dev)
    runs = []
    for rep in range(6):
        flush.zero_()
        torch.cuda.synchronize()
        dec.launch(kern, (S, B * H, 1), q, None, k, v, None, o, *parts, times, *q.stride(), *k.stride(), *v.stride(),
                   *o.stride(), N, 1, H, H, S, D ** -0.5, HAS_LENS=False, ONE_SPLIT=S == 1, FOLD=False, CQ=1, CK=1, E=0,
                   D=D, BLOCK_D=64, ROWS=16, BLOCK_M=16, STACK=16, BLOCK_N=block_n, BLOCK_E=16, BLOCK_W=16, A_GROUP=1,
                   BAND_STACK=0, PDL=False, PRECISION="tf32", WIDE=False, num_warps=warps, num_stages=stages)
        torch.cuda.synchronize()
        t = times.view(-1, 3).cpu()
        t0 = t[:, 0].min()
        enter = (t[:, 0] - t0).double() / 1e3
        loop = (t[:, 1] - t0).double() / 1e3
        if rep >= 2:
            runs.append(dict(enter_us=enter.tolist(), loop_end_us=loop.tolist(), sm=t[:, 2].tolist()))
            srt = loop.sort().values
            print(f"{B}x{H} N{N} s={S} rep{rep}: entries spread {enter.max():.2f} us; loop ends min {srt[0]:.1f} "
                  f"p10 {srt[len(srt) // 10]:.1f} median {srt.median():.1f} p90 {srt[9 * len(srt) // 10]:.1f} "
                  f"max {srt[-1]:.1f} us; distinct SMs {len(set(t[:, 2].tolist()))}", flush=True)
    out[f"{B}x{H} N{N} s={S}"] = runs
    del q, k, v
json.dump(out, open(sys.argv[1], "w"))
