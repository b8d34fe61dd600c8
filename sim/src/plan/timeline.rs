//! Occupancy per tier over time for one run: what a plot of "how full is each tier"
//! draws.
//!
//! Owns: [`run_with_occupancy`], a run sampled every fixed step of simulated time,
//! and [`OccupancySample`].
//! Never: change the run: sampling only reads snapshots between steps, so the report is
//! the plain run's.

use super::run::finish;
#[cfg(test)]
use super::run::run;
use super::summary::RunSummary;
use crate::cluster::{Cluster, Report, SimError};
use crate::scenario::Scenario;
use crate::workload::Request;
use kvtwin::ids::Timestamp;
use kvtwin::tier::Tier;

/// Blocks in use per tier, summed over the workers, at one instant.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OccupancySample {
    /// Simulated seconds.
    pub at_s: f64,
    /// Blocks held by requests or registered, per tier (index: `Tier::index`).
    pub used_blocks: [u64; 4],
    /// Capacity per tier (0 for a tier the workers lack).
    pub capacity_blocks: [u64; 4],
}

/// Runs `requests` through `scenario` and samples occupancy about `samples` times over
/// the arrivals (then at the same step until the run ends). The report and summary are
/// those of [`run`](super::run::run).
pub fn run_with_occupancy(
    scenario: &Scenario,
    requests: &[Request],
    samples: usize,
) -> Result<(Report, RunSummary, Vec<OccupancySample>), SimError> {
    let last_arrival = requests.last().map_or(0, |r| r.arrival.as_nanos());
    let step_ns = (last_arrival / samples.max(1) as u64).max(1_000_000);
    let mut occupancy = Vec::new();
    let mut cluster = Cluster::new(scenario, requests.iter().cloned())?;
    let mut at = 0;
    while !cluster.is_done() && cluster.next_deadline().is_some() {
        at += step_ns;
        cluster.advance_to(Timestamp::from_nanos(at));
        let snapshot = cluster.snapshot();
        let mut sample = OccupancySample {
            at_s: at as f64 / 1e9,
            used_blocks: [0; 4],
            capacity_blocks: [0; 4],
        };
        for worker in &snapshot.workers {
            for tier in Tier::ALL {
                if let Some(blocks) = worker.blocks[tier.index()] {
                    sample.used_blocks[tier.index()] += (blocks.active + blocks.cached) as u64;
                    sample.capacity_blocks[tier.index()] += blocks.capacity as u64;
                }
            }
        }
        occupancy.push(sample);
    }
    while cluster.step() {}
    let (report, summary) = finish(cluster);
    Ok((report, summary, occupancy))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::run::Workload;
    use std::path::Path;

    #[test]
    fn sampling_occupancy_changes_nothing_and_stays_within_capacity() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenarios/cluster-kv.ron");
        let mut scenario = Scenario::load(&path).unwrap();
        scenario.workload.thin_out(10);
        let requests = Workload::Synthetic.requests(&scenario);
        let (report, summary, samples) = run_with_occupancy(&scenario, &requests, 50).unwrap();
        assert_eq!((report, summary), run(&scenario, &requests).unwrap());
        assert!(samples.len() >= 50, "{}", samples.len());
        assert!(samples.windows(2).all(|w| w[0].at_s < w[1].at_s));
        for sample in &samples {
            for tier in 0..4 {
                assert!(sample.used_blocks[tier] <= sample.capacity_blocks[tier]);
            }
        }
        assert!(samples.iter().any(|s| s.used_blocks[0] > 0));
        assert_eq!(samples[0].capacity_blocks[0], 8 * 4000);
    }
}
