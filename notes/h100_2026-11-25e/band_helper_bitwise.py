"""The band's kernel-column loop as one helper (`_add_kernel_columns`): outputs bitwise equal to the kernel
before it, both band forms, bf16 on the GPU, 6 x 11 and 11 x 15, d = 64 and 128, ragged caches."""
import importlib.util, subprocess, sys, tempfile, torch, mta, mta.decode as md, mta.tuning
OLD = tempfile.mktemp(suffix=".py")  # the kernel module before the helper (d2be195)
open(OLD, "w").write(subprocess.check_output(["git", "show", "d2be195:mta/decode_kernels.py"], text=True))
spec = importlib.util.spec_from_file_location("mta._old_decode_kernels", OLD)
old = importlib.util.module_from_spec(spec); sys.modules[spec.name] = old; spec.loader.exec_module(old)
new_kernel = md.decode_split_kernel
ok = True
for stacked in (False, True):
    mta.tuning.STACKED_BAND = (64, 128, 256) if stacked else ()
    for cq, ck, n, Hq, Hkv, D in [(6, 11, 1, 8, 8, 64), (6, 11, 1, 32, 8, 128), (11, 15, 3, 8, 2, 128)]:
        g = torch.Generator(device="cuda").manual_seed(cq * 100 + ck)
        L = torch.tensor([n, 700, 5000], dtype=torch.int32, device="cuda")
        q = torch.randn(3, Hq, 5000, D, generator=g, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(3, Hkv, 5000, D, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        w = 0.2 * torch.randn(Hq, cq, ck, generator=g, device="cuda")
        outs = []
        for kern in (old.decode_split_kernel, new_kernel):
            md.decode_split_kernel = kern
            outs.append(mta.conv_decode_attention(q, k, v, w, cache_seqlens=L, num_queries=n))
        same = torch.equal(*outs)
        ok &= same
        print("stacked" if stacked else "rows", cq, ck, n, Hq, Hkv, D, "bitwise equal:", same, flush=True)
md.decode_split_kernel = new_kernel
print("ALL EQUAL" if ok else "DIFFER")
