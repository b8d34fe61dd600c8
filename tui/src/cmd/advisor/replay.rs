//! `kvtwin advisor --replay EVENTS`: a recorded KV event stream (Dynamo's `RouterEvent`
//! JSON, one per line, as the engines' relays publish it on NATS and as `kvtwin advisor
//! --record` writes it) replayed through a shared tier of each size under each tiering
//! policy (`kvtwin_sim::advisor`): the blocks it would have served, how many of them
//! another worker had stored, and the bytes it would have read, written and dropped; a
//! table, `--json` lines, and with `--plot DIR` the hit ratio against the tier's size, a
//! line per policy.
//!
//! Owns: reading the stream (a line that is not an event is counted and named by file
//! and line, and the rest kept), the table and the chart. Never: the policies or the
//! replay (`kvtwin_sim::advisor`).

use super::AdvisorArgs;
use crate::plot;
use anyhow::{bail, Context, Result};
use kvtwin_plane::wire::{DecodeLimits, RouterEvent};
use kvtwin_sim::advisor::{replay, Access, ReplayRow};
use std::io::BufRead;
use std::path::Path;

/// Lines that are not events named on stderr before the rest are only counted.
const NAMED_BAD_LINES: usize = 5;

/// The stream's accesses (its Stored events, in order), and how many lines were not
/// events.
fn read_stream(path: &Path) -> Result<(Vec<Access>, usize, usize)> {
    let file = std::fs::File::open(path).with_context(|| format!("--replay {}", path.display()))?;
    let limits = DecodeLimits::default();
    let (mut accesses, mut events, mut bad) = (Vec::new(), 0usize, 0usize);
    for (number, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.with_context(|| format!("{}:{}", path.display(), number + 1))?;
        if line.trim().is_empty() {
            continue;
        }
        match RouterEvent::from_json(line.as_bytes(), &limits) {
            Ok(event) => {
                events += 1;
                accesses.extend(Access::of_event(event.worker_id, &event.event));
            }
            Err(error) => {
                bad += 1;
                if bad <= NAMED_BAD_LINES {
                    eprintln!(
                        "kvtwin advisor: {}:{}: not a RouterEvent ({error}); skipped",
                        path.display(),
                        number + 1
                    );
                }
            }
        }
    }
    Ok((accesses, events, bad))
}

/// `kvtwin advisor --replay PATH`.
pub(super) fn run(args: &AdvisorArgs, path: &Path) -> Result<()> {
    if args.capacity_blocks.is_empty() {
        bail!("--replay needs --capacity-blocks: the shared tier's sizes to try");
    }
    let (accesses, events, bad) = read_stream(path)?;
    if bad > 0 {
        eprintln!(
            "kvtwin advisor: {bad} line(s) of {} were not events and were skipped",
            path.display()
        );
    }
    if accesses.is_empty() {
        bail!(
            "{}: {events} event(s), none of them a BlockStored: nothing to replay",
            path.display()
        );
    }
    let policies = args.policies();
    let mut rows: Vec<ReplayRow> = Vec::new();
    for policy in &policies {
        for &capacity in &args.capacity_blocks {
            rows.push(replay(&accesses, *policy, capacity, args.block_bytes));
        }
    }
    if args.json {
        for row in &rows {
            println!("{}", serde_json::to_string(row)?);
        }
    } else {
        println!(
            "{}: {events} events, {} stores asked of a shared tier ({} blocks)",
            path.display(),
            accesses.len(),
            rows.first().map_or(0, |r| r.lookup_blocks)
        );
        println!(
            "{:<7} {:>14} {:>10} {:>12} {:>14} {:>12} {:>12}{}",
            "policy",
            "tier blocks",
            "hit ratio",
            "hit blocks",
            "cross-worker",
            "written",
            "evicted",
            if args.block_bytes > 0 {
                "    read GiB  written GiB"
            } else {
                ""
            }
        );
        let gib = |bytes: u64| bytes as f64 / (1u64 << 30) as f64;
        for row in &rows {
            print!(
                "{:<7} {:>14} {:>9.2}% {:>12} {:>14} {:>12} {:>12}",
                row.policy,
                row.capacity_blocks,
                100.0 * row.hit_ratio,
                row.hit_blocks,
                row.cross_worker_hit_blocks,
                row.inserted_blocks,
                row.evicted_blocks
            );
            if args.block_bytes > 0 {
                print!(
                    " {:>12.2} {:>12.2}",
                    gib(row.read_bytes),
                    gib(row.written_bytes)
                );
            }
            println!();
        }
    }
    if let Some(dir) = &args.plot {
        let series: Vec<plot::Series> = policies
            .iter()
            .map(|policy| plot::Series {
                name: policy.name().to_string(),
                points: rows
                    .iter()
                    .filter(|r| r.policy == policy.name())
                    .map(|r| (r.capacity_blocks.max(1) as f64, 100.0 * r.hit_ratio))
                    .collect(),
            })
            .collect();
        let axes = plot::Axes {
            title: "shared tier: hit ratio of the engines' stores by size and policy",
            x_label: "shared tier size (blocks)",
            y_label: "hit ratio (%)",
            x_log: true,
            y_log: false,
        };
        for path in plot::lines(dir, "advisor-replay", &axes, &series)? {
            eprintln!("kvtwin: wrote {}", path.display());
        }
    }
    Ok(())
}
