import json,sys,glob,statistics
rows=[]
for f in sorted(glob.glob(sys.argv[1]+'/*.json')):
    d=json.load(open(f));b=d['broker'];c=d['client_send']
    r=dict(run=f.split('/')[-1][:-5], cli50=d['ack']['p50_us']/1e3, cli99=d['ack']['p99_us']/1e3, brk99=b['ack_p99_us_per_core'][0]/1e3,
      flush99=b['flush_p99_us_per_core'][0]/1e3, write99=b['write_p99_us_per_core'][0]/1e3,
      sd50=c['delay_p50_us']/1e3, sd99=c['delay_p99_us']/1e3, sdmax=c['delay_max_us']/1e3, batches=c['batches'],
      ww=c['window_waits'], wwms=c['window_wait_ms'], iw=c['in_flight_waits'], iwms=c['in_flight_wait_ms'], wr=c['write_ms'])
    rows.append(r)
    print(' '.join(f'{k}={v:.2f}' if isinstance(v,float) else f'{k}={v}' for k,v in r.items()))
    # per-second correlation
    print('   seconds (client p99, broker latest p99, send delay p99):', [(t['ack_p99_us']//1000, (t['broker_latest_ack_p99_us_per_core'] or [0])[0]//1000, t['client_send_delay_p99_us']//1000) for t in d['timeline'] if t['measured']])
for k in ['cli50','cli99','brk99','flush99','write99','sd50','sd99','sdmax','ww','wwms','iw','iwms','wr']:
    xs=[r[k] for r in rows]; print(f'{k}: median {statistics.median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})')
