//! A typed convenience over the byte transport: Dynamo `RouterEvent`s in their JSON form,
//! one event per message (WIRE.md, "Dynamo RouterEvent"), encoded and decoded by
//! `crate::wire`.
//!
//! Owns: [`NatsPublisher::publish_event`], [`NatsPublisher::publish_events`],
//! [`NatsSubscriber::next_event`] and [`RouterEventMessage`].
//! Never: define an encoding (`crate::wire` does), or end a subscription because one
//! payload does not decode: the error comes out with its message, for the caller to count
//! by [`WireError::reason`] and skip.

use super::{NatsError, NatsMessage, NatsPublisher, NatsSubscriber};
use crate::wire::{DecodeLimits, RouterEvent, WireError};

/// A NATS message that should carry a Dynamo `RouterEvent`, and what its payload decoded
/// to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouterEventMessage {
    /// The message as received (sequence, subject, the raw payload).
    pub message: NatsMessage,
    /// The event, or why the payload is not one.
    pub event: Result<RouterEvent, WireError>,
}

impl NatsPublisher {
    /// Publishes `event` as JSON ([`publish`](Self::publish) semantics).
    pub async fn publish_event(&self, event: &RouterEvent) -> Result<Option<u64>, NatsError> {
        self.publish(event.to_json()).await
    }

    /// Publishes `events` in order, one message each, stopping at the first failure (the
    /// ones before it are published). Returns what each publish returned.
    pub async fn publish_events(
        &self,
        events: &[RouterEvent],
    ) -> Result<Vec<Option<u64>>, NatsError> {
        let mut sequences = Vec::with_capacity(events.len());
        for event in events {
            sequences.push(self.publish_event(event).await?);
        }
        Ok(sequences)
    }
}

impl NatsSubscriber {
    /// The next message ([`next`](Self::next) semantics, cancel safe too) with its payload
    /// decoded as a JSON `RouterEvent` within `limits`.
    pub async fn next_event(
        &mut self,
        limits: &DecodeLimits,
    ) -> Result<RouterEventMessage, NatsError> {
        let message = self.next().await?;
        let event = RouterEvent::from_json(&message.payload, limits);
        Ok(RouterEventMessage { message, event })
    }
}
