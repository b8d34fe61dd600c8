#!/usr/bin/env python3
"""Loads the tables `kvtwin profile --out DIR` wrote the way NVIDIA Dynamo's SLA planner
loads them, and prints what it sees.

The planner (ai-dynamo/dynamo, components/planner/src/dynamo/planner/utils/
perf_interpolation.py, later components/src/dynamo/planner/core/throughput/
interpolation.py) opens DIR/selected_prefill_interpolation/raw_data.npz and
DIR/selected_decode_interpolation/raw_data.npz with np.load, reads the arrays by key
(max_kv_tokens as element [0] of its array), and falls back to DIR/prefill_raw_data.json
and DIR/decode_raw_data.json. This script does the same reads with numpy, checks shapes
and dtypes, and, when scipy is installed, interpolates as the planner does (cubic in ISL;
cubic over the (KV usage, context) scatter, nearest where that is undefined) at a few
points. Needs numpy; not part of `cargo test`.

Usage: scripts/check_planner_profile.py DIR
"""

import json
import sys

import numpy as np

PREFILL_KEYS = ["prefill_isl", "prefill_ttft", "prefill_thpt_per_gpu"]
DECODE_KEYS = ["x_kv_usage", "y_context_length", "z_itl", "z_thpt_per_gpu"]


def describe(name, array):
    print(f"  {name:22} dtype={array.dtype.str} shape={array.shape} "
          f"first={array.flat[0]!r} last={array.flat[-1]!r}")


def main(directory):
    failures = []

    print(f"{directory}/selected_prefill_interpolation/raw_data.npz")
    with np.load(f"{directory}/selected_prefill_interpolation/raw_data.npz") as raw:
        print(f"  keys: {sorted(raw.files)}")
        prefill = {key: raw[key] for key in PREFILL_KEYS}
    for key in PREFILL_KEYS:
        describe(key, prefill[key])
        if prefill[key].ndim != 1 or len(prefill[key]) != len(prefill["prefill_isl"]):
            failures.append(f"prefill {key}: not 1-D of the ISLs' length")

    print(f"{directory}/selected_decode_interpolation/raw_data.npz")
    with np.load(f"{directory}/selected_decode_interpolation/raw_data.npz") as raw:
        print(f"  keys: {sorted(raw.files)}")
        decode = {key: raw[key] for key in DECODE_KEYS}
        describe("max_kv_tokens", raw["max_kv_tokens"])
        max_kv_tokens = raw["max_kv_tokens"][0]
    print(f"  max_kv_tokens[0] = {max_kv_tokens!r}")
    for key in DECODE_KEYS:
        describe(key, decode[key])
        if decode[key].ndim != 1 or len(decode[key]) != len(decode["x_kv_usage"]):
            failures.append(f"decode {key}: not 1-D of x_kv_usage's length")

    before = len(failures)
    for name, keys, arrays in [("prefill", PREFILL_KEYS, prefill), ("decode", DECODE_KEYS, decode)]:
        with open(f"{directory}/{name}_raw_data.json") as f:
            data = json.load(f)
        for key in keys:
            if not np.array_equal(np.array(data[key]), arrays[key]):
                failures.append(f"{name}_raw_data.json {key}: differs from the npz")
        if name == "decode" and int(data["max_kv_tokens"]) != max_kv_tokens:
            failures.append("decode_raw_data.json max_kv_tokens: differs from the npz")
    if len(failures) == before:
        print("JSON fallback files: the same arrays as the npz files")

    try:
        import scipy.interpolate
    except ImportError:
        print("scipy not installed: interpolation skipped")
    else:
        isl = prefill["prefill_isl"]
        ttft = scipy.interpolate.interp1d(isl, prefill["prefill_ttft"], kind="cubic")
        middle = float((isl[0] + isl[-1]) / 2)
        print(f"planner-style prefill: TTFT at ISL {middle:.0f} = {float(ttft(middle)):.2f} ms")
        points = (decode["x_kv_usage"], decode["y_context_length"])
        for usage, context in [(0.3, 2048.0), (0.7, 4096.0)]:
            itl = scipy.interpolate.griddata(points, decode["z_itl"], [(usage, context)], method="cubic")[0]
            if np.isnan(itl):
                itl = scipy.interpolate.griddata(points, decode["z_itl"], [(usage, context)], method="nearest")[0]
            print(f"planner-style decode: ITL at usage {usage}, context {context:.0f} = {itl:.2f} ms")

    if failures:
        for failure in failures:
            print(f"FAIL: {failure}")
        return 1
    print("OK: the planner's reads succeed, every array is 1-D and of equal length per table")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1]))
