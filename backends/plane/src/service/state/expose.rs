//! The router state's `/metrics`: the counters of [`Metrics`](crate::service::metrics::Metrics),
//! the sources' connections, and the state's sizes, written through
//! [`Exposition`] (`prometheus-client`) in a fixed order (rows in key order).
//!
//! Owns: [`RouterState::render_metrics`].
//! Never: count anything (it reads what the state counted), or take a lock (the caller
//! holds the state's).

use super::{RouterState, WorkerEvictions};
use crate::service::metrics::{Exposition, ReasonLabels, SourceLabels, TierLabels, WorkerLabels};
use kvtwin::tier::Tier;

impl RouterState {
    /// The OpenMetrics text (`metrics::CONTENT_TYPE`): the counters, the sources'
    /// connections and the state's sizes.
    pub fn render_metrics(&self) -> String {
        let mut out = Exposition::new();
        self.metrics.expose(&mut out);
        self.expose_sources(&mut out);
        self.expose_sizes(&mut out);
        self.expose_serving(&mut out);
        self.expose_shared(&mut out);
        out.finish()
    }

    /// The shared tier's index, when a shared source feeds it.
    fn expose_shared(&self, out: &mut Exposition) {
        let shared = self.shared();
        if !shared.enabled() {
            return;
        }
        let counts = &shared.counts;
        out.gauge(
            "kvtwin_router_shared_blocks",
            "Distinct blocks the shared store holds, as its KV events said (credited, never routed to).",
            shared.blocks() as u64,
        );
        out.counter(
            "kvtwin_router_shared_events_received_total",
            "KV events of the shared store received.",
            counts.events,
        );
        out.counter(
            "kvtwin_router_shared_events_applied_total",
            "KV events of the shared store applied to its index.",
            counts.applied,
        );
        out.counters(
            "kvtwin_router_shared_events_dropped_total",
            "Messages, batches or events of the shared store refused, by reason.",
            counts
                .dropped
                .iter()
                .map(|(reason, count)| (ReasonLabels { reason }, *count))
                .collect(),
        );
        out.counter(
            "kvtwin_router_shared_lost_batches_total",
            "Batches of the shared store's stream lost for good.",
            counts.lost_batches,
        );
        out.counter(
            "kvtwin_router_shared_restarts_total",
            "Restarts of the shared store (its blocks cleared, then announced again).",
            counts.restarts,
        );
    }

    fn expose_sources(&self, out: &mut Exposition) {
        let per_source = |value: fn(&super::SourceStatus) -> u64| -> Vec<(SourceLabels, u64)> {
            self.sources
                .iter()
                .map(|(labels, status)| (labels.clone(), value(status)))
                .collect()
        };
        out.counters(
            "kvtwin_router_source_reconnects_total",
            "Reconnects of an event source's connection (ZMQ: libzmq's monitor; NATS: the client).",
            per_source(|s| s.reconnects),
        );
        out.counters(
            "kvtwin_router_source_disconnects_total",
            "Connections of an event source lost.",
            per_source(|s| s.disconnects),
        );
        out.counters(
            "kvtwin_router_source_connect_retries_total",
            "Connect attempts of an event source that failed and were retried.",
            per_source(|s| s.connect_retries),
        );
        out.gauges(
            "kvtwin_router_source_connected",
            "1 while an event source is connected.",
            per_source(|s| u64::from(s.connected)),
        );
        out.gauges(
            "kvtwin_router_source_caught_up",
            "1 once an event source's initial replay or catch-up is done (/readyz waits for all).",
            per_source(|s| u64::from(s.caught_up)),
        );
    }

    fn expose_sizes(&self, out: &mut Exposition) {
        struct Row {
            labels: WorkerLabels,
            indexed: u64,
            evictions: WorkerEvictions,
            over_declared: Option<bool>,
        }
        let rows: Vec<Row> = self
            .workers
            .iter()
            .map(|(key, entry)| {
                let summary = self.summary(*key, entry);
                Row {
                    labels: WorkerLabels {
                        worker_id: key.worker.get(),
                        dp_rank: key.dp_rank,
                    },
                    indexed: summary.indexed_blocks,
                    evictions: summary.evictions,
                    over_declared: summary.over_declared,
                }
            })
            .collect();
        let per_worker = |value: fn(&Row) -> u64| -> Vec<(WorkerLabels, u64)> {
            rows.iter().map(|r| (r.labels.clone(), value(r))).collect()
        };
        let mut per_tier = [0u64; 4];
        for entry in self.workers.values() {
            for (total, count) in per_tier.iter_mut().zip(entry.hashes.counts()) {
                *total += count;
            }
        }
        out.gauge(
            "kvtwin_router_workers",
            "Worker ranks known.",
            self.workers.len() as u64,
        );
        out.gauges(
            "kvtwin_router_blocks",
            "Blocks the workers report cached, by tier.",
            Tier::ALL
                .iter()
                .map(|tier| (TierLabels { tier: tier.name() }, per_tier[tier.index()]))
                .collect(),
        );
        out.gauge(
            "kvtwin_router_index_pairs",
            "(worker, block) pairs in the index.",
            self.indexer.pairs() as u64,
        );
        out.gauge(
            "kvtwin_router_index_blocks",
            "Distinct blocks in the index (what --max-blocks caps).",
            self.indexer.distinct_blocks() as u64,
        );
        out.gauge(
            "kvtwin_router_index_max_blocks",
            "The index's cap on distinct blocks (0: none).",
            self.limits.budget.max_blocks.unwrap_or(0) as u64,
        );
        out.gauge(
            "kvtwin_router_index_heap_bytes",
            "Heap bytes of the index (tree, position table, recency).",
            self.indexer.heap_bytes() as u64,
        );
        out.gauge(
            "kvtwin_router_heap_bytes",
            "Heap bytes of the index and every worker rank's engine-hash map.",
            self.heap_bytes() as u64,
        );
        out.gauges(
            "kvtwin_router_worker_indexed_blocks",
            "Blocks the index holds for each worker rank.",
            per_worker(|r| r.indexed),
        );
        out.gauges(
            "kvtwin_router_worker_over_declared",
            "1 when a worker rank reports more blocks than its declared capacity.",
            rows.iter()
                .filter_map(|r| r.over_declared.map(|o| (r.labels.clone(), u64::from(o))))
                .collect(),
        );
        out.counter(
            "kvtwin_router_event_id_gaps_total",
            "Events whose id did not follow their worker rank's previous one.",
            self.indexer.stats().event_id_gaps,
        );
        out.counters(
            "kvtwin_router_evicted_blocks_total",
            "Blocks the index budget evicted from a worker rank's view.",
            per_worker(|r| r.evictions.evicted_blocks),
        );
        out.counters(
            "kvtwin_router_evicted_removals_total",
            "Removals of blocks the budget had evicted (not errors).",
            per_worker(|r| r.evictions.evicted_removals),
        );
        out.counters(
            "kvtwin_router_stored_under_evicted_total",
            "Stores skipped because the budget had evicted their parent.",
            per_worker(|r| r.evictions.stored_under_evicted),
        );
        out.counters(
            "kvtwin_router_engine_hash_evictions_total",
            "Engine-hash entries evicted to hold a worker rank's map within the caps.",
            per_worker(|r| r.evictions.engine_hash_evictions),
        );
        out.gauge(
            "kvtwin_router_engine_hash_entries",
            "Engine-hash entries of every worker rank (counted against --max-blocks).",
            self.engine_entries as u64,
        );
    }
}
