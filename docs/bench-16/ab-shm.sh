#!/bin/bash
n=$1; shift
for i in $(seq 1 $n); do for b in old new; do echo "-- $b"; KVFERRY_LOG_LEVEL=warn /tmp/kvf-$b bench engine "$@" | grep -E "^ *(shm|local|cma) "; done; done
