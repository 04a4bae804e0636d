"""H100: the row-chunked MTA backward where the GPU really takes it (fp32, d = 96, 13 x 3: the fused backward's
smallest tile does not fit), through the public function, the custom op, torch.compile and the layer, against the
float64 reference. Before 1cf2fab the op path raised (autograd is off inside a custom op's backward)."""
import torch

import mta
import mta.conv

torch.manual_seed(0)
B, H, N, D, cq, ck = 1, 2, 40, 96, 13, 3
q, k, v, do = (torch.randn(B, H, N, D, device="cuda") for _ in range(4))
w = 0.2 * torch.randn(H, cq, ck, device="cuda")
print("runs_chunked:", mta.conv.runs_chunked(cq, D, q.dtype))


def grads(fn, *xs):
    leaves = [x.detach().clone().requires_grad_() for x in xs]
    return torch.autograd.grad(fn(*leaves), leaves, do.to(xs[0].dtype))


want = grads(mta.conv_attention_reference, *(t.double() for t in (q, k, v, w)))
compiled = torch.compile(lambda *t: mta.conv_attention(*t), backend="aot_eager")
for name, fn in (("mta.conv_attention", mta.conv_attention), ("mta.ops.conv_attention", mta.ops.conv_attention),
                 ("torch.compile", compiled)):
    got = grads(fn, q, k, v, w)
    print(name, "max rel err:", max(((g.double() - r).norm() / r.norm()).item() for g, r in zip(got, want)))
layer = mta.MultiTokenAttention(2 * D, H, kernel_size=(cq, ck)).cuda()
layer(torch.randn(1, N, 2 * D, device="cuda")).square().sum().backward()
print("layer grads finite:", all(torch.isfinite(p.grad).all().item() for p in layer.parameters()))
