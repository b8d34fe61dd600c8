//! The shared tier below the connector's own (G4): a `kvtwin store`, or any server of
//! its protocol, that many engines write the blocks they compute to and read prefixes
//! from, so a prefix one engine computed is loaded by another.
//!
//! Owns: [`SharedTier`]: one connection (the `redis` crate, blocking: the connector's
//! calls come between forward passes; reconnected after an error), the blocks' keys
//! (`{namespace}:{sequence hash, 16 hex digits}`: the namespace names the model and
//! block size, so engines of one model share and others never mix), the value's frame
//! ([`frame`]: `kvtwin::block_frame`'s `KVB2`, the block's hash, parent and tokens
//! beside its bytes, all under one BLAKE3, so the store can announce the block to
//! routers; a torn, foreign or misplaced value is refused, counted and reported
//! missing, so the engine computes the block), the
//! blocks it knows the store holds (bounded, so a block is sent once), and
//! [`SharedStats`]. Three batched calls, one round trip each: [`SharedTier::prefix`]
//! (KVTWIN.PREFIX), [`SharedTier::get`] (MGET), [`SharedTier::put`] (MSET).
//! Never: decide what to load or save (the scheduler side does), or keep a block's
//! bytes past a call.

use kvtwin::block_frame;
use kvtwin::ids::SequenceHash;
use std::collections::{HashSet, VecDeque};
use std::time::Duration;
use thiserror::Error;

/// Blocks remembered as held by the store (put or loaded), at most: past it the oldest
/// are forgotten, and at worst sent again.
pub const KNOWN_BOUND: usize = 1 << 20;

/// How long one call waits for the store before it fails (the engine then computes).
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// A block to write: who it is (its sequence hash, its parent's, its tokens: what the
/// store's KV events tell routers) and its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SharedBlock<'a> {
    /// Its sequence hash (its key).
    pub hash: SequenceHash,
    /// Its parent's; none for a prompt's first block.
    pub parent: Option<SequenceHash>,
    /// Its tokens (may be empty: the store then stores it but announces nothing).
    pub tokens: &'a [u32],
    /// Its bytes.
    pub bytes: &'a [u8],
}

/// `block` as the store keeps it: a `KVB2` frame ([`kvtwin::block_frame`]).
pub fn frame(block: &SharedBlock<'_>) -> Vec<u8> {
    block_frame::encode(block.hash, block.parent, block.tokens, block.bytes)
}

/// The bytes of block `hash` in `value` if it is a block of `block_bytes` bytes, whole
/// and unchanged, and (for a `KVB2` frame) that block: a value under the wrong key is
/// refused like a torn one. `KVB1` frames (what the connector wrote before) still read.
pub fn unframe(value: &[u8], hash: SequenceHash, block_bytes: usize) -> Option<&[u8]> {
    let decoded = block_frame::decode(value).ok()?;
    let ours = decoded.identity.as_ref().is_none_or(|id| id.hash == hash);
    (ours && decoded.payload.len() == block_bytes).then_some(decoded.payload)
}

/// The shared store could not answer.
#[derive(Debug, Error)]
#[error("the shared store at {url}: {source}")]
pub struct SharedError {
    /// Where it is (without its password).
    pub url: String,
    /// Why.
    #[source]
    pub source: redis::RedisError,
}

/// What the shared tier did, counted since it started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SharedStats {
    /// Prefix queries answered.
    pub prefix_queries: u64,
    /// Blocks loaded from it.
    pub loaded_blocks: u64,
    /// Blocks it did not hold when loaded (evicted since the query).
    pub missing_blocks: u64,
    /// Values refused: not a block of this size, or bytes that fail their BLAKE3.
    pub corrupt_blocks: u64,
    /// Blocks sent to it.
    pub put_blocks: u64,
    /// Blocks not sent: it was known to hold them.
    pub known_blocks: u64,
    /// Calls that failed (unreachable, refused, timed out).
    pub errors: u64,
}

