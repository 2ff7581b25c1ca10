import re,sys
for l in sys.stdin:
    if l.startswith('--'): print(l.strip()); continue
    m=re.search(r'(tcp|ucx)\s+(\w+) thr=\d block=\s*(\S+) ops=\s*(\d+)\s+([\d.]+) GB/s\s+p50\s+([\d.]+) us.*?(socket|polled)\s+([\d.]+) GB/s p50\s+([\d.]+) us(?:\s+p99\s+[\d.]+ us)?\s+ratio\s+([\d.]+)\s+p50/ref\s+([\d.]+)',l)
    if m: print(f"{m[2]:5} {m[3]:>6} x{m[4]:<4} eng {m[5]:>6} GB/s p50 {m[6]:>7}  ref({m[7]}) {m[8]:>6} GB/s p50 {m[9]:>7}  ratio {m[10]} p50/ref {m[11]}")
