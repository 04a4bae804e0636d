"""Tiny per-thread PTX emulator: integer/address paths exact, floats junk, wgmma skipped.
Records st.shared / cp.async writes (phase-tagged) and wgmma descriptors."""
import re, sys, struct, collections
M32, M64 = (1<<32)-1, (1<<64)-1
class Tok:
    __slots__=("addr",)
    def __init__(s,a): s.addr=a
    def __repr__(s): return f"T{s.addr:#x}"
def parse(path):
    lines = open(path).read().splitlines()
    ins, labels = [], {}
    for ln in lines:
        s = ln.split("//")[0].strip()
        if not s or s.startswith(".") or s in ("{","}",")"): continue
        if s.endswith(":"):
            labels[s[:-1]] = len(ins); continue
        s = s.rstrip(";").strip()
        pred = None
        m = re.match(r"@(!?)(%p\d+)\s+(.*)", s)
        if m: pred = (m.group(1)=="!", m.group(2)); s = m.group(3)
        parts = s.split(None,1)
        op = parts[0]; rest = parts[1] if len(parts)>1 else ""
        ins.append((pred, op, rest))
    return ins, labels
def split_ops(rest):
    out, depth, cur = [], 0, ""
    for ch in rest:
        if ch in "{[": depth+=1
        if ch in "}]": depth-=1
        if ch=="," and depth==0: out.append(cur.strip()); cur=""
        else: cur+=ch
    if cur.strip(): out.append(cur.strip())
    return out
def sx(v,b): v&=(1<<b)-1; return v-(1<<b) if v>>(b-1) else v
def f2b(f): return struct.unpack("<I",struct.pack("<f",f))[0]
class Thread:
    def __init__(s, tid, ctaid, nctaid, params, gmem, log, smem_base=0):
        s.r={"%tid.x":tid,"%ctaid.x":ctaid[0],"%ctaid.y":ctaid[1],"%nctaid.x":nctaid[0],"%nctaid.y":nctaid[1]}
        s.params=params; s.gmem=gmem; s.log=log; s.tid=tid; s.phase=0; s.smem={}
    def val(s, o):
        o=o.strip()
        if o in s.r: return s.r[o]
        if o.startswith("%"): return s.r.get(o,0)
        if o=="global_smem": return 0
        if o.startswith("0f"): return int(o[2:],16)
        if o.startswith("0d"): return int(o[2:],16)
        if o.startswith("0x"): return int(o,16)
        return int(o)
    def addr(s,o):
        m=re.match(r"\[\s*([^\]+]+?)\s*(\+\s*(-?\d+))?\s*\]",o)
        base=m.group(1).strip()
        b = s.params[base] if base.startswith("conv_") else s.val(base)
        return (b + (int(m.group(3)) if m.group(3) else 0))
