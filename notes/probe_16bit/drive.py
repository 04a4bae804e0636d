import sys, collections, pickle
sys.path.insert(0,"/tmp/probe")
from emu import *
def params_for(D, N=40, B=1, Hq=4, Hkv=2, cq=5):
    P={}
    base={0:0x10000000,1:0x20000000,2:0x30000000,3:0x40000000,4:0x50000000,5:0x60000000,54:0,55:0}
    for k,v in base.items(): P[f"conv_forward_kernel_param_{k}"]=v
    vals=[Hq*N*D, N*D, D, Hkv*N*D, N*D, D, Hq*cq*N*D, cq*N*D, N*D, D, Hq*N*D, N*D, D, N, N, Hq, Hq//Hkv, f2b(D**-0.5), 64]
    for i,v in enumerate(vals): P[f"conv_forward_kernel_param_{35+i}"]=v
    return P
def go(tag, D, stop=None, ctaid=(0,1)):
    ins, labels = parse(f"/tmp/probe/out/{tag}.ptx")
    log={"st":[], "wgmma":[]}
    P=params_for(D)
    for tid in range(256):
        th=Thread(tid, ctaid, (1,4), P, "tok16", log)
        run(ins, labels, th, stop_after_wgmma=stop)
    return log
if __name__=="__main__":
    tag, D = sys.argv[1], int(sys.argv[2])
    log=go(tag, D, stop=int(sys.argv[3]) if len(sys.argv)>3 else None)
    pickle.dump(log, open(f"/tmp/probe/{tag}.log.pkl","wb"))
    ph=collections.defaultdict(list)
    for p,tid,a,v in log["st"]: ph[p].append((a,v))
    for p in sorted(ph):
        xs=ph[p]; toks=[v for a,v in xs if isinstance(v,Tok)]
        regs=collections.Counter(hex(v.addr>>28) for v in toks)
        print("phase",p,"n",len(xs),"addr",min(a for a,v in xs),max(a for a,v in xs),"zeros",sum(1 for a,v in xs if v==0),"src",dict(regs), "other", sum(1 for a,v in xs if not isinstance(v,(Tok,int))))
    wg=collections.defaultdict(set)
    for p,tid,op,ops in log["wgmma"]: wg[p].add(op.split(".")[4])
    print({p:sorted(v) for p,v in wg.items()})
