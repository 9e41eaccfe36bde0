import json,glob,statistics,sys,os
def load(d,prefix):
    rows=[]
    for f in sorted(glob.glob(f"{d}/{prefix}-*.json")):
        r=json.load(open(f)); b=r.get("broker") or {}
        st=b.get("stored_bytes",0)/1e6; bcs=b.get("cpu_s") or 0; gcs=r["generator_cpu_s"]
        p50=b.get("ack_p50_us_per_core") or [0]; p99=b.get("ack_p99_us_per_core") or [0]
        rows.append(dict(mbs=r["stored_mb_s"] or 0, bmb=st/bcs if bcs else 0, gmb=st/gcs if gcs else 0,
            bbusy=b.get("cpu_pct") or 0, gbusy=r["generator_busy_pct"], cp50=r["ack"]["p50_us"]/1000, cp99=r["ack"]["p99_us"]/1000,
            bp50=p50[0]/1000, bp99=p99[0]/1000, load=r["load_average_1m"][0] or 0, bound=r.get("bound_by")))
    return rows
def fmt(rows,k,f="{:.0f}"):
    v=[r[k] for r in rows]
    return (f+" ("+f+"-"+f+")").format(statistics.median(v),min(v),max(v))
d,prefix=sys.argv[1],sys.argv[2]
rows=load(d,prefix)
keys=sys.argv[3].split(",")
fmts={"cp50":"{:.2f}","cp99":"{:.1f}","bp50":"{:.2f}","bp99":"{:.1f}","load":"{:.1f}"}
print(f"| {d.split('/')[-1]} {prefix} (n={len(rows)}) | "+" | ".join(fmt(rows,k,fmts.get(k,"{:.0f}")) for k in keys)+" | "+",".join(sorted(set(str(r['bound']) for r in rows)))+" |")
