import os, sys
sys.argv=[sys.argv[0]]
exec(open("/tmp/probe/comp.py").read().split('if __name__ == "__main__":')[0])
D=24; B,Hq,Hkv,N,cq,ck=1,4,2,40,5,3; dt=torch.float16
q=torch.empty(B,Hq,N,32,dtype=dt)[..., :D]; v=torch.empty(B,Hkv,N,32,dtype=dt)[..., :D]
kf=torch.empty(B,Hq,cq,N,32,dtype=dt)[..., :D]; cd=torch.empty(B,Hq,N,16)
args,kw=c90.recorded(launch_conv_forward, conv_forward_kernel, q, v, kf, cd, (cq,ck), True, D**-0.5)
ck_,err,sig,consts=c90.compile_kernel(c90.jit_of(conv_forward_kernel), args, kw)
print(err); a=ck_.asm
open("/tmp/probe/out/f16_D24pad.ttgir","w").write(a["ttgir"]); open("/tmp/probe/out/f16_D24pad.ptx","w").write(a["ptx"])
print("shared", ck_.metadata.shared)