def run(ins, labels, th, stop_after_wgmma=None, maxsteps=2000000):
    pc=0; steps=0; nwg=0
    R=th.r
    while pc < len(ins):
        steps+=1
        if steps>maxsteps: raise RuntimeError("too many steps")
        pred, op, rest = ins[pc]; pc+=1
        if pred is not None:
            p = bool(th.val(pred[1]))
            if pred[0]: p = not p
            if not p: continue
        ops = split_ops(rest)
        base = op.split(".")[0]
        t = op.split(".")
        if base=="ret": break
        if base=="bra": pc = labels[ops[0]]; continue
        if base=="bar" or op.startswith("fence") or base=="wgmma" and "fence" in op:
            th.phase+=1; continue
        if base=="wgmma":
            if "mma_async" in op:
                th.log["wgmma"].append((th.phase, th.tid, op, [th.val(o) for o in ops if o.startswith("%rd")]))
                nwg+=1
                accregs=[x.strip() for x in ops[0].strip("{} ").split(",")]
                for i,x in enumerate(accregs): R[x]=("acc",th.tid,i,op.split(".")[4])
                if stop_after_wgmma and nwg>=stop_after_wgmma: return
            continue
        if base=="cp":
            if "async.cg" in op or "async.ca" in op:
                dst=th.addr(ops[0]); src=th.addr(ops[1]); n=th.val(ops[2]); ss=th.val(ops[3]) if len(ops)>3 else n
                for i in range(0,n,2):
                    v = Tok(src+i) if i < ss else 0
                    th.log["st"].append((th.phase, th.tid, dst+i, v))
            continue
        d = ops[0] if ops else None
        if base=="ld":
            if ".param" in op:
                R[d]=th.params[ops[1].strip("[] ")]; continue
            a=th.addr(ops[1])
            regs=[x.strip() for x in d.strip("{} ").split(",")]
            if ".shared" in op:
                snap = th.log.get("snap")
                w = 2 if t[-1]=="b16" else 4
                for i,x in enumerate(regs):
                    if snap is None: R[x]=0
                    elif w==2: R[x]=snap(th.phase, a+2*i)
                    else: R[x]=("w32", snap(th.phase, a+4*i), snap(th.phase, a+4*i+2))
                continue
            w = 2 if t[-1]=="b16" else 4
            for i,x in enumerate(regs):
                if w==2: R[x]=Tok(a+2*i)
                else: R[x]=(Tok(a+4*i),Tok(a+4*i+2)) if th.gmem=="tok16" else 0
            continue
        if base=="st" and ".global" in op:
            a=th.addr(ops[0]); regs=[x.strip() for x in ops[1].strip("{} ").split(",")]
            for i,x in enumerate(regs): th.log.setdefault("gst",[]).append((th.tid, op, a+(2 if t[-1]=="b16" else 4)*i, th.val(x)))
            continue
        if base=="st":
            if ".shared" in op:
                a=th.addr(ops[0])
                regs=[x.strip() for x in ops[1].strip("{} ").split(",")]
                w = 2 if t[-1]=="b16" else 4
                for i,x in enumerate(regs):
                    v=th.val(x)
                    if w==2: th.log["st"].append((th.phase,th.tid,a+2*i,v))
                    else:
                        if isinstance(v,tuple) and v and v[0]=="pair":
                            th.log["st"].append((th.phase,th.tid,a+4*i,v[2])); th.log["st"].append((th.phase,th.tid,a+4*i+2,v[1]))
                        elif isinstance(v,tuple):
                            th.log["st"].append((th.phase,th.tid,a+4*i,v[0])); th.log["st"].append((th.phase,th.tid,a+4*i+2,v[1]))
                        else:
                            th.log["st"].append((th.phase,th.tid,a+4*i,v&0xffff if isinstance(v,int) else ("w32",v))); th.log["st"].append((th.phase,th.tid,a+4*i+2,(v>>16)&0xffff if isinstance(v,int) else ("w32",v)))
            continue
        if base=="shfl": R[d]=th.val(ops[1]); continue
        if base in ("ldmatrix",): 
            for x in d.strip("{} ").split(","): R[x.strip()]=0
            continue
        if base=="mov":
            v=th.val(ops[1]); R[d]=v; continue
        # arithmetic
        typ=t[-1]
        bits = 16 if typ.endswith("16") else 64 if typ.endswith("64") else 32 if typ[1:].isdigit() else 1
        if base=="cvt" and "f16x2" in op:
            R[d]=("pair", th.val(ops[1]), th.val(ops[2])); continue
        if typ in ("f32","f16x2") or "f32" in op and base not in ("cvt","setp","selp"):
            if base in ("setp",):
                pass
            else:
                vs=[th.val(x) for x in ops[1:]]
                tk=[v for v in vs if isinstance(v,tuple) and v and v[0]=="acc"]
                R[d]=tk[0] if tk else 0; continue
        a=[th.val(x) for x in ops[1:]]
        if any(isinstance(x,(Tok,tuple)) for x in a):
            if base in ("selp",): R[d]= a[0] if a[2] else a[1]; continue
            R[d]=("junk",op); continue
        M=(1<<bits)-1 if bits>1 else 1
        if base=="setp":
            cmp=t[1]; ty=t[2]
            if ty=="f32": R[d]=0; continue
            b=int(ty[1:])
            x,y=(sx(a[0],b),sx(a[1],b)) if ty[0]=="s" else (a[0]&((1<<b)-1),a[1]&((1<<b)-1))
            R[d]=int({"lt":x<y,"le":x<=y,"gt":x>y,"ge":x>=y,"eq":x==y,"ne":x!=y}[cmp]); continue
        if base=="selp": R[d]= a[0] if a[2] else a[1]; continue
        if base=="and": R[d]=(a[0]&a[1])&M if bits>1 else int(bool(a[0]) and bool(a[1])); continue
        if base=="or": R[d]=(a[0]|a[1])&M if bits>1 else int(bool(a[0]) or bool(a[1])); continue
        if base=="xor": R[d]=(a[0]^a[1])&M if bits>1 else int(bool(a[0])!=bool(a[1])); continue
        if base=="not": R[d]=(~a[0])&M if bits>1 else int(not a[0]); continue
        if base=="add": R[d]=(a[0]+a[1])&M; continue
        if base=="sub": R[d]=(a[0]-a[1])&M; continue
        if base=="shl": R[d]=(a[0]<<a[1])&M if a[1]<bits else 0; continue
        if base=="shr":
            if t[1][0]=="s": R[d]=(sx(a[0],bits)>>min(a[1],bits-1))&M
            else: R[d]=((a[0]&M)>>a[1]) if a[1]<bits else 0
            continue
        if base=="mul":
            if t[1]=="wide":
                b=int(t[2][1:]); x,y=((sx(a[0],b),sx(a[1],b)) if t[2][0]=="s" else (a[0],a[1])); R[d]=(x*y)&M64
            else:
                b=int(t[2][1:]); x,y=((sx(a[0],b),sx(a[1],b)) if t[2][0]=="s" else (a[0],a[1])); R[d]=(x*y)&((1<<b)-1)
            continue
        if base=="mad":
            if t[1]=="wide":
                b=int(t[2][1:]); x,y=((sx(a[0],b),sx(a[1],b)) if t[2][0]=="s" else (a[0],a[1])); R[d]=(x*y+a[2])&M64
            else:
                b=int(t[2][1:]); x,y=((sx(a[0],b),sx(a[1],b)) if t[2][0]=="s" else (a[0],a[1])); R[d]=(x*y+a[2])&((1<<b)-1)
            continue
        if base=="div":
            b=int(typ[1:]); x,y=(sx(a[0],b),sx(a[1],b)) if typ[0]=="s" else (a[0],a[1])
            q=abs(x)//abs(y); q = q if (x>=0)==(y>=0) else -q; R[d]=q&((1<<b)-1); continue
        if base in ("min","max"):
            b=int(typ[1:]); x,y=(sx(a[0],b),sx(a[1],b)) if typ[0]=="s" else (a[0],a[1])
            R[d]=(min(x,y) if base=="min" else max(x,y))&((1<<b)-1); continue
        if base=="bfe":
            b=int(typ[1:]); x=a[0]; pos=a[1]; ln=a[2]; v=(x>>pos)&((1<<ln)-1)
            if typ[0]=="s" and ln and (v>>(ln-1)): v-= (1<<ln)
            R[d]=v&((1<<b)-1); continue
        if base=="cvt":
            dt,st=t[-2],t[-1]
            if "f" in dt or "f" in st: R[d]=0; continue
            sb=int(st[1:]); db=int(dt[1:]); v=a[0]&((1<<sb)-1)
            if st[0]=="s": v=sx(v,sb)
            R[d]=v&((1<<db)-1); continue
        if base in ("ex2","neg","max","fma","div","sub","add","mul"): R[d]=0; continue
        raise NotImplementedError(op+" "+rest)
