//! `kvtwin router`'s shared-store flags: a shared block store's KV events (`kvtwin store
//! --events-zmq` / `--events-nats`) followed into the router state's shared index, and
//! the credit its blocks get.
//!
//! Owns: [`SharedArgs`], the parsing of `--shared-events ENDPOINT[,replay=ENDPOINT]` and
//! [`start_shared`]. Never: index or weigh anything itself (`kvtwin_plane::service`'s
//! state does), or make the store a worker.

use crate::args::nats::connect_nats;
use crate::args::zmq::{parse_zmq_source, ZmqSourceArg};
use crate::runtime::stopped;
use anyhow::{bail, Context, Result};
use clap::Args;
use kvtwin::ids::WorkerId;
use kvtwin_plane::service::http::SharedState;
use kvtwin_plane::service::source::{start_vllm_source_to, ZmqSource};
use kvtwin_plane::service::state::shared::{
    EventTarget, DEFAULT_SHARED_CREDIT, DEFAULT_STORE_WORKER_ID,
};
use tokio::sync::watch;

/// A shared block store the engines read (`kvtwin store`): its events kept in an index
/// of their own, never routed to, and its blocks credited by the front door's scheduler.
#[derive(Args, Debug)]
pub(crate) struct SharedArgs {
    /// The store's KV events in vLLM's format over ZMQ (its `--events-zmq`, and its
    /// `--events-replay` as `replay=`).
    #[arg(long, value_name = "ENDPOINT[,replay=ENDPOINT]", value_parser = parse_shared_events)]
    shared_events: Option<ZmqSourceArg>,
    /// The store's KV events as Dynamo RouterEvents from this NATS server (with the
    /// --nats-* credentials).
    #[arg(long, value_name = "URL")]
    shared_nats: Option<String>,
    /// The NATS subject of the store's events.
    #[arg(long, value_name = "SUBJECT", default_value = SHARED_SUBJECT)]
    shared_subject: String,
    /// The fraction of a block's prefill a hit found only in the shared store saves,
    /// beyond an engine's own overlap (Dynamo's shared_cache_multiplier).
    #[arg(long, value_name = "CREDIT", default_value_t = DEFAULT_SHARED_CREDIT)]
    shared_credit: f64,
}

/// The store's NATS subject by default (`kvtwin store --events-subject`'s default).
const SHARED_SUBJECT: &str = "kvtwin.shared.kv_events";

/// Parses `ENDPOINT[,replay=ENDPOINT]`, a store's events (indexed under the store's
/// default worker id).
pub(crate) fn parse_shared_events(text: &str) -> Result<ZmqSourceArg, String> {
    let mut source =
        parse_zmq_source(&format!("{DEFAULT_STORE_WORKER_ID}={text}")).map_err(|error| {
            error
                .replace(&format!("{DEFAULT_STORE_WORKER_ID}="), "")
                .replace("WORKER_ID=", "")
        })?;
    source.worker = DEFAULT_STORE_WORKER_ID;
    Ok(source)
}

impl SharedArgs {
    /// What clap cannot check: the credit is a fraction.
    pub(crate) fn validate(&self) -> Result<()> {
        let credit = self.shared_credit;
        if !(0.0..=1.0).contains(&credit) {
            bail!("--shared-credit {credit}: a fraction of a block's prefill, 0 to 1");
        }
        Ok(())
    }
}

/// A shared NATS source's task.
pub(crate) type SharedTask = tokio::task::JoinHandle<
    Result<kvtwin_plane::service::nats_source::NatsSourceStats, kvtwin_plane::nats::NatsError>,
>;

/// Follows the shared store's events the flags name (ZMQ, NATS or both) into the state's
/// shared index, which is turned on with the flags' credit; nothing without them.
pub(crate) async fn start_shared(
    args: &SharedArgs,
    auth: &crate::args::nats::NatsAuthArgs,
    state: &SharedState,
    stop: &watch::Sender<bool>,
) -> Result<(Option<ZmqSource>, Option<SharedTask>)> {
    if args.shared_events.is_none() && args.shared_nats.is_none() {
        return Ok((None, None));
    }
    state
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .enable_shared(args.shared_credit);
    let zmq = match &args.shared_events {
        Some(source) => {
            let started = start_vllm_source_to(
                EventTarget::Shared,
                WorkerId::new(source.worker),
                &source.endpoint,
                source.replay.as_deref(),
                state,
            )
            .with_context(|| format!("--shared-events {}", source.endpoint))?;
            tracing::info!(
                "kvtwin router: the shared store's events from {}{}, credit {}",
                source.endpoint,
                source
                    .replay
                    .as_deref()
                    .map(|replay| format!(" (replay {replay})"))
                    .unwrap_or_default(),
                args.shared_credit
            );
            Some(started)
        }
        None => None,
    };
    let task = match &args.shared_nats {
        Some(url) => {
            let source = connect_nats(url, &args.shared_subject, None, &auth.auth()?).await?;
            tracing::info!(
                "kvtwin router: the shared store's events from {url}, subject {}, credit {}",
                args.shared_subject,
                args.shared_credit
            );
            Some(tokio::spawn(source.run_to(
                EventTarget::Shared,
                state.clone(),
                stopped(stop),
            )))
        }
        None => None,
    };
    Ok((zmq, task))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_events_parse_like_an_engines_without_a_worker_id() {
        let source =
            parse_shared_events("tcp://127.0.0.1:5600,replay=tcp://127.0.0.1:5601").unwrap();
        assert_eq!(source.worker, DEFAULT_STORE_WORKER_ID);
        assert_eq!(source.endpoint, "tcp://127.0.0.1:5600");
        assert_eq!(source.replay.as_deref(), Some("tcp://127.0.0.1:5601"));
        let error = parse_shared_events("127.0.0.1:5600").unwrap_err();
        assert!(error.contains("not a ZMQ endpoint"), "{error}");
        assert!(!error.contains("WORKER_ID"), "{error}");
    }

    #[test]
    fn the_credit_defaults_to_dynamos_and_must_be_a_fraction() {
        use clap::Parser;
        #[derive(Parser, Debug)]
        struct Cli {
            #[command(flatten)]
            shared: SharedArgs,
        }
        let parsed = Cli::try_parse_from(["router"]).unwrap();
        assert_eq!(parsed.shared.shared_credit, 0.5);
        assert!(parsed.shared.shared_events.is_none());
        assert_eq!(parsed.shared.shared_subject, "kvtwin.shared.kv_events");
        let high = Cli::try_parse_from(["router", "--shared-credit", "1.5"]).unwrap();
        assert!(high.shared.validate().is_err());
    }
}
