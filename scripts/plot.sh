#!/usr/bin/env bash
# Turns scripts/bench.sh's JSON (bench-results/*.json) into PNG charts with gnuplot:
#   engine-gbps.png     engine GB/s vs block size, per transport and thread count (with the
#                       memcpy reference the ratios are against)
#   engine-ratio.png    engine time vs the same-run memcpy reference, per transport
#   kv-latency.png      one request's KV transfer, p50 latency vs context length, per
#                       strategy and transport
#   tcp-vs-socket.png   the tcp transport vs a plain TCP stream of the same bytes and
#                       iperf3 in the same turns, WRITE and READ
#   scale-AXIS.png      `bench scale`: one chart per axis (peers, regions, descriptors,
#                       inflight, pd), two panels each, x on a log scale
# Usage: scripts/plot.sh [RESULTS_DIR (bench-results)] [OUT_DIR (docs/img)]
# Needs gnuplot (gnuplot-nox) and jq; charts whose JSON is missing are skipped with a note.
set -euo pipefail
cd "$(dirname "$0")/.."
results=${1:-bench-results}
out=${2:-docs/img}
mkdir -p "$out"
data=$(mktemp -d)
trap 'rm -rf "$data"' EXIT

common='set terminal pngcairo size 900,560 font "DejaVu Sans,11" noenhanced
set grid
set key outside right top
set logscale x 2
set format x "%.0b %BB"
set style data linespoints'

# series FILTER JSON NAME: one data file per series title under $data/NAME/ (rows "x y",
# sorted by x), from a jq filter producing {title, x, y} objects; prints a gnuplot `plot`
# command over them.
series() {
  local dir="$data/$3" i=0 cmd="plot"
  mkdir -p "$dir"
  while IFS= read -r title; do
    jq -r --arg t "$title" "[$1] | map(select(.title == \$t)) | sort_by(.x)[] | \"\(.x) \(.y)\"" \
      "$2" > "$dir/$i"
    cmd+="$([ $i -gt 0 ] && echo ,) '$dir/$i' using 1:2 title \"$title\" lw 2"
    i=$((i + 1))
  done < <(jq -r "[$1] | map(.title) | unique[]" "$2")
  echo "$cmd"
}

# Per transport, op (write, read), thread count and block size, the row with the most ops per
# batch (the largest batch that fit the benchmark's buffer at that block size).
best='def best: group_by([.transport, .op, .threads, .block_bytes]) | map(max_by(.ops_per_batch)) | .[];'

if [ -f "$results/engine.json" ]; then
  plot=$(series "$best (best | {title: \"\(.transport) \(.threads) thr\", x: .block_bytes, y: .gbps}), (best | select(.transport == \"local\") | {title: \"memcpy \(.threads) thr\", x: .block_bytes, y: .ref_gbps})" \
    "$results/engine.json" gbps)
  gnuplot <<GP
$common
set output "$out/engine-gbps.png"
set title "Engine throughput vs block size (largest batch per block size, up to 1024 ops)"
set logscale y 10
set xlabel "block size"
set ylabel "GB/s"
$plot
GP
  plot=$(series "$best best | {title: \"\(.transport) \(.threads) thr\", x: .block_bytes, y: .ratio}" \
    "$results/engine.json" ratio)
  gnuplot <<GP
$common
set output "$out/engine-ratio.png"
set title "Engine GB/s / same-run memcpy GB/s (same blocks, same threads)"
set xlabel "block size"
set ylabel "ratio (1 = memcpy speed)"
set yrange [0:*]
$plot
GP
  echo "plot: $out/engine-gbps.png $out/engine-ratio.png"
else
  echo "plot: no $results/engine.json, engine charts skipped" >&2
fi

if [ -f "$results/kv.json" ]; then
  # One panel per transport at the run's largest thread count: each strategy and the memcpy
  # of the same blocks.
  threads=$(jq '[.[] | select(.kind == "kv") | .threads] | max' "$results/kv.json")
  preset=$(jq -r '[.[] | select(.kind == "kv")][0].preset' "$results/kv.json")
  panels=""
  for transport in $(jq -r '[.[] | select(.kind == "kv") | .transport] | unique[]' "$results/kv.json"); do
    rows=".[] | select(.kind == \"kv\" and .transport == \"$transport\" and .threads == $threads)"
    plot=$(series "($rows | {title: .strategy, x: .tokens, y: .p50_us}), ($rows | select(.strategy == \"all_layers\") | {title: \"memcpy\", x: .tokens, y: .memcpy_p50_us})" \
      "$results/kv.json" "kv-$transport")
    panels+="set title \"$transport, $threads threads\"
$plot
"
  done
  gnuplot <<GP
