//! `kvtwin dash --router URL`: a running router's `/v1/stream` as a dashboard source.
//!
//! Owns: [`RouterSource`] (a [`LiveFeed`] from a task that connects, over http or https
//! and with the router's token when given, reads stream messages into deltas, and on any
//! failure (a 401 included) says so in the status line and connects again with backoff).
//! Never: poll the router's other endpoints, or parse SSE or JSON itself
//! (`kvtwin_plane::service::stream_client` does).

use super::model::{TimedUpdate, Update};
use super::plane_delta::delta_of_message;
use super::source::{LiveClock, LiveFeed};
use anyhow::{bail, Result};
use kvtwin_plane::service::client::ClientAccess;
use kvtwin_plane::service::stream_client::StreamClient;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// The first wait before connecting again; it doubles up to [`BACKOFF_MAX`].
const BACKOFF_START: Duration = Duration::from_millis(250);
/// The longest wait between attempts.
const BACKOFF_MAX: Duration = Duration::from_secs(8);
/// Updates between the reading task and the terminal loop. The task waits when the
/// loop is behind (TCP then holds the router back); deltas are never dropped, since a
/// row left out would be wrong until it next changed.
const CHANNEL_BOUND: usize = 64;

/// A router's stream.
pub(crate) struct RouterSource;

/// Stops the reading task when the feed goes.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl RouterSource {
    /// Starts reading `url` (`http://HOST:PORT` or `https://HOST:PORT`) with `access`'s
    /// token and roots; must run inside a tokio runtime.
    pub(crate) fn start(url: &str, access: ClientAccess) -> Result<LiveFeed> {
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            bail!("{url:?} is not a router URL: http[s]://HOST:PORT, e.g. http://127.0.0.1:8080");
        }
        let clock = LiveClock::start();
        let (sender, updates) = mpsc::channel(CHANNEL_BOUND);
        let task = tokio::spawn(read_forever(url.to_string(), access, sender, clock));
        Ok(LiveFeed::new(
            updates,
            clock,
            url.to_string(),
            AbortOnDrop(task),
        ))
    }
}

/// Connects, reads, and connects again, until the receiver goes.
async fn read_forever(
    url: String,
    access: ClientAccess,
    sender: mpsc::Sender<TimedUpdate>,
    clock: LiveClock,
) {
    let mut backoff = BACKOFF_START;
    loop {
        let error = match StreamClient::connect_with(&url, &access).await {
            Ok(mut client) => {
                if sender
                    .send(clock.status(true, format!("connected to {url}")))
                    .await
                    .is_err()
                {
                    return;
                }
                backoff = BACKOFF_START;
                loop {
                    match client.next().await {
                        Ok(Some(message)) => {
                            let update = TimedUpdate {
                                at_ms: clock.now_ms(),
                                update: Update::Delta(delta_of_message(&message)),
                            };
                            if sender.send(update).await.is_err() {
                                return;
                            }
                        }
                        Ok(None) => break "the router closed the stream".to_string(),
                        Err(error) => break error.to_string(),
                    }
                }
            }
            Err(error) => error.to_string(),
        };
        // What the user acts on first: a narrow status line cuts the end off.
        let text = format!("retrying in {:.1} s: {url}: {error}", backoff.as_secs_f64());
        if sender.send(clock.status(false, text)).await.is_err() {
            return;
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}
