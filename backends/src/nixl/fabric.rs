//! A [`Fabric`] whose frames cross between two NIXL agents over UCX.
//!
//! Owns: [`NixlFabric`]: a producer agent with a registered staging buffer and a consumer
//! agent with a registered inbox, the consumer holding the producer's metadata. `push`
//! checks the MRDN frame and copies it into a free range of the staging buffer (as a
//! producer writes KV into memory it registered); `pull` has the consumer read that
//! range over UCX into its inbox, checks the frame again (it crossed a transport), and
//! frees the range. The staging buffer bounds the bytes in flight, as the in-process
//! fabric's capacity does.
//! Never: interpret frame bodies, hand out a frame that fails its check, or lose a frame
//! to a failed read (it stays in the fabric and can be pulled again).

use super::{HostBuffer, HostRegistration, NixlAgent, NixlBackend, NixlError, NixlLibrary};
use super::{Target, TransferOp};
use kvtwin::fabric::{Fabric, FabricError, FabricHandle};
use kvtwin::layout::Address;
use kvtwin::wire::{self, DecodeError};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// How a [`NixlFabric`] is set up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NixlFabricConfig {
    /// Prefix of the two agents' names (`<name>-producer`, `<name>-consumer`); unique
    /// among the agents of the process.
    pub name: String,
    /// Bytes of frames the fabric holds at once (the staging buffer; the inbox is as
    /// large, so any frame that fits can be pulled).
    pub capacity_bytes: u64,
    /// How long a pull waits for its read.
    pub timeout: Duration,
}

impl NixlFabricConfig {
    /// A fabric named `name` holding `capacity_bytes`, waiting up to 10 s per read.
    pub fn new(name: &str, capacity_bytes: u64) -> Self {
        Self {
            name: name.to_owned(),
            capacity_bytes,
            timeout: Duration::from_secs(10),
        }
    }
}

/// A pull failed: a fabric error, or the NIXL read under it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NixlFabricError {
    /// What any fabric can answer (unknown handle, full, invalid frame).
    #[error(transparent)]
    Fabric(#[from] FabricError),
    /// The read between the agents failed; the frame is still in the fabric.
    #[error(transparent)]
    Nixl(#[from] NixlError),
}

#[derive(Debug, Default)]
struct Slots {
    /// Handle → the frame's range in the staging buffer (offset, length).
    frames: BTreeMap<u64, (u64, u64)>,
    /// Offset → length of every range in use, for first-fit allocation.
    used: BTreeMap<u64, u64>,
    next_handle: u64,
    in_flight_bytes: u64,
    transport_failures: u64,
}

impl Slots {
    /// The lowest offset with `len` free bytes before the next range in use.
    fn find_gap(&self, len: u64, capacity: u64) -> Option<u64> {
        let mut cursor = 0u64;
        for (&offset, &used) in &self.used {
            if offset - cursor >= len {
                return Some(cursor);
            }
            cursor = offset + used;
        }
        (capacity - cursor >= len).then_some(cursor)
    }
}

/// MRDN frames between two NIXL agents of this process over UCX (loopback or shared
/// memory); usable from several threads (reads run one at a time).
pub struct NixlFabric {
    slots: Mutex<Slots>,
    capacity_bytes: u64,
    timeout: Duration,
    producer_name: String,
    // Registrations are declared before their agents so they are dropped first.
    inbox: HostRegistration,
    staging: HostRegistration,
    consumer: NixlAgent,
    producer: NixlAgent,
}

impl fmt::Debug for NixlFabric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NixlFabric")
            .field("producer", &self.producer.name())
            .field("consumer", &self.consumer.name())
            .field("capacity_bytes", &self.capacity_bytes)
            .finish()
    }
}

