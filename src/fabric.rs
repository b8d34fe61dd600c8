//! The `Fabric` trait (how MRDN frames travel between workers) and an in-process fabric.
//!
//! Owns: [`Fabric`], [`FabricHandle`], [`FabricError`] and [`InProcessFabric`], a
//! bounded in-memory map used by tests and by the simulator's same-process workers.
//! A fabric refuses a payload that is not a valid MRDN v1 frame: corruption is caught on
//! the producer's side, not only by the consumer.
//! Never: interpret frame bodies, or grow without bound (a full fabric is backpressure).

use crate::sync::{lock, Mutex};
use crate::wire::{self, DecodeError};
use std::collections::BTreeMap;
use std::fmt;

/// Names a payload pushed into a fabric until it is pulled.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FabricHandle(u64);

impl FabricHandle {
    /// Wraps a raw handle.
    pub const fn new(raw: u64) -> Self {
        Self(raw)
    }

    /// The raw handle.
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Debug for FabricHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FabricHandle({})", self.0)
    }
}

/// A fabric operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FabricError {
    /// No payload under this handle (never pushed, or already pulled).
    #[error("unknown fabric handle {0:?}")]
    UnknownHandle(FabricHandle),
    /// The payload does not fit in the fabric's remaining capacity.
    #[error("fabric full: {in_flight_bytes} of {capacity_bytes} bytes in flight, payload of {payload_bytes}")]
    Full {
        /// The fabric's bound.
        capacity_bytes: u64,
        /// Bytes held now.
        in_flight_bytes: u64,
        /// The refused payload's size.
        payload_bytes: u64,
    },
    /// The payload is not a valid MRDN frame.
    #[error("invalid frame: {0}")]
    Frame(#[from] DecodeError),
}

/// Moves MRDN frames between a producer and a consumer: `push` hands a frame over and
/// returns a handle, `pull` takes it out (once).
pub trait Fabric: Send + Sync + fmt::Debug {
    /// Hands `payload` (an MRDN frame) to the fabric.
    fn push(&self, payload: Vec<u8>) -> Result<FabricHandle, FabricError>;
    /// Takes the payload pushed under `handle`.
    fn pull(&self, handle: FabricHandle) -> Result<Vec<u8>, FabricError>;
    /// The fabric's name in reports and telemetry.
    fn label(&self) -> &'static str;
}

#[derive(Debug, Default)]
struct Slots {
    payloads: BTreeMap<u64, Vec<u8>>,
    next_handle: u64,
    in_flight_bytes: u64,
    rejected_frames: u64,
}

/// An in-memory fabric bounded by bytes in flight; usable from several threads.
#[derive(Debug)]
pub struct InProcessFabric {
    capacity_bytes: u64,
    slots: Mutex<Slots>,
}

impl InProcessFabric {
    /// A fabric holding at most `capacity_bytes` bytes of frames at once.
    pub fn new(capacity_bytes: u64) -> Self {
        Self {
            capacity_bytes,
            slots: Mutex::new(Slots {
                next_handle: 1,
                ..Slots::default()
            }),
        }
    }

    /// Bytes pushed and not yet pulled.
    pub fn in_flight_bytes(&self) -> u64 {
        lock(&self.slots).in_flight_bytes
    }

    /// Payloads refused because they were not valid MRDN frames.
    pub fn rejected_frames(&self) -> u64 {
        lock(&self.slots).rejected_frames
    }

    /// Frames pushed and not yet pulled.
    pub fn len(&self) -> usize {
        lock(&self.slots).payloads.len()
    }

