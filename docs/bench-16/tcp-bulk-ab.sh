#!/bin/bash
# usage: ab2.sh rounds blocks "label:envs:builddir" ... ; interleaves per block size
cd /work/wt-tcpbulk
rounds=$1; blocks=$2; shift 2
for r in $(seq $rounds); do
  for b in ${blocks//,/ }; do
    for cfg in "$@"; do
      IFS=: read label envs dir <<<"$cfg"
      env $envs $dir/kvferry bench engine --transports tcp --op ${OPS_KIND:-write,read} --threads 2 --block-bytes $b --ops ${OPS:-128} --min-time-ms ${MT:-300} 2>&1 | grep 'GB/s' | sed "s/^/$r $label /"
    done
  done
  if [ -n "$IPERF" ]; then
    iperf3 -s -1 -p 25301 >/dev/null 2>&1 & sleep 0.3
    iperf3 -c 127.0.0.1 -p 25301 -t ${IPERF} -J > /tmp/tb/ip.json
    python3 -c "
import json; r=json.load(open('/tmp/tb/ip.json'))['end']; g=r['sum_received']['bytes']/r['sum_received']['seconds']/1e9; c=r['cpu_utilization_percent']
print(f'$r iperf3 {g*8:.2f} Gbits/sec {g:.2f} GB/s cpu {(c[\"host_total\"]+c[\"remote_total\"])/100*r[\"sum_received\"][\"seconds\"]/(r[\"sum_received\"][\"bytes\"]/1e9):.2f} s/GB')"
    wait
  fi
done
