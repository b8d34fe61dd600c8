//! Calibration at a caller's transfer shape: the points with the pool busy move chains of
//! blocks (one I/O per block, as a manager moves a prefix), and one transfer's rate in
//! the profile is the one measured at that shape, not the line through every size.

use kvtwin::tier::Tier;
use kvtwin_backends::calibrate::{calibrate, servers_for, transfer_rate_at, CalibrateOptions};
use std::path::PathBuf;

/// A directory removed on drop.
struct Dir(PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn a_calibration_at_a_chain_shape_measures_chains_and_takes_one_transfers_rate_there() {
    let dir = Dir(std::env::temp_dir().join(format!("kvtwin-cal-shape-{}", std::process::id())));
    std::fs::create_dir_all(&dir.0).unwrap();
    let block = 256 << 10;
    let options = CalibrateOptions {
        quick: true,
        cuda_device: None,
        aggregate_block_bytes: Some(block),
        blocks_per_transfer: 3,
        ..CalibrateOptions::new(&dir.0)
    };
    let calibration = calibrate(&options).unwrap();

    // The busy points and the one-at-a-time point at the shape move chains of three.
    let chains: Vec<_> = calibration
        .samples
        .iter()
        .filter(|s| s.blocks == 3)
        .collect();
    assert!(
        chains.iter().any(|s| s.in_flight == 1) && chains.iter().any(|s| s.in_flight >= 4),
        "{chains:?}"
    );
    for s in &chains {
        assert_eq!((s.block_bytes, s.transfer_bytes()), (block, 3 * block));
    }
    // The sizes fitted one at a time stay single blocks.
    assert!(calibration
        .samples
        .iter()
        .any(|s| s.blocks == 1 && s.in_flight == 1));

    // Every link's one-transfer rate is what its chains took one at a time, less one
    // latency each.
    for (src, dst) in [(Tier::Host, Tier::Disk), (Tier::Device, Tier::Host)] {
        let fit = calibration.fits[&(src, dst)];
        let points: Vec<(f64, f64, usize)> = chains
            .iter()
            .filter(|s| s.src == src && s.dst == dst && s.in_flight == 1)
            // The buffered-I/O points are for comparison only.
            .filter(|s| s.disk_io.is_none() || s.disk_io == calibration.disk_io)
            .map(|s| {
                let bytes = s.transfer_bytes() as f64 * s.transfers as f64;
                (bytes, s.elapsed.as_secs_f64(), s.transfers)
            })
            .collect();
        // The fit took its rate at the latency it measured and kept that latency as a
        // `Duration`, in whole nanoseconds; so its rate lies between the rates at the kept
        // latency less and more one nanosecond. (Where the latency is most of a
        // transfer's time, as for fast device copies, a nanosecond moves the rate by more
        // than 1e-5: CI saw 1.2e-5.)
        let latency = fit.latency.as_secs_f64();
        let rate = fit.transfer_bytes_per_s;
        let low = transfer_rate_at(&points, latency - 1e-9);
        match (low, transfer_rate_at(&points, latency + 1e-9)) {
            (Some(low), Some(high)) => assert!(
                low * (1.0 - 1e-12) <= rate && rate <= high * (1.0 + 1e-12),
                "{src:?}->{dst:?}: {fit:?} vs {low}..{high}"
            ),
            // The chains took no longer than their latencies (emulated device copies
            // faster than the small transfers that fixed the latency; CI saw it): at the
            // measured latency there may be no time on the link to divide by, and the fit
            // falls back to the line through every size. Only a usable rate is required.
            _ => assert!(rate.is_finite() && rate > 0.0, "{src:?}->{dst:?}: {fit:?}"),
        }
        assert!(fit.aggregate_bytes_per_s >= fit.transfer_bytes_per_s);
    }
    let write = calibration.fits[&(Tier::Host, Tier::Disk)];
    assert_eq!(
        calibration.profile.nvme_write_transfer_bytes_per_s,
        write.transfer_bytes_per_s.round() as u64
    );
    assert!(servers_for(write.aggregate_bytes_per_s, write.transfer_bytes_per_s) >= 1);
}
