#!/usr/bin/env python3
"""Medians (min-max) per workload and implementation from scripts/bench-router.sh output
on stdin, and kvtwin's ratios against Dynamo's best in the same run."""
import json
import statistics
import sys
from collections import defaultdict

runs = defaultdict(list)
for line in sys.stdin:
    line = line.strip()
    if line.startswith("{"):
        d = json.loads(line)
        runs[(d["workload"], d["impl"], d["threads"])].append(d)

FIELDS = ["blocks_per_s", "match_per_s", "match_p50_us", "match_p99_us"]


def med(rows, field):
    return statistics.median(r[field] for r in rows)


for workload in sorted({k[0] for k in runs}):
    print(f"\n### {workload}\n")
    print("| impl | thr | runs | blocks/s (M) | match/s | p50 µs | p99 µs | bytes/entry | checksum |")
    print("|---|---|---|---|---|---|---|---|---|")
    keys = sorted(k for k in runs if k[0] == workload)
    for key in keys:
        rows = runs[key]
        cell = lambda f, scale=1.0, fmt="{:.2f}": "{} ({}–{})".format(
            fmt.format(med(rows, f) / scale),
            fmt.format(min(r[f] for r in rows) / scale),
            fmt.format(max(r[f] for r in rows) / scale))
        digests = {r["checksum"]["digest"] for r in rows}
        bpe = "{:.1f}".format(rows[0]["bytes_per_entry"]) if "bytes_per_entry" in rows[0] else "–"
        print(f"| {key[1]} | {key[2]} | {len(rows)} | {cell('blocks_per_s', 1e6)} | "
              f"{cell('match_per_s', 1.0, '{:,.0f}')} | {cell('match_p50_us')} | "
              f"{cell('match_p99_us')} | {bpe} | {', '.join(sorted(digests))} |")
    ours = [k for k in keys if k[1] == "kvtwin" and k[2] == 1]
    peers = [k for k in keys if k[1] not in ("kvtwin", "floor")]
    floor = [k for k in keys if k[1] == "floor"]
    if ours and peers:
        o = runs[ours[0]]
        radix = [k for k in peers if k[1] == "radix"]
        best_events = max(peers, key=lambda k: med(runs[k], "blocks_per_s"))
        best_match = max(med(runs[k], "match_per_s") for k in peers)
        best_p99 = min(med(runs[k], "match_p99_us") for k in peers)
        print()
        if radix:
            print(f"- events: {med(o, 'blocks_per_s') / med(runs[radix[0]], 'blocks_per_s'):.2f}× "
                  "RadixTree's blocks/s")
        print(f"- events: {med(o, 'blocks_per_s') / med(runs[best_events], 'blocks_per_s'):.2f}× "
              f"the best Dynamo blocks/s ({best_events[1]}, {best_events[2]} thread(s))")
        print(f"- matches: {med(o, 'match_per_s') / best_match:.2f}× the best Dynamo match/s")
        print(f"- p99: {med(o, 'match_p99_us') / best_p99:.2f}× the best Dynamo p99")
        if floor:
            f = runs[floor[0]]
            apply_ms = lambda rows: 1e3 * med(rows, "apply_s_total")
            print(f"- floor (the replay through no index): apply {apply_ms(f):.2f} ms of "
                  f"kvtwin's {apply_ms(o):.2f} ms; p99 {med(f, 'match_p99_us'):.2f} µs = "
                  f"{med(f, 'match_p99_us') / best_p99:.2f}× the best Dynamo p99")
