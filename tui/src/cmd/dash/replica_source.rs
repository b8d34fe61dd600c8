//! `kvtwin dash --zmq ...` and `--nats URL`: the dashboard as a router replica, keeping
//! the index with the router service's own code and reading it as the router's stream
//! does.
//!
//! Owns: [`ReplicaSource`] (a [`LiveFeed`] of a `RouterState` fed by `ZmqSource`s or a `NatsSource`,
//! connecting to NATS again with backoff when it cannot, and a task that reads the
//! state through a `StreamCursor` every tick).
//! Never: decode or apply an event itself (`kvtwin_plane::service` does), or route: a
//! replica only listens.

use super::model::{TimedUpdate, Update};
use super::plane_delta::delta_of_message;
use super::source::{LiveClock, LiveFeed};
use crate::args::nats::connect_nats;
use crate::args::zmq::{describe_zmq_source, start_zmq_sources, ZmqSourceArg};
use anyhow::Result;
use kvtwin::router::indexer::IndexBudget;
use kvtwin_plane::nats::NatsAuth;
use kvtwin_plane::service::http::{lock, SharedState};
use kvtwin_plane::service::source::ZmqSource;
use kvtwin_plane::service::state::{RouterLimits, RouterState};
use kvtwin_plane::service::stream::StreamCursor;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

/// How often the state is read for changes (as the router's stream does).
const READ_TICK: Duration = Duration::from_millis(100);
/// The first wait before connecting to NATS again; doubles up to 8 s.
const BACKOFF_START: Duration = Duration::from_millis(250);
const BACKOFF_MAX: Duration = Duration::from_secs(8);
/// Updates between the reading task and the terminal loop (see `RouterSource`).
const CHANNEL_BOUND: usize = 64;

/// Where a replica's events come from.
#[derive(Clone, Debug)]
pub(crate) enum ReplicaInput {
    /// Engines' ZMQ streams.
    Zmq {
        /// One per engine.
        sources: Vec<ZmqSourceArg>,
        /// The engines' block size.
        block_size: u32,
    },
    /// Dynamo RouterEvents on NATS.
    Nats(Box<NatsInput>),
}

/// A replica's NATS subscription.
#[derive(Clone, Debug)]
pub(crate) struct NatsInput {
    /// The server.
    pub(crate) url: String,
    /// The subject.
    pub(crate) subject: String,
    /// A JetStream stream to replay from its start, instead of core NATS.
    pub(crate) jetstream: Option<String>,
    /// Credentials and TLS.
    pub(crate) auth: NatsAuth,
}

/// A router replica.
pub(crate) struct ReplicaSource;

/// What feeds a replica: the ZMQ sources (stopped when dropped), the NATS and reading
/// tasks, and the watch that stops them.
struct Feeders {
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    _zmq: Vec<ZmqSource>,
}