$common
set terminal pngcairo size 1100,520 font "DejaVu Sans,11" noenhanced
set output "$out/kv-latency.png"
set key inside left top
set format x "%.0f"
set logscale y 10
set xlabel "tokens"
set ylabel "p50 latency (us)"
set multiplot layout 1,2 title "One request's KV transfer ($preset, random pages): p50 per strategy vs context length"
$panels
unset multiplot
GP
  echo "plot: $out/kv-latency.png"
else
  echo "plot: no $results/kv.json, KV chart skipped" >&2
fi

if [ -f "$results/engine-tcp.json" ]; then
  plot=$(series "$best (best | {title: \"tcp \(.op) \(.threads) thr\", x: .block_bytes, y: .gbps}), (best | {title: \"plain TCP stream, \(.op)\", x: .block_bytes, y: .ref_gbps}), (best | select(.op == \"write\" and .iperf3_gbps > 0) | {title: \"iperf3 (write turns)\", x: .block_bytes, y: .iperf3_gbps})" \
    "$results/engine-tcp.json" tcp)
  gnuplot <<GP
$common
set output "$out/tcp-vs-socket.png"
set title "tcp vs a plain TCP stream and iperf3, 128 ops per batch, loopback"
set xlabel "block size"
set ylabel "GB/s"
set yrange [0:*]
$plot
GP
  echo "plot: $out/tcp-vs-socket.png"
else
  echo "plot: no $results/engine-tcp.json, tcp chart skipped" >&2
fi

if [ -f "$results/scale.json" ]; then
  # One chart per axis of `bench scale`, x on a log scale, two panels each: (left, right) =
  # (what grows with x, what should not). A series is "metric" or "metric (series)".
  scale_panel() {  # AXIS TITLE YLABEL LOGY METRIC...
    local axis=$1 title=$2 ylabel=$3 logy=$4 filter="" m
    shift 4
    for m in "$@"; do
      filter+="${filter:+, }(.[] | select(.axis == \"$axis\") | {title: (\"$m\" + (if .series == \"\" then \"\" else \" (\" + .series + \")\" end)), x: .x, y: .$m})"
    done
    echo "set title \"$title\""
    echo "set ylabel \"$ylabel\""
    if [ "$logy" = log ]; then echo "set logscale y 10"; else echo "unset logscale y; set yrange [0:*]"; fi
    series "$filter" "$results/scale.json" "scale-$axis-$(echo "$title" | tr -c 'a-z0-9' '-')"
  }
  scale_chart() {  # AXIS XLABEL PANEL1 PANEL2 (each a scale_panel output)
    gnuplot <<GP
$common
set terminal pngcairo size 1200,480 font "DejaVu Sans,11" noenhanced
set output "$out/scale-$1.png"
set logscale x 10
set format x "%.0f"
set key inside left top
set xlabel "$2"
set multiplot layout 1,2 title "bench scale: $1"
$3
$4
unset multiplot
GP
    echo "plot: $out/scale-$1.png"
  }
  has_axis() { jq -e --arg a "$1" 'any(.[]; .axis == $a)' "$results/scale.json" >/dev/null; }
  if has_axis peers; then
    scale_chart peers "tcp peers of one engine" \
      "$(scale_panel peers "threads of the process (idle engine, after the writes)" "count" log threads threads_idle)" \
      "$(scale_panel peers "64 KiB write, round-robin over the peers" "us" log p50_us p99_us plain_p50_us first_write_us_p50 open_us_p50)"
  fi
  if has_axis regions; then
    scale_chart regions "regions registered" \
      "$(scale_panel regions "registration" "us per region" log register_us_per_region unregister_us_per_region)" \
      "$(scale_panel regions "a 64-byte local write, and a peer's handshake" "us" log submit_us_p50 submit_wait_us_p50 handshake_us_p50)"
  fi
  if has_axis descriptors; then
    scale_chart descriptors "64-byte ops in one batch" \
      "$(scale_panel descriptors "submit + completion" "ns per op" log total_ns_per_op)" \
      "$(scale_panel descriptors "the engine's part (less the same copies as a plain loop)" "ns per op" log engine_ns_per_op)"
  fi
  if has_axis inflight; then
    scale_chart inflight "one-op 4 KiB batches in flight" \
      "$(scale_panel inflight "submit + completion" "us per batch" log total_us_per_batch)" \
      "$(scale_panel inflight "batches per second" "batches/s" log batches_per_s)"
  fi
  if has_axis pd; then
    scale_chart pd "one-page PD requests in flight" \
      "$(scale_panel pd "requests per second" "requests/s" log requests_per_s)" \
      "$(scale_panel pd "wave time / N, and one engine transfer of the page" "us" log us_per_request engine_us_p50 overhead_us)"
  fi
else
  echo "plot: no $results/scale.json, scale charts skipped" >&2
fi
