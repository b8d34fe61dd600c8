//! The fitting math of calibration: a link's latency and one transfer's rate from points
//! run one at a time, its aggregate rate from points with the pool busy, and the servers
//! that reach it.
//!
//! Owns: [`fit_latency_bandwidth`], [`fit_link`], [`fit_aggregate_bandwidth`],
//! [`transfer_rate_at`], [`servers_for`]. Pure functions of `(bytes, seconds, ...)`
//! points.
//! Never: measure anything, or see a `Sample` (the caller picks the points).

use super::MIB;
use kvtwin::stats::nearest_rank;

/// One transfer's rate from `(bytes, seconds, transfers)` points run one transfer at a
/// time: each transfer pays one latency, so the rate is `bytes / (seconds − transfers ×
/// latency)` over the points together; `None` without points or when the latency
/// leaves no time on the link.
pub fn transfer_rate_at(points: &[(f64, f64, usize)], latency_s: f64) -> Option<f64> {
    let bytes: f64 = points.iter().map(|p| p.0).sum();
    let on_link: f64 = points
        .iter()
        .map(|&(_, seconds, transfers)| seconds - transfers as f64 * latency_s)
        .sum();
    (bytes > 0.0 && on_link > 0.0).then(|| bytes / on_link)
}

/// How many transfers a link serves at once: the servers, each at one transfer's rate,
/// that reach its aggregate rate (rounded up, past a tenth of a server: a link whose
/// aggregate is its single-transfer rate is one server), at least one.
pub fn servers_for(aggregate_bytes_per_s: f64, transfer_bytes_per_s: f64) -> usize {
    if !(transfer_bytes_per_s > 0.0 && aggregate_bytes_per_s.is_finite()) {
        return 1;
    }
    let ratio = aggregate_bytes_per_s / transfer_bytes_per_s;
    ((ratio - 0.1).ceil().max(1.0) as usize).min(1 << 16)
}

/// Weighted least squares of `seconds = latency + bytes / bandwidth` over `(bytes,
/// seconds)` points, each weighted by `1 / seconds²` so that every point counts by its
/// relative error (small transfers fix the latency, large ones the bandwidth). Returns
/// `(latency seconds ≥ 0, bytes per second)`, or `None` with fewer than two distinct
/// sizes or a slope that is not positive.
pub fn fit_latency_bandwidth(points: &[(f64, f64)]) -> Option<(f64, f64)> {
    let points: Vec<(f64, f64)> = points
        .iter()
        .copied()
        .filter(|(x, y)| x.is_finite() && y.is_finite() && *x > 0.0 && *y > 0.0)
        .collect();
    let (mut sw, mut sx, mut sy, mut sxx, mut sxy) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for &(x, y) in &points {
        let w = 1.0 / (y * y);
        sw += w;
        sx += w * x;
        sy += w * y;
        sxx += w * x * x;
        sxy += w * x * y;
    }
    let det = sw * sxx - sx * sx;
    if points.len() < 2 || det.abs() <= f64::EPSILON * sw * sxx {
        return None;
    }
    let slope = (sw * sxy - sx * sy) / det;
    let intercept = (sy - slope * sx) / sw;
    if slope.is_nan() || slope <= 0.0 {
        return None;
    }
    if intercept >= 0.0 {
        return Some((intercept, 1.0 / slope));
    }
    // A negative intercept is noise: refit through the origin (slope = Σwxy / Σwxx).
    let slope = sxy / sxx;
    (slope > 0.0).then(|| (0.0, 1.0 / slope))
}

/// Blocks at least this big stream from memory rather than from the CPU's caches: the
/// rate of a link is fitted on them.
pub const STREAMING_BYTES: u64 = 4 * MIB;

