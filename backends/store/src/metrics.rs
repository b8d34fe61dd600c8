//! The store's `/metrics` (OpenMetrics text through the plane's `Exposition`, names in
//! STYLE.md's conventions: `kvtwin_store_` and base units, `_total` counters, a `tier`
//! label of `memory`, `disk` or `object`) and the small HTTP app that serves it with
//! `/healthz`.
//!
//! With KV events on: `kvtwin_store_kv_events_total{event}`, `_non_block_values_total`,
//! `_announced_blocks`, and per `transport` what was published, dropped for a full
//! queue, or failed.
//!
//! Owns: the families and their names. Never: keeps counts of its own (the store's
//! counters and occupancy are read at scrape time).

use crate::events::TransportCounters;
use crate::index::Tier;
use crate::store::Store;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use kvtwin_plane::service::metrics::{Exposition, CONTENT_TYPE};
use prometheus_client::encoding::EncodeLabelSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// One tier of the store.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StoreTierLabels {
    /// `memory`, `disk` or `object`.
    pub tier: &'static str,
}

/// One kind of KV event.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EventLabels {
    /// `stored` or `removed`.
    pub event: &'static str,
}

/// One transport of the KV events.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TransportLabels {
    /// `zmq` or `nats`.
    pub transport: &'static str,
}

fn by_tier(values: [u64; 3]) -> Vec<(StoreTierLabels, u64)> {
    Tier::ALL
        .iter()
        .zip(values)
        .map(|(tier, value)| (StoreTierLabels { tier: tier.name() }, value))
        .collect()
}

/// The store's metrics now, as OpenMetrics text.
pub async fn exposition(store: &Store) -> String {
    let occupancy = store.occupancy().await;
    let c = &store.counters;
    let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
    let each = |counters: &[AtomicU64; 3]| [0, 1, 2].map(|i| load(&counters[i]));
    let mut out = Exposition::new();
    out.counter("kvtwin_store_puts_total", "Values stored.", load(&c.puts));
    out.counters(
        "kvtwin_store_hits_total",
        "Reads answered, by the tier that held the value.",
        by_tier(each(&c.hits)),
    );
    out.counter(
        "kvtwin_store_misses_total",
        "Reads of keys the store did not hold.",
        load(&c.misses),
    );
    out.counters(
        "kvtwin_store_demotions_total",
        "Values moved one tier down for room, by the tier they left.",
        by_tier(each(&c.demotions)),
    );
    out.counters(
        "kvtwin_store_evictions_total",
        "Keys let go for room, by the tier they left the store from.",
        by_tier(each(&c.evictions)),
    );
    out.counter(
        "kvtwin_store_promotions_total",
        "Values read off disk or the object tier and moved to memory.",
        load(&c.promotions),
    );
    out.counter(
        "kvtwin_store_corrupt_values_total",
        "Values whose bytes failed their BLAKE3 check (or would not read), dropped.",
        load(&c.corrupt),
    );
    out.counter(
        "kvtwin_store_leases_total",
        "Reads that leased a copy on disk or in the object tier.",
        load(&c.leases),
    );
    out.counter(
        "kvtwin_store_refused_puts_total",
        "Puts refused: too large, or no room that readers did not hold.",
        load(&c.refused),
    );
    out.gauges(
        "kvtwin_store_keys",
        "Keys held, by tier.",
        by_tier(occupancy.tiers.map(|(keys, _, _)| keys as u64)),
    );
    out.gauges(
        "kvtwin_store_used_bytes",
        "Bytes used, by tier (records: header, key and value).",
        by_tier(occupancy.tiers.map(|(_, used, _)| used)),
    );
    out.gauges(
        "kvtwin_store_capacity_bytes",
        "Each tier's bound, bytes.",
        by_tier(occupancy.tiers.map(|(_, _, limit)| limit)),
    );
    out.gauge(
        "kvtwin_store_leased_copies",
        "Copies being read now.",
        occupancy.leased as u64,
    );
    let pages = store.page_counts();
    out.counter(
        "kvtwin_store_value_pages_made_total",
        "Pages of values in memory made (the allocator asked), since start.",
        pages.made,
    );
    out.counter(
        "kvtwin_store_value_pages_reused_total",
        "Pages of values in memory taken again from the store's pool.",
        pages.reused,
    );
    out.gauge(
        "kvtwin_store_value_pages_free",
        "Free pages the pool keeps for the next values.",
        pages.free as u64,
    );
    if let Some(events) = store.events() {
        let e = &events.counters;
        out.gauge(
            "kvtwin_store_announced_blocks",
            "Distinct blocks the store holds and announced in its KV events.",
            occupancy.announced_blocks as u64,
        );
        out.counters(
            "kvtwin_store_kv_events_total",
            "KV events queued: blocks stored (first copy in the store) and removed (last copy gone).",
            vec![
                (EventLabels { event: "stored" }, load(&e.stored)),
                (EventLabels { event: "removed" }, load(&e.removed)),
            ],
        );
        out.counter(
            "kvtwin_store_non_block_values_total",
            "Values stored that are not block frames (announced nothing).",
            load(&e.non_block_values),
        );
        let per_transport = |value: fn(&TransportCounters) -> &AtomicU64| {
            events
                .transports()
                .map(|(transport, counters)| (TransportLabels { transport }, load(value(counters))))
                .collect()
        };
        out.counters(
            "kvtwin_store_kv_events_published_total",
            "Blocks announced on a transport.",
            per_transport(|c| &c.published),
        );
        out.counters(
            "kvtwin_store_kv_events_dropped_total",
            "KV events dropped because a transport's queue was full (publishing never waits).",
            per_transport(|c| &c.dropped),
        );
        out.counters(
            "kvtwin_store_kv_event_publish_errors_total",
            "Publishes a transport failed (their events lost).",
            per_transport(|c| &c.errors),
        );
    }
    out.finish()
}