/// The blocks known to be in the store, oldest first out past [`KNOWN_BOUND`].
#[derive(Default)]
struct Known {
    set: HashSet<SequenceHash>,
    order: VecDeque<SequenceHash>,
}

impl Known {
    fn insert(&mut self, hash: SequenceHash) {
        if self.set.insert(hash) {
            self.order.push_back(hash);
            if self.order.len() > KNOWN_BOUND {
                if let Some(oldest) = self.order.pop_front() {
                    self.set.remove(&oldest);
                }
            }
        }
    }
}

/// A connection to the shared store (see the module docs).
pub struct SharedTier {
    client: redis::Client,
    connection: Option<redis::Connection>,
    /// The URL without its password, for errors and logs.
    shown: String,
    namespace: String,
    known: Known,
    stats: SharedStats,
}

impl SharedTier {
    /// The store at `url` (`redis://[:PASSWORD@]HOST:PORT`), blocks named under
    /// `namespace`. Connects at the first call, and again after a failed one.
    pub fn new(url: &str, namespace: &str) -> Result<Self, SharedError> {
        let shown = match url.split_once('@') {
            Some((_, host)) => format!("redis://{host}"),
            None => url.to_string(),
        };
        let client = redis::Client::open(url).map_err(|source| SharedError {
            url: shown.clone(),
            source,
        })?;
        Ok(Self {
            client,
            connection: None,
            shown,
            namespace: namespace.to_string(),
            known: Known::default(),
            stats: SharedStats::default(),
        })
    }

    /// Where it is, without a password.
    pub fn url(&self) -> &str {
        &self.shown
    }

    /// Its counters.
    pub fn stats(&self) -> SharedStats {
        self.stats
    }

    /// The key of block `hash`.
    pub fn key(&self, hash: SequenceHash) -> String {
        format!("{}:{:016x}", self.namespace, hash.get())
    }

    /// How many of `hashes` (a chain, parent first) the store holds, as a leading run.
    pub fn prefix(&mut self, hashes: &[SequenceHash]) -> Result<usize, SharedError> {
        if hashes.is_empty() {
            return Ok(0);
        }
        let keys: Vec<String> = hashes.iter().map(|h| self.key(*h)).collect();
        let held: usize = self.query(redis::cmd("KVTWIN.PREFIX").arg(&keys))?;
        self.stats.prefix_queries += 1;
        Ok(held.min(hashes.len()))
    }

    /// Loads `hashes` (a chain, parent first), each a block of `block_bytes`, handing
    /// each whole block to `each` with its index; stops at the first the store no longer
    /// holds or whose value is not whole. Returns how many were handed over.
    pub fn get(
        &mut self,
        hashes: &[SequenceHash],
        block_bytes: usize,
        mut each: impl FnMut(usize, &[u8]),
    ) -> Result<usize, SharedError> {
        if hashes.is_empty() {
            return Ok(0);
        }
        let keys: Vec<String> = hashes.iter().map(|h| self.key(*h)).collect();
        let values: Vec<Option<Vec<u8>>> = self.query(redis::cmd("MGET").arg(&keys))?;
        for (i, value) in values.iter().enumerate() {
            let Some(value) = value else {
                self.stats.missing_blocks += 1;
                return Ok(i);
            };
            let Some(block) = unframe(value, hashes[i], block_bytes) else {
                self.stats.corrupt_blocks += 1;
                return Ok(i);
            };
            each(i, block);
            self.known.insert(hashes[i]);
            self.stats.loaded_blocks += 1;
        }
        Ok(values.len().min(hashes.len()))
    }

