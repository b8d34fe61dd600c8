#!/usr/bin/env bash
# Replays workload files through kvtwin's indexer and Dynamo's three (peer-bench), in
# alternation, ROUNDS times each, so that both sides see the same machine noise.
# Prints every JSON line; pipe into scripts/bench-router-table.py for medians and ratios.
# Each round also replays through no index (`--floor`): the method's own cost, which
# every implementation's figures include.
#
#   scripts/bench-router.sh ROUNDS FILE...
# Needs: target/release/kvtwin (cargo build --release) and a peer-bench binary in
# $PEER_BENCH (default target/peer-bench/release/peer-bench; see ../shared/peer-bench).
set -euo pipefail
rounds=${1:?rounds}; shift
kvtwin=target/release/kvtwin
peer=${PEER_BENCH:-target/peer-bench/release/peer-bench}
for file in "$@"; do
  for _ in $(seq "$rounds"); do
    "$kvtwin" bench router --workload "$file"
    "$kvtwin" bench router --workload "$file" --floor
    "$peer" router --workload "$file" --impl radix
    "$peer" router --workload "$file" --impl crtc --threads 1
    "$peer" router --workload "$file" --impl positional --threads 1
    "$kvtwin" bench router --workload "$file" --threads 2
    "$peer" router --workload "$file" --impl crtc --threads 2
    "$peer" router --workload "$file" --impl positional --threads 2
  done
done
