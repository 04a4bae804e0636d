"""CPU (interpreter): relative error of mta.conv_attention and mta.flash_attention in fp16 against the float64
reference as the logits grow (q and k multiplied by 1-16, D = 32, N = 64, 3 x 5 kernel). Output in
fp16_folded_keys.txt."""
import torch, mta
torch.manual_seed(0)
B,H,N,D=1,2,64,32
for mult in (1,2,4,8,16):
    q,k,v=(torch.randn(B,H,N,D) for _ in range(3)); q=q*mult; k=k*mult
    w=0.3*torch.randn(H,3,5); do=torch.randn(B,H,N,D)
    for dt in (torch.float16,):
        L=[t.to(dt).requires_grad_() for t in (q,k,v)]+[w.clone().requires_grad_()]
        o=mta.conv_attention(*L); g=torch.autograd.grad(o,L,do.to(dt))
        R=[t.to(dt).double().requires_grad_() for t in (q,k,v)]+[w.double().requires_grad_()]
        r=mta.conv_attention_reference(*R); gr=torch.autograd.grad(r,R,do.to(dt).double())
        # also the error of flash attention in fp16 at the same logits, for scale
        Lf=[t.to(dt).requires_grad_() for t in (q,k,v)]; of=mta.flash_attention(*Lf,causal=True); gf=torch.autograd.grad(of,Lf,do.to(dt))
        Rf=[t.to(dt).double().requires_grad_() for t in (q,k,v)]; rf=mta.naive_attention(*Rf,causal=True); gfr=torch.autograd.grad(rf,Rf,do.to(dt).double())
        e=lambda a,b:((a.double()-b).norm()/b.norm()).item()
        logit=(q[0,0]@k[0,0].T*D**-0.5).abs().max().item()
        print(f"x{mult} max|logit| {logit:7.1f} conv: o {e(o,r):.1e} dq {e(g[0],gr[0]):.1e} dk {e(g[1],gr[1]):.1e} dw {e(g[3],gr[3]):.1e} | flash: o {e(of,rf):.1e} dq {e(gf[0],gfr[0]):.1e}")
