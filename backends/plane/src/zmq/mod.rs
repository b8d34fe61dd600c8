//! ZMQ transport for engine KV events, as vLLM and SGLang publish them (WIRE.md).
//!
//! Owns: [`ZmqSubscriber`] (a SUB socket on an engine's live stream, with sequence
//! tracking, gap recovery through the engine's replay ROUTER over a DEALER, and restart
//! detection), [`ZmqPublisher`] (the same stream from our side: a PUB socket, a buffer of
//! the last batches and a replay ROUTER served by its own thread), the owned-frame checks
//! of what they carry ([`decode_live`], [`decode_replay`]: a `wire::frames::RawBatch` or a
//! `wire::frames::FrameError`) and [`ZmqError`].
//! Frames are checked here (count, sequence width); payloads stay opaque bytes that
//! `crate::wire` decodes, so the transport never depends on an engine version's event
//! encoding.
//! Never: decode a payload, apply an event, or block without a timeout (every receive is
//! bounded, so a dead engine is a timeout, not a hang).
//!
//! The `zmq` crate builds libzmq from source (zeromq-src), so nothing needs installing.

mod publisher;
mod subscriber;

pub use publisher::{Delivery, PublisherConfig, PublisherStats, ZmqPublisher};
pub use subscriber::{
    CatchUp, SubscriberConfig, SubscriberItem, SubscriberStats, ZmqSubscriber, RECONNECT_IVL,
    RECONNECT_IVL_MAX,
};

use crate::wire::frames::{parse_sequence, FrameError, RawBatch};

/// A ZMQ call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ZmqError {
    /// A socket operation failed.
    #[error("zmq {op} {endpoint}: {source}")]
    Socket {
        /// What was being done.
        op: &'static str,
        /// The endpoint involved (may be empty).
        endpoint: String,
        /// libzmq's error.
        source: zmq::Error,
    },
    /// The replay thread could not be started.
    #[error("could not start the replay thread: {0}")]
    Spawn(#[source] std::io::Error),
}

/// The error of `op` on `endpoint`.
fn socket_error(op: &'static str, endpoint: &str) -> impl FnOnce(zmq::Error) -> ZmqError {
    let endpoint = endpoint.to_string();
    move |source| ZmqError::Socket {
        op,
        endpoint,
        source,
    }
}

/// Decodes a live message: exactly `[topic, seq, payload]`.
pub fn decode_live(mut frames: Vec<Vec<u8>>) -> Result<RawBatch, FrameError> {
    if frames.len() != 3 {
        return Err(FrameError::FrameCount {
            frames: frames.len(),
            expected: "3 (topic, sequence, payload)",
        });
    }
    let payload = frames.pop().unwrap_or_default();
    let seq = parse_sequence(&frames[1])?;
    let topic = std::mem::take(&mut frames[0]);
    Ok(RawBatch {
        topic,
        seq,
        payload,
        replayed: false,
    })
}

/// Decodes a replay reply as a DEALER receives it: `[b"", topic, seq, payload]`, or
/// `[b"", seq, payload]` from vLLM 0.25 and older. The end marker is a reply whose
/// sequence is `wire::END_OF_REPLAY` (its payload is empty).
pub fn decode_replay(mut frames: Vec<Vec<u8>>) -> Result<RawBatch, FrameError> {
    if !(3..=4).contains(&frames.len()) {
        return Err(FrameError::FrameCount {
            frames: frames.len(),
            expected: "3 or 4 (delimiter, [topic,] sequence, payload)",
        });
    }
    if !frames[0].is_empty() {
        return Err(FrameError::Delimiter);
    }
    let payload = frames.pop().unwrap_or_default();
    let seq = parse_sequence(&frames[frames.len() - 1])?;
    let topic = if frames.len() == 3 {
        std::mem::take(&mut frames[1])
    } else {
        Vec::new()
    };
    Ok(RawBatch {
        topic,
        seq,
        payload,
        replayed: true,
    })
}

/// Binds `socket` to `endpoint`, retrying briefly: libzmq closes sockets in the
/// background, so a publisher restarted on the same port can find it still taken for a
/// moment.
fn bind_with_retry(socket: &zmq::Socket, endpoint: &str) -> Result<String, ZmqError> {
    let mut tries = 0;
    loop {
        match socket.bind(endpoint) {
            Ok(()) => break,
            Err(zmq::Error::EADDRINUSE) if tries < 50 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(source) => return Err(socket_error("bind", endpoint)(source)),
        }
    }
    // The endpoint as bound (a `*` port resolved), for the peer to connect to.
    Ok(socket
        .get_last_endpoint()
        .ok()
        .and_then(Result::ok)
        .unwrap_or_else(|| endpoint.to_string()))
}

#[cfg(test)]
mod tests;
