//! `kvtwin advisor --metrics-listen ADDR`: the last report's figures as Prometheus
//! metrics (OpenMetrics text through the plane's `Exposition`, families in a fixed order),
//! `kvtwin_advisor_*`: counters of events, refusals by reason, accesses, reuses, copies
//! and forgotten blocks; gauges of the blocks each worker rank holds per tier, the reuse
//! distance percentiles, and each policy's tier size per fraction.
//!
//! Owns: [`render`] and [`serve_metrics`]. Never: computes a figure (the report does),
//! or reads the advisor between reports (what a scrape sees is the last report).

use super::live::LiveReport;
use kvtwin_plane::service::metrics::{Exposition, ReasonLabels, CONTENT_TYPE};
use prometheus_client::encoding::EncodeLabelSet;
use std::future::Future;
use tokio::sync::watch;

/// A worker rank's tier.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RankTierLabels {
    worker_id: u64,
    dp_rank: u32,
    tier: &'static str,
}

/// A policy and the fraction of its asymptotic hit ratio a size reaches.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SizeLabels {
    policy: &'static str,
    fraction: String,
}

/// The OpenMetrics text of `report`.
pub(super) fn render(report: &LiveReport) -> String {
    let a = &report.advisor;
    let c = &a.counters;
    let mut out = Exposition::new();
    out.counter(
        "kvtwin_advisor_events_total",
        "Events received.",
        report.events_received,
    );
    let reasons = |counts: &std::collections::BTreeMap<&'static str, u64>| {
        counts
            .iter()
            .map(|(&reason, &count)| (ReasonLabels { reason }, count))
            .collect()
    };
    out.counters(
        "kvtwin_advisor_bad_events_total",
        "Messages, batches or events refused, and engine batches lost, by reason.",
        reasons(&report.bad_events),
    );
    out.counters(
        "kvtwin_advisor_anomalies_total",
        "Events the index could not apply as they stood, by reason.",
        reasons(&report.anomalies),
    );
    for (name, help, value) in [
        (
            "kvtwin_advisor_accesses_total",
            "Blocks a worker rank stored without holding them in any tier.",
            c.accesses,
        ),
        (
            "kvtwin_advisor_reuses_total",
            "Accesses of blocks accessed before.",
            c.reuses,
        ),
        (
            "kvtwin_advisor_copies_total",
            "Stores of blocks their rank (or an engine) already held.",
            c.copies,
        ),
        (
            "kvtwin_advisor_blocks_forgotten_total",
            "Blocks the index forgot past its bound.",
            c.blocks_forgotten,
        ),
    ] {
        out.counter(name, help, value);
    }
    out.gauge(
        "kvtwin_advisor_blocks_tracked",
        "Blocks the index tracks.",
        a.blocks_tracked as u64,
    );
    out.gauges(
        "kvtwin_advisor_blocks",
        "Blocks each worker rank holds in each tier.",
        a.occupancy
            .iter()
            .map(|row| {
                let labels = RankTierLabels {
                    worker_id: row.worker_id,
                    dp_rank: row.dp_rank,
                    tier: row.tier,
                };
                (labels, row.blocks)
            })
            .collect(),
    );
    let d = &a.reuse_distance;
    for (name, help, value) in [
        (
            "kvtwin_advisor_reuse_distance_p50_blocks",
            "Median reuse distance of the recent reuses, in distinct blocks.",
            d.p50,
        ),
        (
            "kvtwin_advisor_reuse_distance_p90_blocks",
            "90th percentile reuse distance, in distinct blocks.",
            d.p90,
        ),
        (
            "kvtwin_advisor_reuse_distance_p99_blocks",
            "99th percentile reuse distance, in distinct blocks.",
            d.p99,
        ),
    ] {
        if let Some(value) = value {
            out.gauge(name, help, value);
        }
    }
    out.gauges(
        "kvtwin_advisor_tier_size_blocks",
        "The shared tier size at which each policy reaches each fraction of its asymptotic hit ratio over the window.",
        a.tier_sizes
            .iter()
            .flat_map(|size| {
                size.sizes.iter().map(|at| {
                    let labels = SizeLabels {
                        policy: size.policy,
                        fraction: at.fraction.to_string(),
                    };
                    (labels, at.capacity_blocks as u64)
                })
            })
            .collect(),
    );
    out.finish()
}

/// Serves `GET /metrics` (the latest text on `text`) and `GET /healthz` on `listener`
/// until `shutdown` resolves.
pub(super) async fn serve_metrics(
    listener: tokio::net::TcpListener,
    text: watch::Receiver<String>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use axum::http::header;
    use axum::routing::get;
    let metrics = move || {
        let body = text.borrow().clone();
        async move { ([(header::CONTENT_TYPE, CONTENT_TYPE)], body) }
    };
    let app = axum::Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }));
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}
