import subprocess,sys,re,collections
def shares(f):
    out=subprocess.run(['perf','report','-i',f,'--no-children','--sort','dso,symbol','--stdio','-g','none'],capture_output=True,text=True).stdout
    c=collections.Counter(); n=0
    for line in out.splitlines():
        m=re.match(r'\s+([\d.]+)%\s+(\S+)\s+\[(.)\]\s+(.*)',line)
        if not m: continue
        p=float(m.group(1)); dso=m.group(2); sym=m.group(4).strip()
        if 'memmove' in sym or 'memcpy' in sym: k='memmove/memcpy (user)'
        elif dso.startswith('[kernel'): k='kernel (UDP send/GSO, copies, softirq)'
        elif 'aes' in sym or 'gcm' in sym or 'aead' in sym or 'encrypt' in sym.lower(): k='AES-128-GCM seal'
        elif re.search(r'malloc|_int_free|unlink_chunk|cfree|realloc|memalign|^free$',sym): k='allocator (glibc malloc/free)'
        elif 'quinn' in sym: k='quinn + quinn-proto'
        elif 'futures_unordered' in sym or 'futures_util' in sym: k='futures-util FuturesUnordered'
        elif 'tokio' in sym: k='tokio runtime/sync'
        elif 'bytes::' in sym: k='bytes refcounts (clone/drop/split)'
        elif 'felix' in sym: k='felix client + loadgen code'
        else: k='other'
        c[k]+=p; n+=p
    return c
fs=sys.argv[1:]
cs=[shares(f) for f in fs]
keys=sorted(set(k for c in cs for k in c), key=lambda k:-cs[0].get(k,0))
print('| share of generator CPU | '+' | '.join(fs)+' |'); print('|---|'+'---:|'*len(fs))
for k in keys: print('| %s | %s |'%(k,' | '.join('%.1f %%'%c.get(k,0) for c in cs)))
