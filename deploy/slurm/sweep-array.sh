#!/bin/bash
# A kvtwin sweep on Slurm: a job array whose task I of N runs shard I/N of the sweep and
# writes part-I.jsonl to a shared file system. A requeued task resumes its part:
# `kvtwin sweep` keeps the finished runs in the file and runs only the rest.
#
# Placeholders to replace (nothing here names a real cluster):
#   /path/to/kvtwin       a checkout with the release binary built
#                         (cargo build --release -p kvtwin-tui) and scenarios/
#   /path/to/shared/sweeps  a directory every node sees
#   the partition, and the sweep itself (scenario, --grid flags, --seeds)
#
# N (the number of shards) is the array's size: --array=0-(N-1) below and SHARDS.
#
# Submit, then merge once every task has succeeded (the merge refuses parts of
# different sweeps and names missing runs):
#   array=$(sbatch --parsable deploy/slurm/sweep-array.sh)
#   sbatch --dependency=afterok:$array --wrap \
#     "/path/to/kvtwin/target/release/kvtwin sweep merge \
#      /path/to/shared/sweeps/my-sweep/part-*.jsonl \
#      --out /path/to/shared/sweeps/my-sweep/sweep.jsonl"
#
#SBATCH --job-name=kvtwin-sweep
#SBATCH --array=0-7
#SBATCH --cpus-per-task=4
#SBATCH --mem=4G
#SBATCH --time=04:00:00
#SBATCH --requeue
#SBATCH --partition=PARTITION
#SBATCH --output=kvtwin-sweep-%A_%a.log

set -euo pipefail

SHARDS=8                                  # keep equal to the array's size
KVTWIN=/path/to/kvtwin                    # placeholder
OUT=/path/to/shared/sweeps/my-sweep       # placeholder
mkdir -p "$OUT"
cd "$KVTWIN"

exec target/release/kvtwin sweep scenarios/default.ron \
  --grid cluster.workers=1,2,4,8 \
  --grid worker.tiers.0.capacity_blocks=2000,4000 \
  --seeds 3 \
  --jobs "$SLURM_CPUS_PER_TASK" \
  --shard "$SLURM_ARRAY_TASK_ID/$SHARDS" \
  --out "$OUT/part-$SLURM_ARRAY_TASK_ID.jsonl"
