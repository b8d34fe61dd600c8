#!/usr/bin/env python3
"""Times `kvtwin bench sim` against DynoSim (PyPI `ai-dynamo-runtime`, whose trace replay
runs the AISimulate mocker) on the same trace and cluster, in turns, and prints the ratio.

The cluster is `kvtwin bench sim`'s default: 16 workers, KV routing, 1,000 device and
4,000 host blocks of 512 tokens (Llama-3-8B's 128 KiB of KV per token), generated blocks
cached. DynoSim gets the same: `num_gpu_blocks` 1000, `block_size` 512, its native host
offload with 4,000 blocks, `kv_router` over 16 workers, offline replay.

Each side runs as its own process, alternating, `--rounds` times; the figures are user +
system CPU seconds of that process (what a machine shared with other work measures
best) and wall seconds, as medians with the range. The ratio is DynoSim's median over
kvtwin's, CPU and wall.

Install the peer in a venv under target/ (never a dependency of the Rust build):
    python3 -m venv target/venv-dynosim
    target/venv-dynosim/bin/pip install ai-dynamo-runtime==1.6.1
    cargo build --release -p kvtwin-tui
    python3 scripts/bench_sim_peer.py --trace ../shared/data/mooncake/conversation_trace.jsonl
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

# Run inside the venv's interpreter by the `--peer-once` branch below.
PEER_ENGINE = {
    "engine": {
        "block_size": 512,
        "num_gpu_blocks": 1000,
        "kv_cache_bytes_per_token": 128 * 1024,
        "native_host_offload": {"num_host_blocks": 4000},
    }
}


def peer_once(trace: str, workers: int) -> None:
    """One DynoSim replay in this process; prints one JSON line of what it reported."""
    from dynamo._core import KvRouterConfig, run_mocker_trace_replay

    result = run_mocker_trace_replay(
        [trace],
        extra_engine_args=PEER_ENGINE,
        num_workers=workers,
        router_mode="kv_router",
        router_config=KvRouterConfig(),
        trace_block_size=512,
    )
    summary = result.summary
    keys = ["completed_requests", "num_requests", "median_ttft_ms", "p99_ttft_ms", "mean_ttft_ms"]
    print(json.dumps({k: summary.get(k) for k in keys}))


def timed(command: list[str]) -> tuple[float, float, str]:
    """(CPU seconds, wall seconds, stdout) of one child process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall, done.stdout


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", required=True)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--kvtwin", default="target/release/kvtwin")
    parser.add_argument("--peer-python", default="target/venv-dynosim/bin/python")
    parser.add_argument("--peer-once", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.peer_once:
        peer_once(args.trace, args.workers)
        return 0
    for path, what in [(args.kvtwin, "kvtwin (cargo build --release -p kvtwin-tui)"),
                       (args.peer_python, "the peer's venv (see this script's docstring)")]:
        if not os.path.exists(path):
            print(f"{path} is missing: build {what} first", file=sys.stderr)
            return 2
    ours_cmd = [args.kvtwin, "bench", "sim", "--trace", args.trace,
                "--workers", str(args.workers)]
    peer_cmd = [args.peer_python, os.path.abspath(__file__), "--peer-once",
                "--trace", args.trace, "--workers", str(args.workers)]
    ours, peer = {"cpu": [], "wall": []}, {"cpu": [], "wall": []}
    for round_ in range(args.rounds):
        for name, command, into in [("kvtwin", ours_cmd, ours), ("DynoSim", peer_cmd, peer)]:
            cpu, wall, out = timed(command)
            into["cpu"].append(cpu)
            into["wall"].append(wall)
            line = out.strip().splitlines()[-1]
            print(f"round {round_ + 1} {name}: {cpu:.2f} s CPU, {wall:.2f} s wall: {line[:160]}",
                  file=sys.stderr)
    print("| | CPU s, median (range) | wall s, median (range) |")
    print("|---|---|---|")
    print(f"| kvtwin bench sim | {spread(ours['cpu'])} | {spread(ours['wall'])} |")
    print(f"| DynoSim (ai-dynamo-runtime trace replay) | {spread(peer['cpu'])} | {spread(peer['wall'])} |")
    cpu_ratio = statistics.median(peer["cpu"]) / statistics.median(ours["cpu"])
    wall_ratio = statistics.median(peer["wall"]) / statistics.median(ours["wall"])
    print(f"| ratio (DynoSim / kvtwin) | {cpu_ratio:.1f}x | {wall_ratio:.1f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
