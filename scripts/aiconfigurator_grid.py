#!/usr/bin/env python3
"""Asks NVIDIA's AIConfigurator (PyPI `aiconfigurator`, SILICON database mode, vLLM
backend) for prefill and decode step times over a grid, for every GPU and model pair
kvtwin has a built-in roofline profile for, and writes them as one CSV table.

The table is what kvtwin's compute profiles are fitted to (scripts/fit_compute_profiles.py)
and what `cargo test` checks `kvtwin estimate` against (sim/data/aiconfigurator-vllm.csv),
so the Rust build and its tests never need Python.

Rows:
- phase `prefill`: one static_ctx pass of `batch` prompts of `isl` tokens, `prefix` of
  them already cached; `ms` is AIConfigurator's TTFT.
- phase `decode`: one static_gen step of `batch` sequences holding `context` tokens each;
  `ms` is AIConfigurator's TPOT (osl 2: the step right after the prompt).
- role `fit` rows are the grid the fit uses; `holdout` rows lie between them (other ISLs,
  batches and contexts) and only check the fit.
Points AIConfigurator says run out of GPU memory are left out.

Install the tool in a venv under target/ (never a dependency of the Rust build):
    python3 -m venv target/venv-aic
    target/venv-aic/bin/pip install aiconfigurator==0.12.0 scipy
    target/venv-aic/bin/python scripts/aiconfigurator_grid.py sim/data/aiconfigurator-vllm.csv
About 5 minutes on two cores.
"""

import argparse
import contextlib
import datetime
import io
import logging
import sys

# kvtwin's built-in profile -> AIConfigurator's system, model and tensor parallelism.
PROFILES = [
    ("h100-llama3-8b", "h100_sxm", "meta-llama/Meta-Llama-3.1-8B", 1),
    ("h100x4-llama3-70b", "h100_sxm", "meta-llama/Meta-Llama-3.1-70B", 4),
    ("h200-llama3-8b", "h200_sxm", "meta-llama/Meta-Llama-3.1-8B", 1),
    ("h200x2-llama3-70b", "h200_sxm", "meta-llama/Meta-Llama-3.1-70B", 2),
    ("a100-llama3-8b", "a100_sxm", "meta-llama/Meta-Llama-3.1-8B", 1),
    ("a100x8-llama3-70b", "a100_sxm", "meta-llama/Meta-Llama-3.1-70B", 8),
]

FIT_ISL = [128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768]
HOLDOUT_ISL = [192, 384, 768, 1536, 3072, 6144, 12288, 24576]
# Batched prompts: (isl, batch, role).
PREFILL_BATCHES = [
    (256, 4, "fit"), (1024, 4, "fit"), (4096, 4, "fit"),
    (512, 2, "holdout"), (2048, 2, "holdout"), (768, 8, "holdout"),
]
# Prompts after a cached prefix: (isl, prefix, role).
PREFILL_PREFIXES = [
    (4096, 2048, "fit"), (16384, 8192, "fit"), (8192, 6144, "fit"),
    (8192, 4096, "holdout"), (3072, 1024, "holdout"),
]
# Decode: the fitted batches and contexts span the KV that fits (up to about 34 GB for
# Llama-3-8B on an 80 GB GPU: 512 × 512, 16 × 16,384 tokens); the held-out ones lie
# between them.
FIT_BATCH = [1, 4, 16, 64, 256, 512]
HOLDOUT_BATCH = [2, 8, 32, 128]
FIT_CONTEXT = [512, 2048, 8192, 16384]
HOLDOUT_CONTEXT = [1024, 4096, 12288]


def grid():
    """(phase, role, isl, prefix, batch, context) for every point asked."""
    points = []
    for isl in FIT_ISL:
        points.append(("prefill", "fit", isl, 0, 1, 0))
    for isl in HOLDOUT_ISL:
        points.append(("prefill", "holdout", isl, 0, 1, 0))
    for isl, batch, role in PREFILL_BATCHES:
        points.append(("prefill", role, isl, 0, batch, 0))
    for isl, prefix, role in PREFILL_PREFIXES:
        points.append(("prefill", role, isl, prefix, 1, 0))
    for batch in FIT_BATCH + HOLDOUT_BATCH:
        for context in FIT_CONTEXT + HOLDOUT_CONTEXT:
            fitted = batch in FIT_BATCH and context in FIT_CONTEXT
            points.append(("decode", "fit" if fitted else "holdout", 0, 0, batch, context))
    return points


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="the CSV to write")
    parser.add_argument("--profile", action="append", help="only these kvtwin profiles")
    args = parser.parse_args()

    logging.disable(logging.WARNING)
    import aiconfigurator
    from aiconfigurator.cli.api import cli_estimate

    version = getattr(aiconfigurator, "__version__", None)
    if version is None:
        from importlib.metadata import version as package_version
        version = package_version("aiconfigurator")
    rows = []
    skipped = 0
    for profile, system, model, tp in PROFILES:
        if args.profile and profile not in args.profile:
            continue
        for phase, role, isl, prefix, batch, context in grid():
            if phase == "prefill":
                kwargs = dict(mode="static_ctx", isl=isl, osl=1, prefix=prefix)
            else:
                kwargs = dict(mode="static_gen", isl=context, osl=2)
            # AIConfigurator logs through print as well as logging: keep stdout for us.
            with contextlib.redirect_stdout(io.StringIO()):
                result = cli_estimate(model, system, backend_name="vllm", batch_size=batch,
                                      tp_size=tp, database_mode="SILICON", **kwargs)
            if result.kv_cache_warning:
                skipped += 1
                continue
            ms = result.ttft if phase == "prefill" else result.tpot
            rows.append((profile, system, model, tp, result.backend_version, phase, role,
                         isl, prefix, batch, context, ms))
            print(f"{profile} {phase} {role} isl={isl} prefix={prefix} batch={batch} "
                  f"context={context}: {ms:.3f} ms", file=sys.stderr)
    with open(args.out, "w") as out:
        out.write(f"# AIConfigurator {version}, database mode SILICON, backend vllm "
                  f"(database version per row), queried "
                  f"{datetime.date.today().isoformat()} by scripts/aiconfigurator_grid.py "
                  f"({skipped} points out of GPU memory left out).\n")
        out.write("# prefill: cli estimate --estimate-mode static_ctx --isl ISL --osl 1 "
                  "--prefix PREFIX --batch-size BATCH; ms is TTFT.\n")
        out.write("# decode: cli estimate --estimate-mode static_gen --isl CONTEXT --osl 2 "
                  "--batch-size BATCH; ms is TPOT.\n")
        out.write("profile,system,model,tp,backend_version,phase,role,isl,prefix,batch,"
                  "context,ms\n")
        for row in rows:
            *head, ms = row
            out.write(",".join(str(value) for value in head) + f",{ms:.4f}\n")
    print(f"wrote {len(rows)} rows to {args.out} ({skipped} out of memory)", file=sys.stderr)


if __name__ == "__main__":
    main()