    /// Sends the blocks the store is not known to hold, in one MSET; how many were sent.
    pub fn put(&mut self, blocks: &[SharedBlock<'_>]) -> Result<usize, SharedError> {
        let fresh: Vec<&SharedBlock<'_>> = blocks
            .iter()
            .filter(|block| !self.known.set.contains(&block.hash))
            .collect();
        self.stats.known_blocks += (blocks.len() - fresh.len()) as u64;
        if fresh.is_empty() {
            return Ok(0);
        }
        let mut command = redis::cmd("MSET");
        for block in &fresh {
            command.arg(self.key(block.hash)).arg(frame(block));
        }
        self.query::<()>(&command)?;
        for block in &fresh {
            self.known.insert(block.hash);
        }
        self.stats.put_blocks += fresh.len() as u64;
        Ok(fresh.len())
    }

    /// One command on the connection, connecting first if need be; an error drops the
    /// connection (the next call connects again) and is counted.
    fn query<T: redis::FromRedisValue>(&mut self, command: &redis::Cmd) -> Result<T, SharedError> {
        let result = self.connected().and_then(|c| command.query(c));
        result.map_err(|source| {
            self.connection = None;
            self.stats.errors += 1;
            SharedError {
                url: self.shown.clone(),
                source,
            }
        })
    }

    fn connected(&mut self) -> redis::RedisResult<&mut redis::Connection> {
        if self.connection.is_none() {
            let connection = self.client.get_connection_with_timeout(TIMEOUT)?;
            connection.set_read_timeout(Some(TIMEOUT))?;
            connection.set_write_timeout(Some(TIMEOUT))?;
            self.connection = Some(connection);
        }
        Ok(self.connection.as_mut().expect("connected just now"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_holds_its_block_and_nothing_else_passes() {
        let bytes = vec![7u8; 64];
        let hash = SequenceHash::new(0xab);
        let block = SharedBlock {
            hash,
            parent: Some(SequenceHash::new(0xaa)),
            tokens: &[1, 2, 3, 4],
            bytes: &bytes,
        };
        let value = frame(&block);
        assert_eq!(value.len(), block_frame::FIXED_BYTES + 16 + 64);
        assert_eq!(unframe(&value, hash, 64), Some(&bytes[..]));
        assert_eq!(
            unframe(&value, hash, 63),
            None,
            "another engine's block size"
        );
        assert_eq!(
            unframe(&value, SequenceHash::new(1), 64),
            None,
            "another key's block"
        );
        let mut flipped = value.clone();
        flipped[value.len() - 10] ^= 1;
        assert_eq!(unframe(&flipped, hash, 64), None, "a flipped byte");
        let mut token = value.clone();
        token[block_frame::FIXED_BYTES] ^= 1;
        assert_eq!(unframe(&token, hash, 64), None, "a flipped token");
        assert_eq!(unframe(&value[..value.len() - 1], hash, 63), None, "torn");
        let mut foreign = value.clone();
        foreign[0] = b'X';
        assert_eq!(unframe(&foreign, hash, 64), None, "not ours");
        // What the connector wrote before: the bytes under their BLAKE3.
        let mut v1 = block_frame::TAG_V1.to_vec();
        v1.extend_from_slice(blake3::hash(&bytes).as_bytes());
        v1.extend_from_slice(&bytes);
        assert_eq!(unframe(&v1, hash, 64), Some(&bytes[..]));
    }

    #[test]
    fn keys_name_the_namespace_and_the_hash_and_urls_hide_the_password() {
        let tier = SharedTier::new("redis://:s3cret@127.0.0.1:6380", "kvtwin:m:32").unwrap();
        assert_eq!(tier.url(), "redis://127.0.0.1:6380");
        assert_eq!(
            tier.key(SequenceHash::new(0xab)),
            "kvtwin:m:32:00000000000000ab"
        );
        let mut known = Known::default();
        for h in 0..(KNOWN_BOUND as u64 + 5) {
            known.insert(SequenceHash::new(h));
        }
        assert_eq!(known.set.len(), KNOWN_BOUND);
        assert!(!known.set.contains(&SequenceHash::new(4)));
        assert!(known.set.contains(&SequenceHash::new(5)));
    }
}
