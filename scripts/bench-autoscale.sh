#!/usr/bin/env bash
# Static clusters against each built-in planner on scenarios/autoscale-diurnal.ron (a day
# of diurnal traffic on a disaggregated 70B cluster): GPU-hours, SLO attainment, minutes
# in violation, direction flips, cold starts, caches lost, and the hit ratio lost against
# the static cluster sized for the peak; plus each run's wall time (one core: the
# simulator is single-threaded). Runs one after another; keep the machine quiet.
#
#   scripts/bench-autoscale.sh [OUT_DIR]      (default target/bench-autoscale)
# Needs: target/release/kvtwin (cargo build --release) and python3 for the table.
set -euo pipefail
out=${1:-target/bench-autoscale}
kvtwin=target/release/kvtwin
scenario=scenarios/autoscale-diurnal.ron
mkdir -p "$out"
run() {
  local name=$1; shift
  local start end
  start=$(date +%s%N)
  "$kvtwin" run "$scenario" --json "$out/$name.json" "$@" > "$out/$name.txt" 2> "$out/$name.err"
  end=$(date +%s%N)
  echo "$name $(( (end - start) / 1000000 ))" >> "$out/wall.txt"
}
: > "$out/wall.txt"
static() { echo "--set cluster.workers=$(($1 + $2)) --set cluster.disaggregation.prefill_workers=$1 --set autoscale.planner=Static"; }
# shellcheck disable=SC2046
run static-3+5 $(static 3 5)
# shellcheck disable=SC2046
run static-2+3 $(static 2 3)
run throughput-constant
run throughput-constant-hysteresis --set 'autoscale.hysteresis={"headroom":0.2,"down_intervals":3}'
run throughput-moving-average --set 'autoscale.planner={"Throughput":{"predictor":{"MovingAverage":{"window":5}},"capacity":{"Profiled":{"correction":true}}}}'
run throughput-holt --set 'autoscale.planner={"Throughput":{"predictor":{"HoltWinters":{"alpha":0.5,"beta":0.2,"gamma":0.0,"season":0}},"capacity":{"Profiled":{"correction":true}}}}'
run throughput-no-correction --set 'autoscale.planner={"Throughput":{"predictor":"Constant","capacity":{"Profiled":{"correction":false}}}}'
run load-5s --set 'autoscale.planner={"Load":{"queue_up":2.0,"queue_down":0.25,"kv_up":0.7,"kv_down":0.2}}' --set autoscale.interval_s=5
run load-5s-hysteresis --set 'autoscale.planner={"Load":{"queue_up":2.0,"queue_down":0.25,"kv_up":0.7,"kv_down":0.2}}' --set autoscale.interval_s=5 \
  --set 'autoscale.hysteresis={"headroom":0.2,"down_intervals":36}'
python3 - "$out" <<'PY'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
wall = dict(line.split() for line in (out / "wall.txt").read_text().splitlines())
rows = []
for name in wall:
    r = json.loads((out / f"{name}.json").read_text())
    a = r["autoscale"]
    rows.append((name, r, a))
peak = next(r for name, r, _ in rows if name == "static-3+5")["hit_ratio"]
print("| run | GPU-hours | SLO attainment | TTFT / ITL attainment | minutes in violation "
      "| scale-ups / downs | flips | cold starts | cached blocks lost | hit ratio | lost vs static-3+5 "
      "| peak prefill / decode | wall s |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for name, r, a in rows:
    print(f"| {name} | {a['gpu_hours']:.1f} | {100*a['slo_attainment']:.2f} % "
          f"| {100*a['ttft_attainment']:.2f} / {100*a['itl_attainment']:.2f} % "
          f"| {a['minutes_in_violation']:.0f} | {a['scale_ups']} / {a['scale_downs']} "
          f"| {a['direction_flips']} | {a['cold_starts']} | {a['cached_blocks_lost']} "
          f"| {r['hit_ratio']:.4f} | {peak - r['hit_ratio']:+.4f} "
          f"| {a['peak_replicas'][0]} / {a['peak_replicas'][1]} | {int(wall[name]) / 1000:.1f} |")
PY
