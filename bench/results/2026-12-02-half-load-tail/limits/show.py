import json,sys,glob,statistics
for d_ in sys.argv[1:]:
  rows={}
  for f in sorted(glob.glob(d_+'/*.json')):
    d=json.load(open(f));b=d['broker'];v=f.split('/')[-1].split('-')[0]
    r=(d['ack']['p50_us']/1000, d['ack']['p99_us']/1000, b['ack_p99_us_per_core'][0]/1000, b['flush_p99_us_per_core'][0]/1000, b['write_p99_us_per_core'][0]/1000, d['broker_busy_pct'], d['generator_busy_pct'])
    rows.setdefault(v,[]).append(r)
    print(f.split('/')[-1], ' '.join(f'{x:.2f}' for x in r))
  for v,rs in rows.items():
    print(v, 'median cli p50 %.2f cli p99 %.2f brk p99 %.2f flush p99 %.2f write p99 %.2f' % tuple(statistics.median(x[i] for x in rs) for i in range(5)), 'cli99 range %.1f-%.1f'%(min(x[1] for x in rs), max(x[1] for x in rs)))
