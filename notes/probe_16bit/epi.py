import sys, collections, bisect
sys.path.insert(0,"/tmp/probe")
from emu import *
from drive import params_for
tag,D,BD=sys.argv[1],int(sys.argv[2]),int(sys.argv[3])
ins, labels = parse(f"/tmp/probe/out/{tag}.ptx")
P=params_for(D)
def runall(log):
    for tid in range(256):
        th=Thread(tid,(0,1),(1,4),P,"tok16",log); run(ins,labels,th)
log1={"st":[],"wgmma":[]}; runall(log1)
# snapshot: state at phase p = stores with phase < p
byaddr=collections.defaultdict(list)
for p,tid,a,v in sorted(log1["st"], key=lambda x:x[0]): byaddr[a].append((p,v))
def snap(phase, a):
    best="unset"
    for p,v in byaddr.get(a,[]):
        if p<phase: best=v
    return best
log2={"st":[],"wgmma":[],"snap":snap}; runall(log2)
# expected accumulator coordinates for wgmma m64nXk16 f32 acc
def acc_coord(tid, i):
    wg, w, lane = tid//128, (tid//32)%4, tid%32
    row = 64*wg + 16*w + lane//4 + 8*((i//2)%2)
    col = (i//4)*8 + (lane%4)*2 + (i%2)
    return row, col
O=0x50000000
bad=0; n=0; ex=[]
for tid,op,a,v in log2["gst"]:
    if not (O <= a < O+0x1000000): continue
    e=(a-O)//2; h,r=divmod(e,40*D); row,d=divmod(r,D)
    n+=1
    if isinstance(v,tuple) and v[0]=="acc":
        rr,cc=acc_coord(v[1],v[2])
        if (rr,cc)!=(row,d):
            bad+=1
            if len(ex)<8: ex.append(((row,d),"got acc of",(rr,cc)))
    else:
        bad+=1
        if len(ex)<8: ex.append(((row,d),v))
print(tag, "O stores", n, "mismatched", bad, ex)
