//! The tokio runtime and the stop signal of the commands that run until Ctrl-C (`kvtwin
//! router`, `relay`, `store`, `advisor` live).
//!
//! Owns: [`runtime`], and the stop watch: [`stop_on_signal`] turns it true on SIGINT or
//! SIGTERM, [`signal_stop`] by hand, and [`stopped`] resolves then.
//! Never: decide what a command does when it stops (each drains its own work).

use anyhow::{Context, Result};
use tokio::sync::watch;

pub(crate) fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")
}

/// A watch that turns true on Ctrl-C (or SIGTERM), and a future per subscriber that
/// resolves then. The handlers are installed before this returns, so a signal sent as
/// soon as the caller says it is ready is never missed: until then SIGINT keeps the
/// disposition the process inherited, which under a parent that ignores it (a
/// non-interactive shell's `&`) would make Ctrl-C do nothing at all.
pub(crate) fn stop_on_signal() -> Result<watch::Sender<bool>> {
    let (stop, _) = watch::channel(false);
    let sender = stop.clone();
    #[cfg(unix)]
    let (mut interrupt, mut terminate) = {
        use tokio::signal::unix::{signal, SignalKind};
        (
            signal(SignalKind::interrupt()).context("listening for SIGINT")?,
            signal(SignalKind::terminate()).context("listening for SIGTERM")?,
        )
    };
    tokio::spawn(async move {
        #[cfg(unix)]
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
        tracing::info!("stopping");
        signal_stop(&sender);
    });
    Ok(stop)
}

/// Turns the stop watch true, whether or not anything listens yet: a signal can come
/// before the first `stopped` subscribes (right after the router says it listens), and
/// `watch::Sender::send` with no receiver leaves the value as it was, which had left a
/// router interrupted at that moment running forever.
pub(crate) fn signal_stop(stop: &watch::Sender<bool>) {
    stop.send_replace(true);
}

pub(crate) fn stopped(
    stop: &watch::Sender<bool>,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let mut receiver = stop.subscribe();
    async move {
        let _ = receiver.wait_for(|stop| *stop).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stop_signalled_before_anything_listens_still_stops_later_listeners() {
        let (stop, first) = watch::channel(false);
        drop(first);
        signal_stop(&stop);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let late = runtime.block_on(async {
            tokio::time::timeout(std::time::Duration::from_secs(5), stopped(&stop)).await
        });
        assert!(
            late.is_ok(),
            "a listener subscribed after the signal never stopped"
        );
    }
}
