import pickle, sys
tag=sys.argv[1]
log=pickle.load(open(f"/tmp/probe/{tag}.log.pkl","rb"))
def dd(v):
    v&=(1<<64)-1
    return f"start={(v&0x3fff)<<4:6d} lbo={((v>>16)&0x3fff)<<4:5d} sbo={((v>>32)&0x3fff)<<4:5d} swz={v>>62}"
for p,tid,op,vals in log["wgmma"]:
    if tid in (0,128):
        print(p, tid//128, op.split(".")[4], " | ".join(dd(v) for v in vals))
