//! The soak's view of the router: `GET /v1/workers` and `GET /metrics` through the
//! repository's own HTTP client (`service::client`), with the soak's bearer token, on
//! loopback, parsed into what the soak compares.
//!
//! Owns: [`RouterApi`] (the router's address and the token the soak gave it; `get`
//! and `view`), `RouterView` (per worker: blocks listed and indexed, digest, events)
//! and `metric`.
//! Never: wait without a bound (every request, connection included, has a timeout),
//! or change the router.

use crate::service::auth::AuthToken;
use crate::service::client::{self, ClientAccess, RouterUrl};
use crate::service::state::RouterState;
use bytes::Bytes;
use hyper::{Method, StatusCode};
use serde_json::Value;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

/// How long one request may take, connecting and reading the body included.
const TIMEOUT: Duration = Duration::from_secs(5);

/// The soak's router: where it listens and the token it was started with.
#[derive(Clone, Debug)]
pub(super) struct RouterApi {
    address: SocketAddr,
    access: ClientAccess,
}

impl RouterApi {
    pub(super) fn new(address: SocketAddr, token: AuthToken) -> Self {
        Self {
            address,
            access: ClientAccess {
                token: Some(token),
                tls: None,
            },
        }
    }

    /// One GET on a fresh connection; the body of a 200, `None` on any failure or
    /// after [`TIMEOUT`] (the router may be down or killed: callers poll).
    pub(super) fn get(&self, runtime: &tokio::runtime::Runtime, path: &str) -> Option<String> {
        let url = RouterUrl {
            tls: false,
            authority: self.address.to_string(),
            path: path.to_string(),
        };
        let exchange = client::request(&url, &self.access, Method::GET, Bytes::new());
        let response = runtime
            .block_on(async { tokio::time::timeout(TIMEOUT, exchange).await })
            .ok()?
            .ok()?;
        if response.status() != StatusCode::OK {
            return None;
        }
        String::from_utf8(response.into_body().to_vec()).ok()
    }

    /// The router's workers, or `None` if it does not answer.
    pub(super) fn view(&self, runtime: &tokio::runtime::Runtime) -> Option<RouterView> {
        parse_workers(&self.get(runtime, "/v1/workers")?)
    }
}

/// What the router reports of one worker (rank 0).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct WorkerView {
    /// Blocks it holds as the worker reported them, all tiers.
    pub(super) blocks: u64,
    /// Blocks the index holds for it.
    pub(super) indexed_blocks: u64,
    /// `block_digest`.
    pub(super) digest: u64,
    /// Events applied whole plus events refused: what reached it.
    pub(super) received: u64,
}

/// The router's workers by worker id.
pub(super) type RouterView = BTreeMap<u64, WorkerView>;

/// `GET /v1/workers`' body as the soak compares it (rank 0 of each worker: the soak's
/// engines publish no other).
pub(super) fn parse_workers(body: &str) -> Option<RouterView> {
    let value: Value = serde_json::from_str(body).ok()?;
    let mut view = RouterView::new();
    for row in value.get("workers")?.as_array()? {
        if row.get("dp_rank")?.as_u64()? != 0 {
            continue;
        }
        let number = |key: &str| row.get(key).and_then(Value::as_u64).unwrap_or(0);
        let blocks = row
            .get("blocks")?
            .as_object()?
            .values()
            .filter_map(Value::as_u64)
            .sum();
        view.insert(
            row.get("worker")?.as_u64()?,
            WorkerView {
                blocks,
                indexed_blocks: number("indexed_blocks"),
                digest: u64::from_str_radix(row.get("block_digest")?.as_str()?, 16).ok()?,
                received: number("events") + number("dropped"),
            },
        );
    }
    Some(view)
}

/// What a router state in this process would answer, as a [`RouterView`] (the soak's
/// own rebuild from the stream).
pub(super) fn view_of(state: &RouterState) -> RouterView {
    state
        .workers()
        .iter()
        .filter(|summary| summary.key.dp_rank == 0)
        .map(|summary| {
            (
                summary.key.worker.get(),
                WorkerView {
                    blocks: summary.blocks.iter().sum(),
                    indexed_blocks: summary.indexed_blocks,
                    digest: summary.block_digest,
                    received: summary.integrity.events + summary.integrity.dropped,
                },
            )
        })
        .collect()
}

/// A counter or gauge from the Prometheus text: its one series, or the sum of its labelled ones.
pub(super) fn metric(text: &str, name: &str) -> Option<u64> {
    // Every series of the family, labelled (`name{..} v`) or not (`name v`), summed.
    let mut found = None;
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        let value = if let Some(plain) = rest.strip_prefix(' ') {
            plain
        } else if rest.starts_with('{') {
            match rest.rfind("} ") {
                Some(end) => &rest[end + 2..],
                None => continue,
            }
        } else {
            continue;
        };
        if let Ok(value) = value.trim().parse::<u64>() {
            found = Some(found.unwrap_or(0) + value);
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_and_metrics_are_read_from_what_the_router_serves() {
        let body = r#"{"workers":[
            {"worker":2,"dp_rank":0,"blocks":{"device":3,"host":1,"disk":0,"remote":0},
             "events":7,"dropped":2,"indexed_blocks":3,"block_digest":"00000000000000ff"},
            {"worker":2,"dp_rank":1,"blocks":{"device":9},"events":1,"dropped":0,
             "indexed_blocks":9,"block_digest":"0000000000000001"}]}"#;
        let view = parse_workers(body).unwrap();
        assert_eq!(view.len(), 1);
        assert_eq!(
            view[&2],
            WorkerView {
                blocks: 4,
                indexed_blocks: 3,
                digest: 0xff,
                received: 9,
            }
        );
        assert_eq!(parse_workers("{}"), None);
        let text = RouterState::new(16).render_metrics();
        assert_eq!(
            metric(&text, "kvtwin_router_events_received_total"),
            Some(0)
        );
        assert_eq!(metric(&text, "kvtwin_router_nothing"), None);
        // A labelled family is the sum of its series; a longer name is another family.
        let labelled = "# TYPE kvtwin_router_source_reconnects counter\n\
            kvtwin_router_source_reconnects_total{transport=\"nats\",endpoint=\"a\"} 2\n\
            kvtwin_router_source_reconnects_total{transport=\"zmq\",endpoint=\"b\"} 3\n\
            kvtwin_router_source_reconnects_total_extra 7\n";
        assert_eq!(
            metric(labelled, "kvtwin_router_source_reconnects_total"),
            Some(5)
        );
    }
}
