//! An engine's KV event stream over ZMQ on the command line: `--zmq
//! WORKER_ID=ENDPOINT[,replay=ENDPOINT]` as `kvtwin router`, `kvtwin advisor` and `kvtwin
//! dash` take it, and a bare endpoint as `kvtwin relay` takes it.
//!
//! Owns: [`ZmqSourceArg`] and the strict parsing of both shapes ([`parse_zmq_source`],
//! [`zmq_endpoint`]), subscribing to the engines named ([`start_zmq_sources`]) and the
//! words that describe one ([`describe_zmq_source`]).
//! Never: decode or apply an event itself (`kvtwin_plane::service` does).

use anyhow::{Context, Result};
use kvtwin::ids::WorkerId;
use kvtwin_plane::service::http::SharedState;
use kvtwin_plane::service::source::{start_vllm_source, ZmqSource};

/// One engine a router subscribes to: `WORKER_ID=ENDPOINT[,replay=ENDPOINT]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ZmqSourceArg {
    /// The worker id its events are indexed under.
    pub(crate) worker: u64,
    /// The engine's PUB endpoint.
    pub(crate) endpoint: String,
    /// The engine's replay ROUTER, if any.
    pub(crate) replay: Option<String>,
}

/// A ZMQ endpoint as libzmq takes it: `transport://address`, nothing around it.
fn check_endpoint(what: &str, endpoint: &str) -> Result<(), String> {
    match endpoint.split_once("://") {
        Some((transport, address))
            if !transport.is_empty()
                && !address.is_empty()
                && !endpoint.chars().any(char::is_whitespace) =>
        {
            Ok(())
        }
        _ => Err(format!(
            "{what} {endpoint:?} is not a ZMQ endpoint (transport://address, e.g. tcp://127.0.0.1:5557)"
        )),
    }
}

/// Parses `WORKER_ID=ENDPOINT[,replay=ENDPOINT]`; any other shape is an error that says
/// what was expected.
pub(crate) fn parse_zmq_source(text: &str) -> Result<ZmqSourceArg, String> {
    let expected = concat!(
        "expected WORKER_ID=ENDPOINT[,replay=ENDPOINT], ",
        "e.g. 1=tcp://127.0.0.1:5557,replay=tcp://127.0.0.1:5558"
    );
    let (worker, rest) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?}: no worker id; {expected}"))?;
    let worker: u64 = worker.parse().map_err(|_| {
        format!("{text:?}: worker id {worker:?} is not an unsigned integer; {expected}")
    })?;
    let mut parts = rest.split(',');
    let endpoint = parts.next().unwrap_or_default();
    check_endpoint("endpoint", endpoint).map_err(|error| format!("{text:?}: {error}"))?;
    let mut replay = None;
    for option in parts {
        match option.split_once('=') {
            Some(("replay", value)) if replay.is_none() => {
                check_endpoint("replay endpoint", value)
                    .map_err(|error| format!("{text:?}: {error}"))?;
                replay = Some(value.to_string());
            }
            Some(("replay", _)) => return Err(format!("{text:?}: replay given twice")),
            _ => return Err(format!("{text:?}: unknown option {option:?}; {expected}")),
        }
    }
    Ok(ZmqSourceArg {
        worker,
        endpoint: endpoint.to_string(),
        replay,
    })
}

/// An endpoint alone (`kvtwin relay --zmq`, `--replay`), checked as in a source.
pub(crate) fn zmq_endpoint(text: &str) -> Result<String, String> {
    check_endpoint("endpoint", text).map(|()| text.to_string())
}

/// Subscribes to each engine of `sources`, applying their events to `state` (the router
/// service's sources, also a dashboard replica's); stopped when dropped.
/// Prints nothing: callers say what they started ([`describe_zmq_source`]), a dashboard
/// cannot print under its screen.
pub(crate) fn start_zmq_sources(
    sources: &[ZmqSourceArg],
    state: &SharedState,
) -> Result<Vec<ZmqSource>> {
    sources
        .iter()
        .map(|source| {
            start_vllm_source(
                WorkerId::new(source.worker),
                &source.endpoint,
                source.replay.as_deref(),
                state,
            )
            .with_context(|| format!("subscribing to {}", source.endpoint))
        })
        .collect()
}

/// "worker W from ENDPOINT (replay ENDPOINT)".
pub(crate) fn describe_zmq_source(source: &ZmqSourceArg) -> String {
    format!(
        "worker {} from {}{}",
        source.worker,
        source.endpoint,
        source
            .replay
            .as_deref()
            .map(|replay| format!(" (replay {replay})"))
            .unwrap_or_default()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zmq_sources_parse_with_and_without_replay() {
        assert_eq!(
            parse_zmq_source("1=tcp://127.0.0.1:5557"),
            Ok(ZmqSourceArg {
                worker: 1,
                endpoint: "tcp://127.0.0.1:5557".into(),
                replay: None,
            })
        );
        assert_eq!(
            parse_zmq_source("18446744073709551615=ipc:///tmp/kv,replay=tcp://10.0.0.2:5558"),
            Ok(ZmqSourceArg {
                worker: u64::MAX,
                endpoint: "ipc:///tmp/kv".into(),
                replay: Some("tcp://10.0.0.2:5558".into()),
            })
        );
    }

    #[test]
    fn malformed_zmq_sources_are_refused_with_what_was_expected() {
        for (text, says) in [
            ("tcp://127.0.0.1:5557", "no worker id"),
            ("5557", "no worker id"),
            ("-1=tcp://h:1", "not an unsigned integer"),
            ("w=tcp://h:1", "not an unsigned integer"),
            ("1=", "not a ZMQ endpoint"),
            ("1=127.0.0.1:5557", "not a ZMQ endpoint"),
            ("1=tcp://", "not a ZMQ endpoint"),
            ("1=tcp://h:1,", "unknown option"),
            ("1=tcp://h:1,replay", "unknown option"),
            ("1=tcp://h:1,replay=", "not a ZMQ endpoint"),
            ("1=tcp://h:1,replay=h:2", "not a ZMQ endpoint"),
            (
                "1=tcp://h:1,replay=tcp://h:2,replay=tcp://h:3",
                "replay given twice",
            ),
            ("1=tcp://h:1,topic=kv", "unknown option"),
            ("1=tcp://h 1", "not a ZMQ endpoint"),
        ] {
            let error = parse_zmq_source(text).expect_err(text);
            assert!(error.contains(says), "{text}: {error}");
        }
    }
}
