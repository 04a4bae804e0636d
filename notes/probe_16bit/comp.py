import os, sys, tempfile, io, contextlib, re, json
os.environ["TRITON_INTERPRET"] = "0"
os.environ.setdefault("TRITON_CACHE_DIR", tempfile.mkdtemp(prefix="tc_"))
sys.path.insert(0, "/work/wt-probe/tools")
sys.argv = [sys.argv[0], "conv"] + []  # for compile_sm90 argparse
import importlib.util
spec = importlib.util.spec_from_file_location("c90", "/work/wt-probe/tools/compile_sm90.py")
c90 = importlib.util.module_from_spec(spec); spec.loader.exec_module(c90)
import torch, mta, mta.conv, mta.launch
from mta.conv import launch_conv_forward
from mta.conv_forward import conv_forward_kernel
mta.conv.shifted_head_dim_block = lambda d, dtype: mta.launch.head_dim_block(d)
mta.conv.shared_memory_limit = lambda dev: 232448

def launch_args(D, causal=True, cq=5, ck=3, dtype=torch.float16, B=1, Hq=4, Hkv=2, N=40, cfg=None):
    q, v = torch.empty(B, Hq, N, D, dtype=dtype), torch.empty(B, Hkv, N, D, dtype=dtype)
    kf, cd = torch.empty(B, Hq, cq, N, D, dtype=dtype), torch.empty(B, Hq, N, 16, dtype=torch.float32)
    kw = {} if cfg is None else cfg
    return c90.recorded(launch_conv_forward, conv_forward_kernel, q, v, kf, cd, (cq, ck), causal, D ** -0.5, **kw)

if __name__ == "__main__":
    out = sys.argv_out if hasattr(sys, "argv_out") else "/tmp/probe/out"
    os.makedirs(out, exist_ok=True)
    cases = [int(x) for x in os.environ.get("DS", "24,32,40").split(",")]
    dt = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}[os.environ.get("DT", "f16")]
    for D in cases:
        args, kw = launch_args(D, dtype=dt)
        show = {k: v for k, v in kw.items()}
        print(D, show)
        ck, err, sig, consts = c90.compile_kernel(c90.jit_of(conv_forward_kernel), args, kw)
        if err: print("ERR", err); continue
        tag = f"{os.environ.get('DT','f16')}_D{D}"
        for k in ("ttir", "ttgir", "llir", "ptx"):
            open(f"{out}/{tag}.{k}", "w").write(ck.asm[k])
        open(f"{out}/{tag}.cubin", "wb").write(ck.asm["cubin"])
        print(" shared", ck.metadata.shared, "warps", ck.metadata.num_warps)
