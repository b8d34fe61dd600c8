//! The front door's `/metrics`: per engine, whether it is up, what runs there, what it
//! served and how fast, in vLLM's metric names under the router's prefix (vLLM's
//! `vllm:time_to_first_token_seconds` is `kvtwin_router_time_to_first_token_seconds`
//! here, labelled `worker_id`, with vLLM's buckets), so a dashboard built for vLLM reads
//! the router's view of the same engines alike.
//!
//! Owns: [`RouterState::expose_serving`].
//! Never: count anything (the state did), or write families when no engine was ever
//! configured (a router of events alone shows none of them).

use super::super::RouterState;
use super::ServedStats;
use crate::service::metrics::{Exposition, ReasonLabels};
use prometheus_client::encoding::EncodeLabelSet;

/// An engine's labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EngineLabels {
    worker_id: u64,
}

/// An engine's labels with a reason.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EngineReasonLabels {
    worker_id: u64,
    reason: &'static str,
}

impl RouterState {
    /// Adds the front door's families to `out`, engines in worker order.
    pub(in crate::service::state) fn expose_serving(&self, out: &mut Exposition) {
        let serving = &self.serving;
        if !serving.has_engines() {
            return;
        }
        let engines: Vec<(EngineLabels, super::EngineSummary)> = serving
            .engine_urls()
            .into_iter()
            .filter_map(|(worker, _)| {
                let engine = serving.engine(worker)?;
                Some((
                    EngineLabels {
                        worker_id: worker.get(),
                    },
                    engine,
                ))
            })
            .collect();
        let per_engine = |value: fn(&super::EngineSummary) -> u64| -> Vec<(EngineLabels, u64)> {
            engines
                .iter()
                .map(|(labels, engine)| (labels.clone(), value(engine)))
                .collect()
        };
        let stats = |value: fn(&ServedStats) -> u64| -> Vec<(EngineLabels, u64)> {
            engines
                .iter()
                .map(|(labels, engine)| (labels.clone(), value(&engine.stats)))
                .collect()
        };
        out.gauges(
            "kvtwin_router_engine_up",
            "1 while an engine's health check answers (it is routed to).",
            per_engine(|e| u64::from(e.health == super::EngineHealth::Up)),
        );
        out.gauge(
            "kvtwin_router_engines_up",
            "Engines up.",
            serving.engines_up() as u64,
        );
        out.gauges(
            "kvtwin_router_num_requests_running",
            "Requests in flight on an engine (vLLM: num_requests_running).",
            per_engine(|e| e.active_requests),
        );
        out.gauges(
            "kvtwin_router_active_blocks",
            "Blocks of the requests in flight on an engine, prompt and output so far (the load the router weighs).",
            per_engine(|e| e.active_blocks),
        );
        out.counters(
            "kvtwin_router_request_dispatches_total",
            "Requests sent to an engine (each try).",
            stats(|s| s.dispatched),
        );
        out.counters(
            "kvtwin_router_request_success_total",
            "Requests an engine answered in full (vLLM: request_success).",
            stats(|s| s.succeeded),
        );
        out.counters(
            "kvtwin_router_request_retries_total",
            "Requests that failed on an engine before answering and were sent to another.",
            stats(|s| s.retried),
        );
        out.counters(
            "kvtwin_router_request_failures_total",
            "Requests that failed for good on an engine, by reason.",
            engines
                .iter()
                .flat_map(|(labels, engine)| {
                    engine.stats.failed.iter().map(|(reason, count)| {
                        (
                            EngineReasonLabels {
                                worker_id: labels.worker_id,
                                reason,
                            },
                            *count,
                        )
                    })
                })
                .collect(),
        );
        out.counters(
            "kvtwin_router_requests_refused_total",
            "Requests refused before any engine (bad request, no engine up, unknown model, at capacity), by reason.",
            serving
                .refused()
                .iter()
                .map(|(reason, count)| (ReasonLabels { reason }, *count))
                .collect(),
        );
        out.counters(
            "kvtwin_router_requests_untokenized_total",
            "Requests whose prompt the router could not tokenize (routed on load alone), by reason.",
            serving
                .untokenized()
                .iter()
                .map(|(reason, count)| (ReasonLabels { reason }, *count))
                .collect(),
        );
        out.counters(
            "kvtwin_router_prompt_tokens_total",
            "Prompt tokens of the requests answered (vLLM: prompt_tokens).",
            stats(|s| s.prompt_tokens),
        );
        out.counters(
            "kvtwin_router_generation_tokens_total",
            "Output tokens of the requests answered (vLLM: generation_tokens).",
            stats(|s| s.generation_tokens),
        );
        out.counters(
            "kvtwin_router_prefix_cache_hits_tokens_total",
            "Prompt tokens the engine reported cached, requests answered (vLLM: prefix_cache_hits); the served hit ratio is this over prompt_tokens.",
            stats(|s| s.cached_tokens),
        );
        out.counters(
            "kvtwin_router_prefix_cache_predicted_hits_tokens_total",
            "Prompt tokens the router predicted cached (overlap at dispatch), requests answered.",
            stats(|s| s.predicted_cached_tokens),
        );
        out.histograms(
            "kvtwin_router_time_to_first_token_seconds",
            "Time from arrival to the first output token, streamed requests (vLLM: time_to_first_token_seconds).",
            engines
                .iter()
                .map(|(labels, engine)| (labels.clone(), &engine.stats.ttft))
                .collect(),
        );
        out.histograms(
            "kvtwin_router_inter_token_latency_seconds",
            "Time between output chunks, streamed requests (vLLM: inter_token_latency_seconds).",
            engines
                .iter()
                .map(|(labels, engine)| (labels.clone(), &engine.stats.itl))
                .collect(),
        );
        out.histograms(
            "kvtwin_router_e2e_request_latency_seconds",
            "Time from arrival to the answer's last byte (vLLM: e2e_request_latency_seconds).",
            engines
                .iter()
                .map(|(labels, engine)| (labels.clone(), &engine.stats.e2e))
                .collect(),
        );
        if let Some(trace) = serving.trace_counts() {
            out.counter(
                "kvtwin_router_trace_rows_written_total",
                "Served requests written to the --record-trace file.",
                trace.written.load(std::sync::atomic::Ordering::Relaxed),
            );
            out.counters(
                "kvtwin_router_trace_rows_dropped_total",
                "Served requests not written to the --record-trace file, by reason.",
                trace
                    .dropped()
                    .into_iter()
                    .map(|(reason, count)| (ReasonLabels { reason }, count))
                    .collect(),
            );
        }
    }
}