/// A link's `(latency seconds, bytes per second)` from one-at-a-time `(bytes, seconds)`
/// points: the rate from the points of at least [`STREAMING_BYTES`] (a least-squares
/// slope with two sizes or more, bytes over seconds with one), since smaller copies run
/// from the CPU's caches faster than the blocks a worker moves; the latency is the median
/// of what the small points (under 1 MiB) take beyond their bytes at that rate. With too
/// few points of either kind, [`fit_latency_bandwidth`] over all of them.
pub fn fit_link(points: &[(f64, f64)]) -> Option<(f64, f64)> {
    let streaming: Vec<(f64, f64)> = points
        .iter()
        .copied()
        .filter(|(bytes, seconds)| *bytes >= STREAMING_BYTES as f64 && *seconds > 0.0)
        .collect();
    let mut sizes: Vec<f64> = streaming.iter().map(|p| p.0).collect();
    sizes.dedup();
    let rate = match sizes.len() {
        0 => return fit_latency_bandwidth(points),
        1 => {
            let mut rates: Vec<f64> = streaming.iter().map(|(b, s)| b / s).collect();
            rates.sort_by(f64::total_cmp);
            nearest_rank(&rates, 0.5).unwrap_or(0.0)
        }
        _ => fit_latency_bandwidth(&streaming)?.1,
    };
    let mut extra: Vec<f64> = points
        .iter()
        .filter(|(bytes, _)| *bytes < MIB as f64)
        .map(|(bytes, seconds)| (seconds - bytes / rate).max(0.0))
        .collect();
    if extra.is_empty() {
        return fit_latency_bandwidth(points);
    }
    extra.sort_by(f64::total_cmp);
    Some((nearest_rank(&extra, 0.5).unwrap_or(0.0), rate))
}

