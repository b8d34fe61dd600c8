//! A live report on stdout: one JSON object a line (`--json`), or a table a person reads
//! (each section a few lines, its lists as long as `--top`).
//!
//! Owns: the table's layout. Never: computes a figure (the report holds them all).

use super::live::LiveReport;
use anyhow::Result;
use std::fmt::Write as _;
use std::io::Write;

/// Writes `report` to stdout (flushed: a reader sees each report as it comes).
pub(super) fn report(report: &LiveReport, json: bool) -> Result<()> {
    let text = if json {
        let mut line = serde_json::to_string(report)?;
        line.push('\n');
        line
    } else {
        table(report)
    };
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()?;
    Ok(())
}

fn gib(bytes: u64) -> String {
    format!("{:.2}", bytes as f64 / (1u64 << 30) as f64)
}

fn or_dash(value: Option<u64>) -> String {
    value.map_or_else(|| "-".to_string(), |v| v.to_string())
}

/// The table (a string, so a test can read it).
pub(super) fn table(report: &LiveReport) -> String {
    let a = &report.advisor;
    let c = &a.counters;
    let bytes = a.block_bytes > 0;
    let mut t = String::new();
    let _ = writeln!(
        t,
        "== kvtwin advisor: report {} at {:.1} s: {} events, {} accesses ({} reuses), {} copies, {} blocks tracked",
        report.report,
        report.elapsed_ms as f64 / 1e3,
        report.events_received,
        c.accesses,
        c.reuses,
        c.copies,
        a.blocks_tracked,
    );
    let bad: Vec<String> = report
        .bad_events
        .iter()
        .chain(&report.anomalies)
        .map(|(reason, count)| format!("{reason} {count}"))
        .collect();
    if !bad.is_empty() {
        let _ = writeln!(t, "bad events: {}", bad.join(", "));
    }
    for source in &report.sources {
        let _ = writeln!(
            t,
            "source {}: {} events, {} dropped, {} batches lost{}",
            source.source,
            source.events,
            source.dropped,
            source.lost_batches,
            source
                .failed
                .as_deref()
                .map(|e| format!(", stopped: {e}"))
                .unwrap_or_default()
        );
    }
    let _ = writeln!(
        t,
        "occupancy   {:>10} {:>5} {:<7} {:>10}{}",
        "worker",
        "rank",
        "tier",
        "blocks",
        if bytes { "        GiB" } else { "" }
    );
    for row in &a.occupancy {
        let _ = write!(
            t,
            "            {:>10} {:>5} {:<7} {:>10}",
            row.worker_id, row.dp_rank, row.tier, row.blocks
        );
        if bytes {
            let _ = write!(t, " {:>10}", gib(row.bytes));
        }
        t.push('\n');
    }
    let tiers: Vec<String> = a
        .tiers
        .iter()
        .filter(|tier| tier.blocks > 0)
        .map(|tier| {
            format!(
                "{} {} copies of {} blocks",
                tier.tier, tier.blocks, tier.distinct_blocks
            )
        })
        .collect();
    let _ = writeln!(t, "tiers       {}", tiers.join("; "));
    let d = &a.reuse_distance;
    let _ = writeln!(
        t,
        "reuse distance (distinct blocks): {} reuses; of the last {}: p50 {}, p90 {}, p99 {}, max {}",
        d.reuses,
        d.recent,
        or_dash(d.p50),
        or_dash(d.p90),
        or_dash(d.p99),
        or_dash(d.max)
    );
    let hot: Vec<String> = a
        .hot_prefixes
        .iter()
        .map(|p| format!("{} ({} blocks, {} accesses)", p.root, p.blocks, p.accesses))
        .collect();
    let _ = writeln!(t, "hot prefixes: {}", hot.join(", "));
    let tiers_of = |holders: &[kvtwin_sim::advisor::index::query::HolderView]| -> String {
        holders
            .iter()
            .map(|h| format!("{}/{}:{}", h.worker_id, h.dp_rank, h.tier))
            .collect::<Vec<_>>()
            .join(" ")
    };
    for (title, blocks) in [
        ("hot blocks", &a.hot_blocks),
        ("cold blocks", &a.cold_blocks),
    ] {
        let _ = writeln!(t, "{title}:");
        for b in blocks {
            let _ = writeln!(
                t,
                "  {:>20} {:>6} accesses, idle {:>6}  {}",
                b.block,
                b.accesses,
                b.idle,
                tiers_of(&b.holders)
            );
        }
    }
    let _ = writeln!(t, "promotions:");
    for p in &a.promotions {
        let _ = writeln!(
            t,
            "  {:>20} worker {}/{}: {} -> {} ({} accesses)",
            p.block, p.worker_id, p.dp_rank, p.from, p.to, p.accesses
        );
    }
    let _ = writeln!(t, "demotions:");
    for d in &a.demotions {
        let _ = writeln!(
            t,
            "  {:>20} worker {}/{}: {} -> {} (idle {})",
            d.block, d.worker_id, d.dp_rank, d.from, d.to, d.idle
        );
    }
    let _ = writeln!(
        t,
        "tier sizes over the last {} stores ({} blocks, {} dropped):",
        a.window.accesses, a.window.blocks, a.window.dropped_accesses
    );
    for size in &a.tier_sizes {
        let at: Vec<String> = size
            .sizes
            .iter()
            .map(|s| {
                let mut text = format!(
                    "{:.0}%: {} blocks ({:.2}%)",
                    100.0 * s.fraction,
                    s.capacity_blocks,
                    100.0 * s.hit_ratio
                );
                if bytes {
                    let _ = write!(
                        text,
                        " {} GiB",
                        gib(s.capacity_blocks as u64 * a.block_bytes)
                    );
                }
                text
            })
            .collect();
        let _ = writeln!(
            t,
            "  {:<7} asymptotic {:.2}% at {} blocks; {}",
            size.policy,
            100.0 * size.asymptotic_hit_ratio,
            size.distinct_blocks,
            at.join(", ")
        );
    }
    for row in &a.replay {
        let _ = writeln!(
            t,
            "  {:<7} at {:>10} blocks: hit ratio {:.2}%, {} cross-worker hits",
            row.policy,
            row.capacity_blocks,
            100.0 * row.hit_ratio,
            row.cross_worker_hit_blocks
        );
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::advisor::live::SourceStats;
    use kvtwin::events::{KvCacheEvent, KvCacheEventData, StoredBlock};
    use kvtwin::ids::{LocalBlockHash, SequenceHash, WorkerId};
    use kvtwin::tier::Tier;
    use kvtwin_sim::advisor::report::{Advisor, AdvisorConfig, ReportOptions};
    use std::collections::BTreeMap;

    #[test]
    fn the_table_names_every_section_and_its_figures() {
        let mut advisor = Advisor::new(AdvisorConfig {
            block_bytes: 1 << 20,
            ..AdvisorConfig::default()
        });
        let stored = |worker: u64, event_id, blocks: &[u64], tier| {
            let event = KvCacheEvent {
                event_id,
                dp_rank: 0,
                data: KvCacheEventData::Stored {
                    parent_hash: None,
                    blocks: blocks
                        .iter()
                        .map(|&b| StoredBlock {
                            block_hash: SequenceHash::new(b),
                            tokens_hash: LocalBlockHash::new(b),
                        })
                        .collect(),
                    tier,
                },
            };
            (WorkerId::new(worker), event)
        };
        let removed = KvCacheEvent {
            event_id: 1,
            dp_rank: 0,
            data: KvCacheEventData::Removed {
                block_hashes: vec![SequenceHash::new(5), SequenceHash::new(6)],
                tier: Tier::Device,
            },
        };
        let events = [
            stored(1, 0, &[5, 6], Tier::Device),
            (WorkerId::new(1), removed),
            stored(2, 0, &[5, 6], Tier::Host),
        ];
        for (now, (worker, event)) in events.iter().enumerate() {
            advisor
                .handle_event(*worker, event, now as u64 + 1)
                .unwrap();
        }
        let report = LiveReport {
            report: 3,
            elapsed_ms: 1500,
            events_received: 3,
            bad_events: BTreeMap::from([("bad_json", 4)]),
            anomalies: BTreeMap::new(),
            sources: vec![SourceStats {
                source: "nats nats://127.0.0.1:4222 kv".into(),
                events: 2,
                ..SourceStats::default()
            }],
            advisor: advisor.report(3, &ReportOptions::default()),
        };
        let text = table(&report);
        println!("{text}");
        for needle in [
            "report 3 at 1.5 s: 3 events, 4 accesses (2 reuses)",
            "bad events: bad_json 4",
            "source nats nats://127.0.0.1:4222 kv: 2 events",
            "                     2     0 host             2       0.00\n",
            "reuse distance (distinct blocks): 2 reuses",
            "promotions:\n                     5 worker 2/0: host -> device (2 accesses)\n",
            "demotions:\n                     5 worker 2/0: host -> disk (idle 0)\n",
            "lru     asymptotic 50.00% at 2 blocks",
        ] {
            assert!(text.contains(needle), "{needle:?} not in\n{text}");
        }
    }
}
