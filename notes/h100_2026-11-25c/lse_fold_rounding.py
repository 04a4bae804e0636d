"""The random-shapes failure of seed 11252026 (bf16, D = 256, 13 x 15, N = 1, non-causal, scale 0.1): is the lse
error the folded keys' rounding to bf16 (documented), or something else? Kernel lse against the float64
reference and against an emulation that rounds Kf to bf16 and computes the rest in float64."""
import torch

import mta
from mta.conv import fold_keys

DEV = "cuda"


def case(dtype, D, cq, ck, N, Hq, Hkv, causal, B, transposed, scale, seed):
    torch.manual_seed(seed)
    q = torch.randn(B, Hq, N, D, device=DEV, dtype=dtype)
    k, v = (torch.randn(B, Hkv, N, D, device=DEV, dtype=dtype) for _ in range(2))
    if transposed:
        q, k, v = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v))
    w = 0.2 * torch.randn(Hq, cq, ck, device=DEV)
    o, lse = mta.conv_attention(q, k, v, w, causal=causal, scale=scale, return_lse=True)
    ro, rlse = mta.conv_attention_reference(q.double(), k.double(), v.double(), w.double(), causal=causal,
                                            scale=scale, return_lse=True)
    kf = fold_keys(k, w, Hq)  # [B, Hq, cq, N, D] in the input dtype, as the kernel holds them
    print("kf", tuple(kf.shape), kf.dtype)
    return lse, rlse, kf, q, k, w


if __name__ == "__main__":
    lse, rlse, kf, q, k, w = case(torch.bfloat16, 256, 13, 15, 1, 2, 2, False, 1, True, 0.1, 1 * 1000 + 256 + 13)
    # N = 1: only tap (cq-1, pk) sees the key: lse = scale * q . (w[cq-1, pk] k), Kf_{cq-1}[0] = w[cq-1, pk] k[0]
    emu = 0.1 * (q.double()[..., 0, :] * kf.double()[:, :, -1, 0, :]).sum(-1)
    bound = 0.1 * (q.double()[..., 0, :].abs() * kf.double()[:, :, -1, 0, :].abs()).sum(-1) * 2 ** -8  # bf16 unit roundoff
    print("kernel lse   ", lse.flatten().tolist())
    print("reference lse", rlse.flatten().tolist())
    print("emulated (bf16 Kf, fp64 dot)", emu.flatten().tolist())
    print("|kernel - ref|", (lse.double() - rlse).abs().flatten().tolist())
    print("rounding bound 2^-8 sum|q Kf| scale", bound.flatten().tolist())
    print("relative error per head", ((lse.double() - rlse).abs() / rlse.abs()).flatten().tolist())
