#!/usr/bin/env python3
"""Fits kvtwin's roofline compute profiles to AIConfigurator's measured table
(sim/data/aiconfigurator-vllm.csv, written by scripts/aiconfigurator_grid.py), by least
squares on relative error over the table's `fit` rows, and prints the coefficients (as
the Rust of sim/src/compute/builtin.rs) and the residuals of every row, fitted and held
out (as the Markdown of BENCHMARKS.md).

The time of a pass is the one sim/src/compute/roofline.rs computes (keep the two the
same; `cargo test` checks the Rust against the same table):
    overhead (decode_overhead for a pass without prefill)
  + soft(2·params·tokens / (flops·e_gemm), weight_bytes / (hbm·e_weights))     GEMMs
  + soft(attention_flops·pairs / (flops·e_attention), kv_bytes / (hbm·e_kv))   attention
  + 2·layers·(latency + tokens·hidden·dtype·2(n−1)/n / (link·e_link))          TP all-reduce
with soft(a, m) = √(a² + m²) (a roofline softened near its ridge), flops and hbm the
sum over the n GPUs, `pairs` the (query, key) pairs attended and kv_bytes the KV cache
read. The fitted numbers are the e_* fractions, the two overheads and the all-reduce
latency; the datasheet figures stay as they are, so a new GPU or model still gets a
sensible default from its datasheet and default fractions.

Usage: target/venv-aic/bin/python scripts/fit_compute_profiles.py sim/data/aiconfigurator-vllm.csv
           [--plot DIR]
Needs numpy and scipy; --plot (one PNG a profile: prefill time by ISL, decode step time
by batch at each context, AIConfigurator's points against the fitted model) needs
matplotlib.
"""

import argparse
import csv
import os
import statistics

import numpy as np
from scipy.optimize import least_squares

# Datasheet figures, as in sim/src/compute/mod.rs.
GPUS = {
    "h100_sxm": dict(flops=989e12, hbm=3.35e12, link=450e9),
    "h200_sxm": dict(flops=989e12, hbm=4.8e12, link=450e9),
    "a100_sxm": dict(flops=312e12, hbm=2.039e12, link=300e9),
}
MODELS = {
    "meta-llama/Meta-Llama-3.1-8B": dict(layers=32, hidden=4096, heads=32, kv_heads=8,
                                         head_dim=128, params=8.03e9, dtype=2),
    "meta-llama/Meta-Llama-3.1-70B": dict(layers=80, hidden=8192, heads=64, kv_heads=8,
                                          head_dim=128, params=70.55e9, dtype=2),
}
NAMES = ["pass_overhead_us", "decode_overhead_us", "flops_efficiency", "hbm_efficiency",
         "attention_flops_efficiency", "kv_hbm_efficiency", "allreduce_latency_us",
         "link_efficiency"]
TP_ONLY = {"allreduce_latency_us": 0.0, "link_efficiency": 1.0}


def read(path):
    with open(path) as f:
        rows = [row for row in csv.DictReader(line for line in f if not line.startswith("#"))]
    for row in rows:
        for key in ("tp", "isl", "prefix", "batch", "context"):
            row[key] = int(row[key])
        row["ms"] = float(row["ms"])
    return rows


def work(row):
    """(prefills [(new, cached)], decodes, decode context) of a row's pass."""
    if row["phase"] == "prefill":
        return [(row["isl"] - row["prefix"], row["prefix"])] * row["batch"], 0, 0
    return [], row["batch"], row["batch"] * row["context"]


def pass_ms(p, gpu, model, n, prefills, decodes, context):
    overhead, decode_overhead, e_gemm, e_w, e_attn, e_kv, latency, e_link = p
    if not prefills:
        overhead = decode_overhead
    flops = gpu["flops"] * n
    hbm = gpu["hbm"] * n
    tokens = sum(t for t, _ in prefills) + decodes
    pairs = sum(t * c + t * t / 2 for t, c in prefills) + context
    kv_tokens = sum(t + c for t, c in prefills) + context
    kv_bytes_per_token = 2 * model["layers"] * model["kv_heads"] * model["head_dim"] * model["dtype"]
    attention_flops = 4 * model["layers"] * model["heads"] * model["head_dim"]
    gemm = np.hypot(2 * model["params"] * tokens / (flops * e_gemm),
                    model["params"] * model["dtype"] / (hbm * e_w))
    attention = np.hypot(attention_flops * pairs / (flops * e_attn),
                         kv_tokens * kv_bytes_per_token / (hbm * e_kv))
    comm = 0.0
    if n > 1:
        message = tokens * model["hidden"] * model["dtype"] * 2 * (n - 1) / n
        comm = 2 * model["layers"] * (latency * 1e-6 + message / (gpu["link"] * e_link))
    return (overhead * 1e-6 + gemm + attention + comm) * 1e3


def predict(p, rows):
    out = []
    for row in rows:
        gpu, model = GPUS[row["system"]], MODELS[row["model"]]
        out.append(pass_ms(p, gpu, model, row["tp"], *work(row)))
    return np.array(out)