/// The rate a link carries with the pool busy, from `(bytes, seconds, rounds)` points:
/// each round of transfers in flight pays one latency that is not time on the link, so
/// the link's rate is `bytes / (seconds − rounds × latency)`; the highest over points:
/// every point pays its ramp (filling the pool, draining the last round) and a shared
/// machine's interference, both of which only lower a point's rate, and a point with
/// many transfers in flight and few rounds pays the most.
pub fn fit_aggregate_bandwidth(points: &[(f64, f64, usize)], latency_s: f64) -> Option<f64> {
    let rates: Vec<f64> = points
        .iter()
        .filter_map(|&(bytes, seconds, rounds)| {
            let on_link = seconds - rounds as f64 * latency_s;
            (on_link > 0.0 && bytes > 0.0).then(|| bytes / on_link)
        })
        .collect();
    rates.into_iter().max_by(f64::total_cmp)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(latency: f64, rate: f64, sizes: &[f64]) -> Vec<(f64, f64)> {
        sizes.iter().map(|b| (*b, latency + b / rate)).collect()
    }

    #[test]
    fn a_line_is_fitted_exactly() {
        let sizes = [65536.0, 262144.0, 1048576.0, 4194304.0, 16777216.0];
        let (latency, rate) = fit_latency_bandwidth(&line(40e-6, 5e9, &sizes)).unwrap();
        assert!((latency - 40e-6).abs() < 1e-12, "{latency}");
        assert!((rate - 5e9).abs() < 1.0, "{rate}");
        let (latency, rate) = fit_link(&line(40e-6, 5e9, &sizes)).unwrap();
        assert!((latency - 40e-6).abs() < 1e-12 && (rate - 5e9).abs() < 1.0);
    }

    #[test]
    fn a_link_has_the_servers_that_reach_its_aggregate() {
        // Aggregate equal to one transfer's rate (or a little above: noise): one server.
        assert_eq!(servers_for(6.8e9, 6.8e9), 1);
        assert_eq!(servers_for(7.4e9, 6.8e9), 1);
        // 1.38 transfers' worth: two servers sharing the aggregate.
        assert_eq!(servers_for(1.965e9, 1.419e9), 2);
        assert_eq!(servers_for(4.0e9, 1.0e9), 4);
        // Nonsense in, one server out.
        assert_eq!(servers_for(1e9, 0.0), 1);
        assert_eq!(servers_for(f64::NAN, 1e9), 1);
        assert_eq!(servers_for(0.5e9, 1e9), 1);
    }

    #[test]
    fn one_transfers_rate_at_a_size_discounts_a_latency_per_transfer() {
        // 24 transfers of 8 MiB in 0.2 s, 100 µs latency each: 0.2 − 0.0024 s on the link.
        let bytes = 24.0 * 8.0 * MIB as f64;
        let rate = transfer_rate_at(&[(bytes, 0.2, 24)], 100e-6).unwrap();
        assert!((rate - bytes / 0.1976).abs() < 1.0, "{rate}");
        // Two points pool their bytes and time.
        let two = transfer_rate_at(&[(bytes, 0.2, 24), (bytes, 0.1, 24)], 0.0).unwrap();
        assert!((two - 2.0 * bytes / 0.3).abs() < 1.0, "{two}");
        // Nothing measured, or a latency that leaves no time on the link: no rate.
        assert_eq!(transfer_rate_at(&[], 1e-3), None);
        assert_eq!(transfer_rate_at(&[(bytes, 0.02, 24)], 1e-3), None);
    }

    #[test]
    fn fits_refuse_what_they_cannot_fit_and_clamp_negative_latency() {
        assert_eq!(fit_latency_bandwidth(&[]), None);
        assert_eq!(fit_latency_bandwidth(&[(1e6, 1e-3)]), None);
        assert_eq!(fit_latency_bandwidth(&[(1e6, 1e-3), (1e6, 2e-3)]), None);
        // Time falling with size: no positive slope.
        assert_eq!(fit_latency_bandwidth(&[(1e6, 2e-3), (2e6, 1e-3)]), None);
        // A negative intercept is refitted through the origin.
        let (latency, rate) = fit_latency_bandwidth(&[(1e6, 0.5e-3), (2e6, 1.5e-3)]).unwrap();
        assert_eq!(latency, 0.0);
        assert!(rate > 1e9 && rate < 2e9, "{rate}");
    }

    #[test]
    fn the_link_rate_comes_from_blocks_past_the_caches() {
        // Small copies run from cache at 10 GB/s, large ones stream at 5 GB/s; 30 µs of
        // latency each. The rate is the streaming one, the latency what the small ones
        // take beyond their bytes at it (so less than 30 µs): the nearest-rank median of
        // the two, the lower one (the 256 KiB copy's).
        let mut points = line(30e-6, 10e9, &[65536.0, 262144.0]);
        points.extend(line(30e-6, 5e9, &[4194304.0, 16777216.0, 67108864.0]));
        let (latency, rate) = fit_link(&points).unwrap();
        assert!((rate - 5e9).abs() < 1.0, "{rate}");
        let expected = 30e-6 + 262144.0 / 10e9 - 262144.0 / 5e9;
        assert!((latency - expected).abs() < 1e-9, "{latency} vs {expected}");
        // One streaming size: bytes over seconds.
        let (_, rate) = fit_link(&[(65536.0, 50e-6), (4194304.0, 1e-3)]).unwrap();
        assert_eq!(rate, 4194304.0 / 1e-3);
    }

    #[test]
    fn the_aggregate_rate_discounts_one_latency_per_round() {
        // 64 MB in 10 ms over 4 rounds of 0.5 ms latency: 64 MB in 8 ms on the link.
        let rate = fit_aggregate_bandwidth(&[(64e6, 10e-3, 4)], 0.5e-3).unwrap();
        assert!((rate - 8e9).abs() < 1.0, "{rate}");
        assert_eq!(fit_aggregate_bandwidth(&[(64e6, 1e-3, 4)], 0.5e-3), None);
        // Of several points, the best: 2.35 GB/s at 4 in flight over 1.5 at 16.
        let points = [(2.35e9, 1.0, 0), (1.5e9, 1.0, 0), (64e6, 1e-3, 4)];
        assert_eq!(fit_aggregate_bandwidth(&points, 0.5e-3), Some(2.35e9));
    }
}
