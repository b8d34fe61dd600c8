#!/usr/bin/env bash
# Runs kvtwin's fuzz targets (fuzz/targets, cargo-fuzz on the nightly toolchain) for SECONDS
# each, two at a time, from a seed corpus the project's own encoders write
# (fuzz/examples/seeds.rs, built by the main workspace: `cargo test` has already compiled
# it) into target/fuzz-corpus/ (grown by the runs, never committed).
# Prints one line per target (runs, execs/s, coverage, corpus) and fails on any crash,
# whose input cargo-fuzz leaves under fuzz/targets/artifacts/TARGET/.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]      (default: 30 s, every target)
#   scripts/fuzz.sh --build-only               (the build alone: CI builds ahead, in
#                                               the background)
#
# FUZZ_SANITIZER=address|none (default none: the decoders are safe Rust, so what the
# runs hunt is panics and broken round trips, and a build without ASan is minutes faster).
# FUZZ_BUILD=release|dev (default release: opt-level 1, the most inputs a second; dev is
# unoptimised: 580 against 972 CPU-seconds to build from nothing, but 20 to 90 times fewer
# inputs a second (http_route 152/s against 6,700-13,000), so for a quick local check of a
# target's wiring, not for finding bugs; CI builds release).
# Needs: rustup's nightly toolchain and cargo-fuzz (`cargo install cargo-fuzz --locked`).
set -euo pipefail
cd "$(dirname "$0")/.."

build_only=false
if [ "${1:-}" = "--build-only" ]; then
    build_only=true
    shift
fi
seconds=${1:-30}
shift || true
sanitizer=${FUZZ_SANITIZER:-none}
case "${FUZZ_BUILD:-release}" in
    release) build_flags=() ;;
    dev) build_flags=(--dev) ;;
    *) echo "fuzz.sh: FUZZ_BUILD must be release or dev, not ${FUZZ_BUILD}" >&2; exit 2 ;;
esac
fuzz_dir=fuzz/targets
corpus=target/fuzz-corpus
logs=target/fuzz-logs
mkdir -p "$corpus" "$logs"

if [ "$#" -gt 0 ]; then
    targets=("$@")
else
    mapfile -t targets < <(cargo +nightly fuzz list --fuzz-dir "$fuzz_dir")
fi

cargo +nightly fuzz build "${build_flags[@]}" --fuzz-dir "$fuzz_dir" --sanitizer "$sanitizer"
if "$build_only"; then
    exit 0
fi
# The seeds: built with the default toolchain (target/debug, which `cargo test` has
# built), written fresh (the corpus keeps what the runs found beside them). Not in
# --build-only: CI builds ahead while target/debug may still be building.
cargo run --quiet -p kvtwin-fuzz --example seeds -- "$corpus" . >/dev/null

run_one() {
    local target=$1
    # -max_total_time bounds the run; -rss_limit_mb and -max_len bound one input.
    if cargo +nightly fuzz run "${build_flags[@]}" --fuzz-dir "$fuzz_dir" --sanitizer "$sanitizer" "$target" "$corpus/$target" -- \
        -max_total_time="$seconds" -rss_limit_mb=2048 -max_len=65536 \
        -print_final_stats=1 >"$logs/$target.log" 2>&1; then
        local runs execs cov corp
        runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$logs/$target.log" | grep -o '[0-9]*$' || echo 0)
        execs=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$logs/$target.log" | grep -o '[0-9]*$' || echo 0)
        cov=$(grep -o 'cov: [0-9]*' "$logs/$target.log" | tail -1 | grep -o '[0-9]*' || echo 0)
        corp=$(find "$corpus/$target" -type f | wc -l)
        printf 'fuzz %-14s ok   %10s runs %8s execs/s  cov %6s  corpus %5s  (%s s)\n' \
            "$target" "$runs" "$execs" "$cov" "$corp" "$seconds"
    else
        printf 'fuzz %-14s FAILED: see %s and fuzz/targets/artifacts/%s/\n' "$target" "$logs/$target.log" "$target"
        tail -40 "$logs/$target.log"
        return 1
    fi
}

status=0
pids=()
for target in "${targets[@]}"; do
    run_one "$target" &
    pids+=($!)
    # Two at a time: one per core.
    if [ "${#pids[@]}" -ge 2 ]; then
        wait "${pids[0]}" || status=1
        pids=("${pids[@]:1}")
    fi
done
for pid in "${pids[@]}"; do
    wait "$pid" || status=1
done
exit "$status"
