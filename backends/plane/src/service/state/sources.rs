//! The router's event sources as the state sees them: each connection's counts
//! (connects, disconnects, reconnects, connect retries) and whether it has caught up
//! (its initial replay done), which `/readyz` answers from.
//!
//! Owns: [`SourceTable`], [`SourceStatus`] and [`ConnectionEvent`].
//! Never: watch a socket (sources observe their connections and report here), or hold
//! more than [`SOURCES_MAX`] rows (a router has one per `--zmq` flag, or one NATS
//! subscription).

use crate::service::metrics::SourceLabels;
use std::collections::BTreeMap;

/// Sources tracked at most; later registrations are ignored (never counted, never
/// waited for).
pub const SOURCES_MAX: usize = 4096;

/// What a source saw happen to its connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConnectionEvent {
    /// Connected; a reconnect when it had connected before.
    Connected,
    /// The connection went away.
    Disconnected,
    /// A connect attempt failed and will be retried (after libzmq's backoff).
    ConnectRetried,
}

/// One source's connection counts and readiness.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SourceStatus {
    /// Connected now (as last reported).
    pub connected: bool,
    /// Connections made, the first included.
    pub connects: u64,
    /// Connections lost.
    pub disconnects: u64,
    /// Connections made again after the first.
    pub reconnects: u64,
    /// Connect attempts that failed and were retried.
    pub connect_retries: u64,
    /// Its initial replay or catch-up is done.
    pub caught_up: bool,
}

/// Every source registered, in label order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SourceTable {
    sources: BTreeMap<SourceLabels, SourceStatus>,
}

impl SourceTable {
    /// Forgets `source` (an engine removed while the router runs): no longer counted or
    /// waited for. Whether it was known.
    pub fn unregister(&mut self, source: &SourceLabels) -> bool {
        self.sources.remove(source).is_some()
    }

    /// Adds `source` (already caught up or not); a known one keeps its counts but takes
    /// the new readiness. Past [`SOURCES_MAX`], ignored.
    pub fn register(&mut self, source: SourceLabels, caught_up: bool) {
        if self.sources.len() >= SOURCES_MAX && !self.sources.contains_key(&source) {
            return;
        }
        self.sources.entry(source).or_default().caught_up = caught_up;
    }

    /// Marks `source` caught up; whether it was not before (unknown sources: false).
    pub fn caught_up(&mut self, source: &SourceLabels) -> bool {
        match self.sources.get_mut(source) {
            Some(status) if !status.caught_up => {
                status.caught_up = true;
                true
            }
            _ => false,
        }
    }

    /// Records `event` on `source`; whether it was a reconnect. Unknown sources are
    /// ignored.
    pub fn connection(&mut self, source: &SourceLabels, event: ConnectionEvent) -> bool {
        let Some(status) = self.sources.get_mut(source) else {
            return false;
        };
        match event {
            ConnectionEvent::Connected => {
                let again = status.connects > 0;
                status.connects += 1;
                status.connected = true;
                if again {
                    status.reconnects += 1;
                }
                again
            }
            ConnectionEvent::Disconnected => {
                status.disconnects += 1;
                status.connected = false;
                false
            }
            ConnectionEvent::ConnectRetried => {
                status.connect_retries += 1;
                false
            }
        }
    }

    /// Adds `count` reconnects to `source` (a client that reports reconnects as a count,
    /// like async-nats).
    pub fn reconnected(&mut self, source: &SourceLabels, count: u64) {
        if let Some(status) = self.sources.get_mut(source) {
            status.reconnects += count;
            status.connects += count;
            status.connected = true;
        }
    }

    /// Every source and its status, in label order.
    pub fn iter(&self) -> impl Iterator<Item = (&SourceLabels, &SourceStatus)> {
        self.sources.iter()
    }

    /// `Ok` when every source has caught up, otherwise what is still catching up
    /// (`zmq tcp://...`, comma-separated).
    pub fn readiness(&self) -> Result<(), String> {
        let pending: Vec<String> = self
            .sources
            .iter()
            .filter(|(_, status)| !status.caught_up)
            .map(|(source, _)| format!("{} {}", source.transport, source.endpoint))
            .collect();
        if pending.is_empty() {
            Ok(())
        } else {
            Err(format!("catching up: {}", pending.join(", ")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zmq(endpoint: &str) -> SourceLabels {
        SourceLabels {
            transport: "zmq",
            endpoint: endpoint.to_string(),
        }
    }

    #[test]
    fn a_second_connect_is_a_reconnect_and_readiness_waits_for_every_source() {
        let mut table = SourceTable::default();
        assert_eq!(table.readiness(), Ok(()));
        table.register(zmq("tcp://a:1"), false);
        table.register(zmq("tcp://b:2"), true);
        assert_eq!(
            table.readiness(),
            Err("catching up: zmq tcp://a:1".to_string())
        );
        assert!(!table.connection(&zmq("tcp://a:1"), ConnectionEvent::Connected));
        assert!(!table.connection(&zmq("tcp://a:1"), ConnectionEvent::Disconnected));
        assert!(!table.connection(&zmq("tcp://a:1"), ConnectionEvent::ConnectRetried));
        assert!(table.connection(&zmq("tcp://a:1"), ConnectionEvent::Connected));
        // Unknown sources are not counted.
        assert!(!table.connection(&zmq("tcp://c:3"), ConnectionEvent::Connected));
        assert!(table.caught_up(&zmq("tcp://a:1")));
        assert!(!table.caught_up(&zmq("tcp://a:1")));
        assert_eq!(table.readiness(), Ok(()));
        let status = table.iter().next().unwrap().1;
        assert_eq!(
            (
                status.connects,
                status.disconnects,
                status.reconnects,
                status.connect_retries
            ),
            (2, 1, 1, 1)
        );
        assert!(status.connected);
    }
}