    /// Whether no frame is in flight.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Fabric for InProcessFabric {
    fn push(&self, payload: Vec<u8>) -> Result<FabricHandle, FabricError> {
        let valid = wire::decode(&payload).map(|_| ());
        let payload_bytes = payload.len() as u64;
        let mut slots = lock(&self.slots);
        if let Err(error) = valid {
            slots.rejected_frames += 1;
            return Err(error.into());
        }
        if slots.in_flight_bytes.saturating_add(payload_bytes) > self.capacity_bytes {
            return Err(FabricError::Full {
                capacity_bytes: self.capacity_bytes,
                in_flight_bytes: slots.in_flight_bytes,
                payload_bytes,
            });
        }
        let handle = slots.next_handle;
        slots.next_handle += 1;
        slots.in_flight_bytes += payload_bytes;
        slots.payloads.insert(handle, payload);
        Ok(FabricHandle(handle))
    }

    fn pull(&self, handle: FabricHandle) -> Result<Vec<u8>, FabricError> {
        let mut slots = lock(&self.slots);
        let payload = slots
            .payloads
            .remove(&handle.0)
            .ok_or(FabricError::UnknownHandle(handle))?;
        slots.in_flight_bytes -= payload.len() as u64;
        Ok(payload)
    }

    fn label(&self) -> &'static str {
        "in-process"
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::phase::Phase;

    fn frame(body: &[u8]) -> Vec<u8> {
        wire::encode(Phase::ThinkComplete, body).unwrap()
    }

    #[test]
    fn pushed_frames_come_back_once() {
        let fabric = InProcessFabric::new(1 << 20);
        let handle = fabric.push(frame(b"kv")).unwrap();
        assert_eq!(fabric.len(), 1);
        assert_eq!(
            wire::decode(&fabric.pull(handle).unwrap()).unwrap().body,
            b"kv"
        );
        assert_eq!(fabric.pull(handle), Err(FabricError::UnknownHandle(handle)));
        assert_eq!(
            fabric.pull(FabricHandle::new(99)),
            Err(FabricError::UnknownHandle(FabricHandle::new(99)))
        );
        assert_eq!(fabric.label(), "in-process");
    }

    #[test]
    fn a_full_fabric_refuses_until_frames_are_pulled() {
        let one = frame(&[7u8; 64]);
        let fabric = InProcessFabric::new(one.len() as u64 + 10);
        let handle = fabric.push(one.clone()).unwrap();
        assert!(matches!(
            fabric.push(one.clone()),
            Err(FabricError::Full { .. })
        ));
        fabric.pull(handle).unwrap();
        assert_eq!(fabric.in_flight_bytes(), 0);
        fabric.push(one).unwrap();
    }

    #[test]
    fn invalid_frames_are_refused_at_push() {
        let fabric = InProcessFabric::new(1 << 20);
        let mut bad = frame(b"body");
        let last = bad.len() - 1;
        bad[last] ^= 1;
        assert_eq!(
            fabric.push(bad),
            Err(FabricError::Frame(DecodeError::ChecksumMismatch))
        );
        assert!(fabric.is_empty());
        assert_eq!(fabric.rejected_frames(), 1);
    }

    #[test]
    fn two_producers_and_one_consumer_lose_nothing() {
        let fabric = std::sync::Arc::new(InProcessFabric::new(1 << 20));
        let (tx, rx) = std::sync::mpsc::channel();
        let producers: Vec<_> = (0..2u8)
            .map(|p| {
                let fabric = fabric.clone();
                let tx = tx.clone();
                std::thread::spawn(move || {
                    for i in 0..50u8 {
                        tx.send(fabric.push(frame(&[p, i])).unwrap()).unwrap();
                    }
                })
            })
            .collect();
        drop(tx);
        let mut bodies: Vec<Vec<u8>> = rx
            .iter()
            .map(|h| {
                wire::decode(&fabric.pull(h).unwrap())
                    .unwrap()
                    .body
                    .to_vec()
            })
            .collect();
        for producer in producers {
            producer.join().unwrap();
        }
        bodies.sort();
        assert_eq!(bodies.len(), 100);
        bodies.dedup();
        assert_eq!(bodies.len(), 100);
        assert!(fabric.is_empty());
    }
}