def fit(rows):
    fitted = [r for r in rows if r["role"] == "fit"]
    actual = np.array([r["ms"] for r in fitted])
    tp = fitted[0]["tp"]
    start = [500.0, 500.0, 0.7, 0.8, 0.5, 0.8, 10.0, 0.7]
    lower = [0.0, 0.0, 0.01, 0.01, 0.01, 0.01, 0.0, 0.01]
    upper = [1e5, 1e5, 1.0, 1.0, 1.0, 1.0, 1e3, 1.0]
    free = [i for i, name in enumerate(NAMES) if tp > 1 or name not in TP_ONLY]

    def residuals(x):
        p = list(start)
        for i, value in zip(free, x):
            p[i] = value
        return predict(p, fitted) / actual - 1

    result = least_squares(residuals, [start[i] for i in free],
                           bounds=([lower[i] for i in free], [upper[i] for i in free]))
    p = list(start)
    for i, value in zip(free, result.x):
        p[i] = value
    for i, name in enumerate(NAMES):
        if i not in free:
            p[i] = TP_ONLY[name]
    return p


def rounded(p):
    """The coefficients as the Rust keeps them: three significant figures (an overhead
    that fits to nothing is 0)."""
    return [float(f"{value:.3g}") if value > 1e-3 else 0.0 for value in p]


def plot(directory, profile, rows, p):
    """PNG of one profile: AIConfigurator's points (filled: fitted, open: held out)
    against the fitted model's curves."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    gpu, model, tp = GPUS[rows[0]["system"]], MODELS[rows[0]["model"]], rows[0]["tp"]
    figure, (left, right) = plt.subplots(1, 2, figsize=(13, 5))
    prompts = sorted((r for r in rows if r["phase"] == "prefill" and r["batch"] == 1
                      and r["prefix"] == 0), key=lambda r: r["isl"])
    isls = np.geomspace(prompts[0]["isl"], prompts[-1]["isl"], 200)
    left.plot(isls, [pass_ms(p, gpu, model, tp, [(int(t), 0)], 0, 0) for t in isls],
              color="C0", label="kvtwin (fitted roofline)")
    for role, face in (("fit", "C1"), ("holdout", "none")):
        chosen = [r for r in prompts if r["role"] == role]
        left.scatter([r["isl"] for r in chosen], [r["ms"] for r in chosen], s=30,
                     facecolors=face, edgecolors="C1", zorder=3,
                     label=f"AIConfigurator ({role})")
    left.set(xscale="log", yscale="log", xlabel="prompt tokens (batch 1)",
             ylabel="prefill ms (TTFT)", title=f"{profile}: prefill")
    left.grid(True, which="both", alpha=0.3)
    left.legend()
    steps = [r for r in rows if r["phase"] == "decode"]
    for i, context in enumerate(sorted({r["context"] for r in steps})):
        mine = sorted((r for r in steps if r["context"] == context), key=lambda r: r["batch"])
        batches = np.unique(np.round(np.geomspace(mine[0]["batch"], mine[-1]["batch"], 100)))
        color = f"C{i % 10}"
        right.plot(batches, [pass_ms(p, gpu, model, tp, [], int(round(b)),
                                     int(round(b)) * context) for b in batches],
                   color=color, label=f"context {context}")
        for role, face in (("fit", color), ("holdout", "none")):
            chosen = [r for r in mine if r["role"] == role]
            right.scatter([r["batch"] for r in chosen], [r["ms"] for r in chosen], s=25,
                          facecolors=face, edgecolors=color, zorder=3)
    right.set(xscale="log", xlabel="decode batch", ylabel="decode step ms (TPOT)",
              title=f"{profile}: decode (lines kvtwin, dots AIConfigurator)")
    right.grid(True, which="both", alpha=0.3)
    right.legend(fontsize=8)
    figure.tight_layout()
    path = os.path.join(directory, f"{profile}.png")
    figure.savefig(path, dpi=90)
    plt.close(figure)
    return path


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("table", help="sim/data/aiconfigurator-vllm.csv")
    parser.add_argument("--plot", metavar="DIR", help="write one PNG a profile here")
    args = parser.parse_args()
    rows = read(args.table)
    profiles = list(dict.fromkeys(row["profile"] for row in rows))
    summary = []
    print("// Fitted coefficients (paste into sim/src/compute/builtin.rs):")
    for profile in profiles:
        mine = [r for r in rows if r["profile"] == profile]
        p = rounded(fit(mine))
        print(f"// {profile}: " + ", ".join(f"{n}: {v}" for n, v in zip(NAMES, p)))
        errors = predict(p, mine) / np.array([r["ms"] for r in mine]) - 1
        for role in ("fit", "holdout"):
            for phase in ("prefill", "decode"):
                chosen = [abs(e) * 100 for e, r in zip(errors, mine)
                          if r["role"] == role and r["phase"] == phase]
                if chosen:
                    summary.append((profile, role, phase, len(chosen),
                                    statistics.median(chosen), max(chosen)))
        if args.plot:
            os.makedirs(args.plot, exist_ok=True)
            print(f"// plot: {plot(args.plot, profile, mine, p)}")
        worst = sorted(zip(errors, mine), key=lambda pair: -abs(pair[0]))[:3]
        for error, row in worst:
            print(f"//   worst: {row['phase']} {row['role']} isl={row['isl']} "
                  f"prefix={row['prefix']} batch={row['batch']} context={row['context']}: "
                  f"{error * 100:+.1f} %")
    print()
    print("| profile | rows | phase | points | median abs error | max abs error |")
    print("|---|---|---|---:|---:|---:|")
    for profile, role, phase, count, median, worst in summary:
        print(f"| {profile} | {role} | {phase} | {count} | {median:.1f} % | {worst:.1f} % |")


if __name__ == "__main__":
    main()
