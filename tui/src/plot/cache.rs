//! `kvtwin cache --curve --plot DIR`: the hit-ratio curve, drawn.
//!
//! Owns: what is drawn for a cache curve: hit blocks and hit tokens (in %) against GiB
//! on a log axis, at four capacities per doubling, exact and (when sampled) estimated,
//! with the exact curve's knee.
//! Never: draw (`plot` does) or compute a curve (`kvtwin_sim::cache` does).

use crate::cmd::cache::{percent, Curve, KNEE_FRACTION};
use crate::plot;
use anyhow::Result;
use kvtwin_sim::cache;
use std::path::{Path, PathBuf};

/// `--plot DIR`: hit blocks and hit tokens (in %) against GiB, exact and (when sampled)
/// estimated, at four capacities per doubling, with the exact curve's 80 % knee, as
/// DIR/cache-curve.svg and .png; returns the files.
pub(crate) fn plot_curve(
    dir: &Path,
    exact: &cache::curve::HitCurve,
    curve: &Curve,
    gib: impl Fn(usize) -> f64,
) -> Result<Vec<PathBuf>> {
    let saturation = exact.saturation_blocks().max(curve.saturation_blocks());
    let mut capacities: Vec<usize> = (0..)
        .map(|i| 2f64.powf(f64::from(i) / 4.0).round() as usize)
        .take_while(|c| *c < saturation)
        .collect();
    capacities.dedup();
    capacities.push(saturation);
    let series = |name: &str, row: &dyn Fn(usize) -> cache::CacheRow, tokens: bool| plot::Series {
        name: name.to_string(),
        points: capacities
            .iter()
            .map(|c| {
                let row = row(*c);
                (
                    gib(*c),
                    100.0
                        * if tokens {
                            row.hit_tokens
                        } else {
                            row.hit_blocks
                        },
                )
            })
            .collect(),
    };
    let exact_row = |c: usize| exact.row(c);
    let mut all = vec![
        series("hit_blocks (exact)", &exact_row, false),
        series("hit_tokens (exact)", &exact_row, true),
    ];
    if let Curve::Sampled(sampled) = curve {
        let rate = percent(sampled.rate().get());
        let sampled_row = |c: usize| sampled.row(c);
        all.push(series(
            &format!("hit_blocks (sampled, {rate})"),
            &sampled_row,
            false,
        ));
        all.push(series(
            &format!("hit_tokens (sampled, {rate})"),
            &sampled_row,
            true,
        ));
    }
    let knee = exact.knee(KNEE_FRACTION);
    all.push(plot::Series {
        name: format!(
            "{:.0} % of reachable hits (exact): {:.1} GiB",
            KNEE_FRACTION * 100.0,
            gib(knee.capacity_blocks)
        ),
        points: vec![
            (gib(knee.capacity_blocks), 0.0),
            (
                gib(knee.capacity_blocks),
                100.0 * exact.row(knee.capacity_blocks).hit_blocks,
            ),
        ],
    });
    let axes = plot::Axes {
        title: "LRU prefix-cache hit ratio by capacity",
        x_label: "cache capacity (GiB)",
        y_label: "hit ratio (%)",
        x_log: true,
        y_log: false,
    };
    plot::lines(dir, "cache-curve", &axes, &all)
}
