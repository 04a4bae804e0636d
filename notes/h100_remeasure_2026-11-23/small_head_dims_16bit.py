"""The MTA forward at small 16-bit head dims on a GPU (results: small_head_dims_16bit_8f93bb9.log, before the fix).
One case per process (an illegal address poisons the context), from the repository root:
    CUDA_LAUNCH_BLOCKING=1 PYTHONPATH=. python notes/h100_remeasure_2026-11-23/small_head_dims_16bit.py DTYPE D MODE
MODE: plain | notma (no copy-engine descriptors) | noahead (no compile-ahead) | streamed (queries not held) |
flash. Prints the relative errors of the folded keys, of the output from the kernel's own folded keys and from
torch's, and of the public function, against the float64 reference; B=1, Hq=4, Hkv=2, N=40, 5 x 3 kernel."""
import os, sys
dtn, D, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if mode == "noahead":
    os.environ["MTA_COMPILE_AHEAD"] = "0"
import torch, mta
from mta import conv, conv_forward
from mta.reference import conv_attention_reference
dt = getattr(torch, dtn)
if mode == "notma":
    conv_forward.USE_TMA = False
if mode == "streamed":
    conv_forward.RESIDENT_BYTES = 0
torch.manual_seed(0)
B, H, Hk, N, cq, ck = 1, 4, 2, 40, 5, 3
q, k, v = (torch.randn(B, h, N, D, dtype=torch.float64).to(dt).to(mta.runtime.DEVICE) for h in (H, Hk, Hk))
w = 0.2 * torch.randn(H, cq, ck).to(mta.runtime.DEVICE)
def rel(a, b): a, b = a.double().cpu(), b.double().cpu(); return ((a - b).norm() / b.norm()).item()
res = {}
for causal in (False, True):
    ref = conv_attention_reference(*(x.double().cpu() for x in (q, k, v, w)), causal=causal)
    if mode == "flash":
        o = mta.flash_attention(q, k, v, causal=causal)
        r = mta.naive_attention(*(x.double().cpu() for x in (q, k, v)), causal=causal)
        res[causal] = f"flash o {rel(o, r):.2e}"
        continue
    pk = (ck - 1) // 2
    kk = torch.nn.functional.pad(k.double().cpu(), (0, 0, pk, pk))
    kf_t = torch.stack([sum(w[h, a, t].double().cpu() * kk[:, h // (H // Hk), t:t + N] for t in range(ck))
                        for h in range(H) for a in range(cq)], 1).reshape(B, H, cq, N, D)
    kf, cd = conv.conv_prepasses(q, k, w, causal)
    (torch.cuda.synchronize() if torch.cuda.is_available() else None)
    e_kf = rel(kf, kf_t)
    o1, _ = conv.launch_conv_forward(q, v, kf, cd, (cq, ck), causal, D ** -0.5)
    o2, _ = conv.launch_conv_forward(q, v, kf_t.to(dt).to(mta.runtime.DEVICE), cd, (cq, ck), causal, D ** -0.5)
    o3 = mta.conv_attention(q, k, v, w, causal=causal)
    (torch.cuda.synchronize() if torch.cuda.is_available() else None)
    res[causal] = f"kf {e_kf:.1e} o(own kf) {rel(o1, ref):.1e} o(torch kf) {rel(o2, ref):.1e} public {rel(o3, ref):.1e}"
print(dtn, D, mode, "| noncausal:", res[False], "| causal:", res[True], flush=True)
