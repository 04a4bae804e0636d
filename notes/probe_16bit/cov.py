import pickle, sys, collections
sys.path.insert(0,"/tmp/probe")
from emu import Tok
from check import decode
tag,D=sys.argv[1],int(sys.argv[2])
log=pickle.load(open(f"/tmp/probe/{tag}.log.pkl","rb"))
for P in map(int, sys.argv[3].split(",")):
    st=[(tid,a,v) for p,tid,a,v in log["st"] if p==P]
    c=collections.Counter(a for t,a,v in st)
    dup=[a for a,k in c.items() if k>1]
    print("phase",P,"stores",len(st),"unique addrs",len(c),"dups",len(dup))
    byaddr=collections.defaultdict(list)
    for t,a,v in st: byaddr[a].append((t, decode(v,D) if isinstance(v,Tok) else v))
    for a in sorted(dup)[:6]: print("  ",a, byaddr[a])