impl Drop for Feeders {
    fn drop(&mut self) {
        let _ = self.stop.send(true);
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl ReplicaSource {
    /// Starts listening, keeping the index within `budget` as the router does; must run
    /// inside a tokio runtime.
    pub(crate) async fn start(input: ReplicaInput, budget: IndexBudget) -> Result<LiveFeed> {
        let clock = LiveClock::start();
        let (sender, updates) = mpsc::channel(CHANNEL_BOUND);
        let (stop, _) = watch::channel(false);
        // A NATS replica learns the block size from nothing; 16 is only used to hash
        // queries, which a replica never makes.
        let block_size = match &input {
            ReplicaInput::Zmq { block_size, .. } => *block_size,
            ReplicaInput::Nats(_) => 16,
        };
        let state = replica_state(block_size, budget);
        let mut tasks = Vec::new();
        let (label, zmq) = match &input {
            ReplicaInput::Zmq { sources, .. } => {
                let started = start_zmq_sources(sources, &state)?;
                let described: Vec<String> = sources.iter().map(describe_zmq_source).collect();
                let _ = sender
                    .send(clock.status(true, format!("replica of {}", described.join(", "))))
                    .await;
                (format!("of {} ZMQ engines", sources.len()), started)
            }
            ReplicaInput::Nats(nats) => {
                tasks.push(tokio::spawn(nats_forever(
                    (**nats).clone(),
                    state.clone(),
                    sender.clone(),
                    clock,
                    stop.subscribe(),
                )));
                (format!("of NATS {} {}", nats.url, nats.subject), Vec::new())
            }
        };
        tasks.push(tokio::spawn(read_state(state, sender, clock)));
        let feeders = Feeders {
            stop,
            tasks,
            _zmq: zmq,
        };
        Ok(LiveFeed::new(updates, clock, label, feeders))
    }
}

/// The replica's state: the router's, held to the same budget (an uncapped replica
/// would grow with whatever the engines publish).
fn replica_state(block_size: u32, budget: IndexBudget) -> SharedState {
    let limits = RouterLimits {
        budget,
        ..RouterLimits::default()
    };
    Arc::new(Mutex::new(RouterState::with_limits(
        block_size as usize,
        limits,
    )))
}

/// Reads the state's changes every tick until the receiver goes.
async fn read_state(state: SharedState, sender: mpsc::Sender<TimedUpdate>, clock: LiveClock) {
    let mut cursor = StreamCursor::new();
    let mut tick = tokio::time::interval(READ_TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tick.tick().await;
        // Built under the lock, translated outside it.
        let message = cursor.next(&lock(&state));
        if let Some(message) = message {
            let update = TimedUpdate {
                at_ms: clock.now_ms(),
                update: Update::Delta(delta_of_message(&message)),
            };
            if sender.send(update).await.is_err() {
                return;
            }
        }
    }
}

/// Connects to NATS and applies its events; on failure says so and tries again.
async fn nats_forever(
    nats: NatsInput,
    state: SharedState,
    sender: mpsc::Sender<TimedUpdate>,
    clock: LiveClock,
    mut stop: watch::Receiver<bool>,
) {
    let NatsInput {
        url,
        subject,
        jetstream,
        auth,
    } = nats;
    let mut backoff = BACKOFF_START;
    loop {
        let error = match connect_nats(&url, &subject, jetstream.as_deref(), &auth).await {
            Ok(source) => {
                let text = format!("replica of {url}, subject {subject}");
                if sender.send(clock.status(true, text)).await.is_err() {
                    return;
                }
                backoff = BACKOFF_START;
                let mut stopped = stop.clone();
                let shutdown = async move {
                    let _ = stopped.wait_for(|stop| *stop).await;
                };
                match source.run(state.clone(), shutdown).await {
                    Ok(_) if *stop.borrow() => return,
                    Ok(_) => "the NATS subscription ended".to_string(),
                    Err(error) => error.to_string(),
                }
            }
            Err(error) => format!("{error:#}"),
        };
        let text = format!("retrying in {:.1} s: {error}", backoff.as_secs_f64());
        if sender.send(clock.status(false, text)).await.is_err() {
            return;
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = stop.wait_for(|stop| *stop) => return,
        }
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvtwin::ids::{LocalBlockHash, WorkerId, WorkerWithDpRank};
    use kvtwin::tier::Tier;
    use kvtwin_plane::wire::{WorkerEvent, WorkerEventData};

    #[test]
    fn a_replica_keeps_the_budget_it_is_given() {
        let budget = IndexBudget {
            max_blocks: Some(100),
            max_blocks_per_worker: Some(100),
            ..IndexBudget::UNBOUNDED
        };
        let state = replica_state(16, budget);
        let mut state = lock(&state);
        assert_eq!(state.limits().budget, budget);
        // 1,000 fresh blocks, 10 chains of 100: ten times the budget.
        for chain in 0..10u64 {
            let event = WorkerEvent {
                worker: WorkerId::new(1),
                dp_rank: 0,
                event_id: chain,
                data: WorkerEventData::Stored {
                    parent: None,
                    blocks: (chain * 100..(chain + 1) * 100)
                        .map(|b| (b, LocalBlockHash::new(b)))
                        .collect(),
                    tier: Tier::Device,
                },
            };
            assert!(state.apply(&event).is_ok());
        }
        let indexer = state.indexer();
        assert!(
            indexer.distinct_blocks() <= 100,
            "{}",
            indexer.distinct_blocks()
        );
        let key = WorkerWithDpRank {
            worker: WorkerId::new(1),
            dp_rank: 0,
        };
        assert_eq!(indexer.worker_stats(key).evicted_blocks, 900);
    }
}
