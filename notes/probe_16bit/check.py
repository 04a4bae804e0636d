import sys, pickle, collections
sys.path.insert(0,"/tmp/probe")
from emu import Tok
def sw(row_bytes, rowidx, chunk, swz):
    # swz bytes: 128 -> 8 chunks xor row%8 ; 64 -> xor (row>>1)%4 ; 32 -> xor (row>>2)%2
    if swz==128: return chunk ^ (rowidx%8)
    if swz==64: return chunk ^ ((rowidx>>1)%4)
    if swz==32: return chunk ^ ((rowidx>>2)%2)
    return chunk
def off(outer, inner, inner_len, swz):
    """element (outer, inner) of a tile whose contiguous dim is inner (16-bit); swizzle width swz bytes."""
    per = swz//2  # elements per swizzle row
    kb, w = divmod(inner, per)
    return kb*(outer_total*swz) + outer*swz + sw(swz, outer, w//8, swz)*16 + (w%8)*2
def mem_at(log, upto_phase, lo, hi):
    m={}
    for p,tid,a,v in sorted(log["st"], key=lambda x: x[0]):
        if p<=upto_phase and lo<=a<hi: m[a]=v
    return m
def decode(tok, D, N=40, cq=5):
    a=tok.addr; reg=a>>28; e=(a&0xfffffff)//2
    if reg==1: h,r=divmod(e,N*D); return ("Q",h,r//D,r%D)
    if reg==2: h,r=divmod(e,cq*N*D); aa,r=divmod(r,N*D); return ("KF",h,aa,r//D,r%D)
    if reg==3: h,r=divmod(e,N*D); return ("V",h,r//D,r%D)
    return ("?",a)
def check(log, D, BD, tiles):
    global outer_total
    for name, phase, base, outer_n, inner_n, swz, expect in tiles:
        outer_total=outer_n
        mem=mem_at(log, phase, base, base+outer_n*inner_n*2)
        bad=0; ex=[]
        for o in range(outer_n):
            for i in range(inner_n):
                a=base+off(o,i,inner_n,swz)
                got=mem.get(a,"unset")
                exp=expect(o,i)
                g = decode(got,D)[1:] if isinstance(got,Tok) else got
                gname = decode(got,D)[0] if isinstance(got,Tok) else None
                if exp is None: ok = (got==0)
                else: ok = isinstance(got,Tok) and (decode(got,D)[0],)+tuple(x for j,x in enumerate(decode(got,D)[1:]) if j>0)==exp
                if not ok:
                    bad+=1
                    if len(ex)<6: ex.append(((o,i), got if not isinstance(got,Tok) else decode(got,D), exp))
        print(f"{name:6} phase {phase} base {base}: {bad} mismatches of {outer_n*inner_n}", ex)
def tiles_for(D, BD, ph, bases, N=40, cq=5):
    qrow=lambda m,a: m-(cq-1)+a
    def q_hi(m,c):
        a,d=divmod(c,BD); r=qrow(m,a)
        return ("Q",r,d) if (0<=r<N and a<cq and d<D) else None
    def q_lo(m,c):
        a,d=divmod(c,BD); a+=4; r=qrow(m,a)
        return ("Q",r,d) if (0<=r<N and a<cq and d<D) else None
    def kf(a0):
        def f(n,k):
            a,d=divmod(k,BD); a+=a0
            return ("KF",a,n,d) if (a<cq and d<D and n<N) else None
        return f
    def v(key,d): return ("V",key,d) if (key<N and d<D) else None
    nA=4*BD; swA=min(128, nA*2) ; swL=min(128,BD*2)
    return [("q_hi",ph[0],bases[0],128,nA,128,q_hi),("q_lo",ph[0],bases[1],128,BD,swL,q_lo),
            ("kf_hi",ph[1],bases[2],64,nA,128,kf(0)),("kf_lo",ph[2],bases[3],64,BD,swL,kf(4)),
            ("v",ph[3],bases[4],64,BD,swL,v)]
if __name__=="__main__":
    tag,D,BD=sys.argv[1],int(sys.argv[2]),int(sys.argv[3])
    ph=[int(x) for x in sys.argv[4].split(",")]; bases=[int(x) for x in sys.argv[5].split(",")]
    log=pickle.load(open(f"/tmp/probe/{tag}.log.pkl","rb"))
    check(log,D,BD,tiles_for(D,BD,ph,bases))