impl NixlFabric {
    /// Creates both agents with UCX, registers the staging buffer and the inbox, and
    /// hands the producer's metadata to the consumer.
    pub fn new(library: &NixlLibrary, config: NixlFabricConfig) -> Result<Self, NixlError> {
        let len = usize::try_from(config.capacity_bytes)
            .map_err(|_| NixlError::Alloc { len: usize::MAX })?;
        let producer = NixlAgent::new(
            library,
            &format!("{}-producer", config.name),
            &[NixlBackend::Ucx],
        )?;
        let consumer = NixlAgent::new(
            library,
            &format!("{}-consumer", config.name),
            &[NixlBackend::Ucx],
        )?;
        let staging = producer.register_host(Arc::new(HostBuffer::new(len)?))?;
        let inbox = consumer.register_host(Arc::new(HostBuffer::new(len)?))?;
        let producer_name = consumer.load_remote(&producer.metadata()?)?;
        Ok(Self {
            slots: Mutex::new(Slots {
                next_handle: 1,
                ..Slots::default()
            }),
            capacity_bytes: config.capacity_bytes,
            timeout: config.timeout,
            producer_name,
            inbox,
            staging,
            consumer,
            producer,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Slots> {
        // The slots are updated only after each step succeeded, so a panic elsewhere
        // cannot leave them half changed.
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Bytes pushed and not yet pulled.
    pub fn in_flight_bytes(&self) -> u64 {
        self.lock().in_flight_bytes
    }

    /// Frames pushed and not yet pulled.
    pub fn len(&self) -> usize {
        self.lock().frames.len()
    }

    /// Whether no frame is in flight.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Pulls that failed in NIXL (their frames stayed in the fabric).
    pub fn transport_failures(&self) -> u64 {
        self.lock().transport_failures
    }

    /// [`Fabric::pull`] with the NIXL error kept: the consumer reads the frame over UCX.
    pub fn try_pull(&self, handle: FabricHandle) -> Result<Vec<u8>, NixlFabricError> {
        let mut slots = self.lock();
        let &(offset, len) = slots
            .frames
            .get(&handle.get())
            .ok_or(FabricError::UnknownHandle(handle))?;
        let staging = self.staging.buffer().addr() + offset;
        let inbox = self.inbox.buffer().addr();
        let read = self
            .consumer
            .transfer(
                TransferOp::Read,
                &self.inbox,
                &[Address { addr: inbox, len }],
                Target::Remote {
                    agent: &self.producer_name,
                },
                &[Address { addr: staging, len }],
            )
            .and_then(|mut transfer| transfer.wait(self.timeout));
        if let Err(error) = read {
            slots.transport_failures += 1;
            return Err(error.into());
        }
        // Lengths of frames that fit in memory fit in usize.
        let payload = self.inbox.buffer().to_vec(inbox, len as usize)?;
        if let Err(error) = wire::decode(&payload) {
            slots.transport_failures += 1;
            return Err(FabricError::Frame(error).into());
        }
        slots.frames.remove(&handle.get());
        slots.used.remove(&offset);
        slots.in_flight_bytes -= len;
        Ok(payload)
    }
}

impl Fabric for NixlFabric {
    fn push(&self, payload: Vec<u8>) -> Result<FabricHandle, FabricError> {
        wire::decode(&payload)?;
        let len = payload.len() as u64;
        let mut slots = self.lock();
        let Some(offset) = slots.find_gap(len, self.capacity_bytes) else {
            return Err(FabricError::Full {
                capacity_bytes: self.capacity_bytes,
                in_flight_bytes: slots.in_flight_bytes,
                payload_bytes: len,
            });
        };
        let staging = self.staging.buffer();
        staging
            .write_at(staging.addr() + offset, &payload)
            .expect("a free range lies inside the staging buffer");
        let handle = slots.next_handle;
        slots.next_handle += 1;
        slots.used.insert(offset, len);
        slots.frames.insert(handle, (offset, len));
        slots.in_flight_bytes += len;
        Ok(FabricHandle::new(handle))
    }

    /// Reads the frame over UCX. The trait has no transport error, so a failed read
    /// reports the frame as one whose body did not arrive
    /// ([`DecodeError::BodyTooShort`] with nothing present); the frame stays in the
    /// fabric, and [`NixlFabric::try_pull`] gives the NIXL error itself.
    fn pull(&self, handle: FabricHandle) -> Result<Vec<u8>, FabricError> {
        match self.try_pull(handle) {
            Ok(payload) => Ok(payload),
            Err(NixlFabricError::Fabric(error)) => Err(error),
            Err(NixlFabricError::Nixl(_)) => {
                let declared = self
                    .lock()
                    .frames
                    .get(&handle.get())
                    .map_or(0, |&(_, len)| {
                        (len as usize).saturating_sub(wire::HEADER_LEN)
                    });
                Err(FabricError::Frame(DecodeError::BodyTooShort {
                    declared,
                    actual: 0,
                }))
            }
        }
    }

    fn label(&self) -> &'static str {
        "nixl-ucx"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_fit_reuses_freed_ranges() {
        let mut slots = Slots::default();
        assert_eq!(slots.find_gap(10, 100), Some(0));
        slots.used.insert(0, 10);
        slots.used.insert(10, 30);
        slots.used.insert(60, 40);
        assert_eq!(slots.find_gap(20, 100), Some(40));
        assert_eq!(slots.find_gap(21, 100), None);
        slots.used.remove(&0);
        assert_eq!(slots.find_gap(10, 100), Some(0));
        assert_eq!(slots.find_gap(11, 100), Some(40));
    }
}
