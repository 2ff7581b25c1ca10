# Tables of engine GB/s / memcpy GB/s = ratio per cell, old and new side by side, from the
# output of ab-shm.sh (one table per "# A/B" section).
import re, sys, collections

def flush(d):
    for k, v in d.items():
        print(f"{k:16}", "  ".join(f"{b}: " + " ".join(f"{g:.1f}/{r:.1f}={x:.2f}" for g, r, x in v[b]) for b in v))
    d.clear()

d = collections.defaultdict(lambda: collections.defaultdict(list))
b = None
for l in sys.stdin:
    if l.startswith('# A/B'):
        flush(d); print(l.strip()); continue
    if l.startswith('--'): b = l.split()[1]; continue
    m = re.search(r'(\w+) write thr=(\d) block=\s*(\S+) ops=\s*(\d+)\s+([\d.]+) GB/s.*memcpy\s+([\d.]+) GB/s.*?ratio\s+([\d.]+)', l)
    if m: d[f"{m[1]} thr{m[2]} {m[3]}x{m[4]}"][b].append((float(m[5]), float(m[6]), float(m[7])))
flush(d)