/// `GET /metrics` and `GET /healthz` for `store`.
pub fn app(store: Arc<Store>) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .with_state(store)
}

async fn metrics(State(store): State<Arc<Store>>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, CONTENT_TYPE)],
        exposition(&store).await,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::StoreConfig;
    use bytes::Bytes;

    #[tokio::test]
    async fn the_families_carry_the_stores_counts_by_tier() {
        let store = Store::open(StoreConfig {
            limits: [1 << 20, 0, 0],
            disk: None,
            object: None,
            max_value: 1 << 20,
            promote_on_hit: true,
            events: None,
        })
        .await
        .unwrap();
        store
            .put(Bytes::from_static(b"k"), Bytes::from_static(b"v"))
            .await
            .unwrap();
        assert!(store.get(b"k").await.is_some());
        assert!(store.get(b"none").await.is_none());
        let text = exposition(&store).await;
        for line in [
            "kvtwin_store_puts_total 1",
            "kvtwin_store_hits_total{tier=\"memory\"} 1",
            "kvtwin_store_hits_total{tier=\"disk\"} 0",
            "kvtwin_store_misses_total 1",
            "kvtwin_store_keys{tier=\"memory\"} 1",
            "kvtwin_store_capacity_bytes{tier=\"memory\"} 1048576",
            "# TYPE kvtwin_store_evictions counter",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
        }
        assert!(text.ends_with("# EOF\n"), "{text}");
        assert!(
            !text.contains("kv_events"),
            "no events, no event families: {text}"
        );
    }

    #[tokio::test]
    async fn with_events_the_announced_blocks_and_each_transports_drops_are_served() {
        let mut events = crate::events::StoreEvents::new();
        // A queue of one, never drained: the second event is dropped.
        let _receiver = events.add_transport("zmq", 1);
        let store = Store::open(StoreConfig {
            limits: [1 << 20, 0, 0],
            disk: None,
            object: None,
            max_value: 1 << 20,
            promote_on_hit: true,
            events: Some(Arc::new(events)),
        })
        .await
        .unwrap();
        for hash in 1..=2u64 {
            let frame = kvtwin::block_frame::encode(
                kvtwin::ids::SequenceHash::new(hash),
                None,
                &[1, 2],
                b"kv",
            );
            store
                .put(Bytes::from(format!("k{hash}")), Bytes::from(frame))
                .await
                .unwrap();
        }
        store
            .put(Bytes::from_static(b"lm"), Bytes::from_static(b"v"))
            .await
            .unwrap();
        let text = exposition(&store).await;
        for line in [
            "kvtwin_store_announced_blocks 2",
            "kvtwin_store_kv_events_total{event=\"stored\"} 2",
            "kvtwin_store_kv_events_total{event=\"removed\"} 0",
            "kvtwin_store_non_block_values_total 1",
            "kvtwin_store_kv_events_dropped_total{transport=\"zmq\"} 1",
            "kvtwin_store_kv_events_published_total{transport=\"zmq\"} 0",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
        }
    }
}
