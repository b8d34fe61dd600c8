//! The store: the index's bookkeeping carried out on real bytes. DRAM is a map of the
//! copies in memory; the disk and object tiers are `object_store` stores (a local
//! directory each by default), one self-describing record per copy (`record`), named by
//! its copy id, so that a restarted store rebuilds its index from listings and headers
//! ([`Store::open`]).
//!
//! Every change runs under one lock, the I/O of the moves it makes included, so the
//! tiers always hold what the index says; a value read off disk or the object tier is
//! read outside the lock under a lease (the index never moves or deletes a leased
//! copy), checked against its BLAKE3, and promoted to DRAM (its hot copy) where the
//! store was told to. A value whose bytes fail the check is counted, dropped, and
//! answered as missing: the engine computes it again; a torn value is never served.
//!
//! With [`StoreEvents`] configured, the store also says which blocks it holds: under
//! the same lock as the change, a block's first copy in the store queues a `Stored`
//! event and its last copy leaving a `Removed` one (`crate::events` says which values
//! are blocks); a restarted store announces the blocks it found before it serves.
//!
//! Owns: the tiers' bytes, carrying out steps, reads under leases, counters, which keys
//! hold announced blocks. Never: speaks a protocol (`server` does), decides what goes
//! where (`index` does), or waits for an event to be published.

use crate::events::{StoreEvent, StoreEvents};
use crate::index::{Full, Step, Tier, TierIndex};
use crate::pages::{Pages, Value};
use crate::record::{self, RecordReader, FIXED_HEADER, MAX_KEY};
use bytes::Bytes;
use futures::TryStreamExt;
use kvtwin::block_frame::{self, FrameIdentity};
use kvtwin::ids::SequenceHash;
use object_store::path::Path;
use object_store::{GetResultPayload, ObjectStore, ObjectStoreExt, PutPayload};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::Mutex;

/// How a store is built.
#[derive(Clone)]
pub struct StoreConfig {
    /// Each tier's bound, bytes, highest first (0: the tier is not used).
    pub limits: [u64; 3],
    /// The disk tier (a local directory: `object_store::local::LocalFileSystem`).
    pub disk: Option<Arc<dyn ObjectStore>>,
    /// The object tier.
    pub object: Option<Arc<dyn ObjectStore>>,
    /// The largest value taken, bytes.
    pub max_value: u64,
    /// Whether a value read off disk or the object tier moves to DRAM.
    pub promote_on_hit: bool,
    /// Where its KV events go; none: it announces nothing (and decodes no frame).
    pub events: Option<Arc<StoreEvents>>,
}

/// Why the store did not do what it was asked.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// No tier can take the value now.
    #[error(transparent)]
    Full(#[from] Full),
    /// A key longer than a record holds.
    #[error("a key of {0} bytes (at most {MAX_KEY})")]
    KeyTooLong(usize),
    /// A value over `--max-value`.
    #[error("a value of {size} bytes (at most {max})")]
    ValueTooLarge {
        /// Its length.
        size: u64,
        /// The bound.
        max: u64,
    },
    /// A tier failed to write.
    #[error("the {tier} tier: {source}", tier = .tier.name())]
    Tier {
        /// Which tier.
        tier: Tier,
        /// What it said.
        source: object_store::Error,
    },
}

/// One copy in DRAM.
struct MemoryCopy {
    key: Bytes,
    value: Value,
    digest: [u8; 32],
}

struct Inner {
    index: TierIndex,
    memory: HashMap<u64, MemoryCopy>,
    /// Keys whose value is an announced block, and that block (with events only).
    announced: HashMap<Bytes, SequenceHash>,
    /// Keys holding each announced block: announced with the first, removed with the
    /// last.
    holders: HashMap<SequenceHash, u32>,
}

/// The store's counters since it started.
#[derive(Debug, Default)]
pub struct Counters {
    /// Values stored.
    pub puts: AtomicU64,
    /// Reads answered, by the tier that held the value.
    pub hits: [AtomicU64; 3],
    /// Reads of keys the store did not hold.
    pub misses: AtomicU64,
    /// Copies moved down, by the tier they left.
    pub demotions: [AtomicU64; 3],
    /// Keys let go for room, by the tier they left the store from.
    pub evictions: [AtomicU64; 3],
    /// Values read off a lower tier and moved to DRAM.
    pub promotions: AtomicU64,
    /// Values whose bytes failed their BLAKE3 (or would not read), dropped.
    pub corrupt: AtomicU64,
    /// Reads that leased a copy.
    pub leases: AtomicU64,
    /// Puts refused (no room, too large).
    pub refused: AtomicU64,
}

/// What the store holds now, for INFO and metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Occupancy {
    /// Keys.
    pub keys: usize,
    /// Per tier: keys, bytes used, bound.
    pub tiers: [(usize, u64, u64); 3],
    /// Copies leased now.
    pub leased: usize,
    /// Distinct blocks announced and held (0 without events).
    pub announced_blocks: usize,
}

/// The shared block store.
pub struct Store {
    inner: Mutex<Inner>,
    tiers: [Option<Arc<dyn ObjectStore>>; 3],
    max_value: u64,
    promote_on_hit: bool,
    /// The pages DRAM's values (and values read off the lower tiers) lie in.
    pages: Pages,
    events: Option<Arc<StoreEvents>>,
    /// What it did.
    pub counters: Counters,
}

/// Bytes of a recovered value's head read first to announce its block: the frame's
/// fixed part and 1,024 tokens.
const HEAD_READ_BYTES: u64 = (block_frame::FIXED_BYTES + 4 * 1024) as u64;

/// The block `value` is, if it is a whole `KVB2` frame with tokens: what the store
/// announces.
fn block_of(value: &[u8]) -> Option<FrameIdentity> {
    block_frame::decode(value)
        .ok()?
        .identity
        .filter(|block| !block.tokens.is_empty())
}

fn path_of(copy: u64) -> Path {
    Path::from(format!("{copy:016x}.kvb"))
}

fn copy_of(path: &Path) -> Option<u64> {
    let name = path.filename()?;
    let hex = name.strip_suffix(".kvb")?;
    u64::from_str_radix(hex, 16).ok()
}

impl Store {
    /// A store over `config`'s tiers, with what they already hold (a restart): each
    /// record's header read, the newest copy of each key kept, older and torn ones and
    /// what no longer fits deleted.
    pub async fn open(config: StoreConfig) -> Result<Store, StoreError> {
        let mut limits = config.limits;
        if config.disk.is_none() {
            limits[1] = 0;
        }
        if config.object.is_none() {
            limits[2] = 0;
        }
        let store = Store {
            inner: Mutex::new(Inner {
                index: TierIndex::new(limits),
                memory: HashMap::new(),
                announced: HashMap::new(),
                holders: HashMap::new(),
            }),
            tiers: [None, config.disk, config.object],
            max_value: config.max_value,
            promote_on_hit: config.promote_on_hit,
            pages: Pages::new(limits[0]),
            events: config.events,
            counters: Counters::default(),
        };
        let mut found = Vec::new();
        for tier in [Tier::Disk, Tier::Object] {
            let Some(objects) = &store.tiers[tier as usize] else {
                continue;
            };
            let listed: Vec<_> = objects
                .list(None)
                .try_collect()
                .await
                .map_err(|source| StoreError::Tier { tier, source })?;
            for meta in listed {
                let Some(copy) = copy_of(&meta.location) else {
                    continue;
                };
                let head = (FIXED_HEADER + MAX_KEY) as u64;
                let header = match objects
                    .get_range(&meta.location, 0..meta.size.min(head))
                    .await
                {
                    Ok(bytes) => record::decode_header(&bytes).ok(),
                    Err(_) => None,
                };
                match header {
                    Some(header) if header.copy == copy && header.record_len() == meta.size => {
                        found.push((header.key, copy, tier, meta.size, header.digest));
                    }
                    _ => {
                        tracing::warn!(tier = tier.name(), path = %meta.location, "a record that does not read whole: deleted");
                        store.counters.corrupt.fetch_add(1, Ordering::Relaxed);
                        let _ = objects.delete(&meta.location).await;
                    }
                }
            }
        }
        let recovered = found.len();
        {
            let mut inner = store.inner.lock().await;
            let steps = inner.index.recover(found);
            store.carry_out(&mut inner, steps).await;
            store.announce_recovered(&mut inner).await;
        }
        if recovered > 0 {
            tracing::info!(recovered, "kvtwin store: records found on the tiers");
        }
        Ok(store)
    }

    /// Stores `value` under `key`, replacing what it held.
    pub async fn put(&self, key: Bytes, value: Bytes) -> Result<Tier, StoreError> {
        if key.len() > MAX_KEY {
            self.counters.refused.fetch_add(1, Ordering::Relaxed);
            return Err(StoreError::KeyTooLong(key.len()));
        }
        if value.len() as u64 > self.max_value {
            self.counters.refused.fetch_add(1, Ordering::Relaxed);
            return Err(StoreError::ValueTooLarge {
                size: value.len() as u64,
                max: self.max_value,
            });
        }
        let digest = *blake3::hash(&value).as_bytes();
        // Checked outside the lock: which block the value is, if any.
        let identity = self.events.as_ref().map(|_| block_of(&value));
        // The key gets an allocation of its own and the value goes into pages (outside
        // the lock): cut from a connection's read buffer, they would keep that whole
        // buffer alive for as long as the store holds them (see `pages`).
        let key = Bytes::copy_from_slice(&key);
        let value = self.pages.copy(&value);
        let mut inner = self.inner.lock().await;
        let placed = self.place(&mut inner, key.clone(), value, digest).await;
        if let Some(identity) = identity {
            match &placed {
                Ok(_) => self.announce(&mut inner, &key, identity),
                Err(_) => self.forget_if_gone(&mut inner, &key),
            }
        }
        let tier = placed?;
        self.counters.puts.fetch_add(1, Ordering::Relaxed);
        Ok(tier)
    }

    /// The value under `key`, if the store holds it and its bytes check.
    pub async fn get(&self, key: &[u8]) -> Option<Value> {
        let entry = {
            let mut inner = self.inner.lock().await;
            let Some(entry) = inner.index.get(key) else {
                self.counters.misses.fetch_add(1, Ordering::Relaxed);
                return None;
            };
            if entry.tier == Tier::Memory {
                self.counters.hits[0].fetch_add(1, Ordering::Relaxed);
                return inner.memory.get(&entry.copy).map(|copy| copy.value.clone());
            }
            self.counters.leases.fetch_add(1, Ordering::Relaxed);
            entry
        };
        // Leased: read outside the lock.
        let read = self.read_copy(entry.tier, entry.copy).await;
        let mut inner = self.inner.lock().await;
        let released = inner.index.release(entry.copy);
        self.carry_out(&mut inner, released.into_iter().collect())
            .await;
        let still_this_copy = inner.index.peek(key).is_some_and(|e| e.copy == entry.copy);
        match read {
            Some((header, value)) if header.digest == entry.digest => {
                self.counters.hits[entry.tier as usize].fetch_add(1, Ordering::Relaxed);
                // Only into DRAM: a store without room there leaves the value where it is.
                let fits = inner.index.limit(Tier::Memory) >= entry.size;
                if self.promote_on_hit && still_this_copy && fits {
                    let key = Bytes::copy_from_slice(key);
                    if self
                        .place(&mut inner, key, value.clone(), entry.digest)
                        .await
                        .is_ok_and(|tier| tier == Tier::Memory)
                    {
                        self.counters.promotions.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Some(value)
            }
            _ => {
                self.counters.corrupt.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(tier = entry.tier.name(), copy = entry.copy, "a value failed its BLAKE3 check (or would not read): dropped, answered as missing");
                if still_this_copy {
                    if let Some(steps) = inner.index.remove(key) {
                        self.carry_out(&mut inner, steps).await;
                    }
                    self.forget_if_gone(&mut inner, key);
                }
                None
            }
        }
    }

    /// Where its KV events go, if anywhere (their counters).
    pub fn events(&self) -> Option<&StoreEvents> {
        self.events.as_deref()
    }

    /// The tier that holds `key` now (without touching its recency), if any.
    pub async fn tier_of(&self, key: &[u8]) -> Option<Tier> {
        self.inner
            .lock()
            .await
            .index
            .peek(key)
            .map(|entry| entry.tier)
    }

    /// Whether the store holds `key` (without touching its recency).
    pub async fn contains(&self, key: &[u8]) -> bool {
        self.inner.lock().await.index.peek(key).is_some()
    }

    /// Deletes `key`; whether the store held it.
    pub async fn delete(&self, key: &[u8]) -> bool {
        let mut inner = self.inner.lock().await;
        match inner.index.remove(key) {
            Some(steps) => {
                self.carry_out(&mut inner, steps).await;
                // A copy being read is deleted after its reader: the key is gone now.
                self.forget_if_gone(&mut inner, key);
                true
            }
            None => false,
        }
    }

    /// Deletes every key; how many there were.
    pub async fn clear(&self) -> usize {
        let mut inner = self.inner.lock().await;
        let keys: Vec<Bytes> = inner.index.keys().cloned().collect();
        for key in &keys {
            if let Some(steps) = inner.index.remove(key) {
                self.carry_out(&mut inner, steps).await;
            }
            self.forget_if_gone(&mut inner, key);
        }
        keys.len()
    }

    /// What the store holds now.
    pub async fn occupancy(&self) -> Occupancy {
        let inner = self.inner.lock().await;
        let index = &inner.index;
        Occupancy {
            keys: index.len(),
            tiers: Tier::ALL.map(|t| (index.count(t), index.used(t), index.limit(t))),
            leased: index.leased(),
            announced_blocks: inner.holders.len(),
        }
    }

    /// Places a new copy of `key` (under the lock): the index's steps carried out, then
    /// the copy written where it goes.
    async fn place(
        &self,
        inner: &mut Inner,
        key: Bytes,
        value: Value,
        digest: [u8; 32],
    ) -> Result<Tier, StoreError> {
        let copy = inner.index.new_copy();
        let size = (FIXED_HEADER + key.len() + value.len()) as u64;
        let (tier, steps) = match inner.index.place(key.clone(), copy, size, digest) {
            Ok(placed) => placed,
            Err(full) => {
                self.counters.refused.fetch_add(1, Ordering::Relaxed);
                return Err(full.into());
            }
        };
        self.carry_out(inner, steps).await;
        match tier {
            Tier::Memory => {
                // `value` is in pages already (`put`, or read off a lower tier).
                inner.memory.insert(copy, MemoryCopy { key, value, digest });
            }
            tier => {
                let record = record::encode_parts(copy, &key, &value, &digest);
                if let Err(source) = self.write(tier, copy, record.into_iter().collect()).await {
                    // The index holds what the tier did not take: undo it.
                    if let Some(steps) = inner.index.remove(&key) {
                        self.carry_out(inner, steps).await;
                    }
                    return Err(StoreError::Tier { tier, source });
                }
            }
        }
        Ok(tier)
    }

    /// Carries out `steps` in order (under the lock). A move that fails drops its key
    /// from the index, counted and logged: the tiers never hold less than it says.
    async fn carry_out(&self, inner: &mut Inner, steps: Vec<Step>) {
        for step in steps {
            let key = match &step {
                Step::Delete { key, .. } | Step::Demote { key, .. } => key.clone(),
            };
            match step {
                Step::Delete {
                    copy,
                    tier,
                    evicted,
                    ..
                } => {
                    if evicted {
                        self.counters.evictions[tier as usize].fetch_add(1, Ordering::Relaxed);
                    }
                    match tier {
                        Tier::Memory => {
                            inner.memory.remove(&copy);
                        }
                        tier => {
                            if let Some(objects) = &self.tiers[tier as usize] {
                                if let Err(error) = objects.delete(&path_of(copy)).await {
                                    if !matches!(error, object_store::Error::NotFound { .. }) {
                                        tracing::warn!(tier = tier.name(), copy, %error, "could not delete a copy");
                                    }
                                }
                            }
                        }
                    }
                }
                Step::Demote {
                    key,
                    copy,
                    from,
                    to,
                } => {
                    self.counters.demotions[from as usize].fetch_add(1, Ordering::Relaxed);
                    // Written from the value's pages, not copied again.
                    let record: Option<PutPayload> = match from {
                        Tier::Memory => inner.memory.remove(&copy).map(|c| {
                            record::encode_parts(copy, &c.key, &c.value, &c.digest)
                                .into_iter()
                                .collect()
                        }),
                        // Moved once it checks: a torn copy goes no further.
                        tier => self.read_copy(tier, copy).await.map(|(header, value)| {
                            record::encode_parts(copy, &header.key, &value, &header.digest)
                                .into_iter()
                                .collect()
                        }),
                    };
                    let moved = match record {
                        Some(record) => self.write(to, copy, record).await.is_ok(),
                        None => false,
                    };
                    if moved {
                        if from != Tier::Memory {
                            if let Some(objects) = &self.tiers[from as usize] {
                                let _ = objects.delete(&path_of(copy)).await;
                            }
                        }
                    } else {
                        self.counters.corrupt.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(
                            copy,
                            from = from.name(),
                            to = to.name(),
                            "a copy could not move down: dropped"
                        );
                        if inner.index.peek(&key).is_some_and(|e| e.copy == copy) {
                            if let Some(steps) = inner.index.remove(&key) {
                                Box::pin(self.carry_out(inner, steps)).await;
                            }
                        }
                    }
                }
            }
            // A key evicted or dropped is gone from every tier; one moved or replaced
            // is not.
            self.forget_if_gone(inner, &key);
        }
    }

    /// After `key` took a new value (under the lock): announces the block it is, and
    /// removes the block it was if that was another one.
    fn announce(&self, inner: &mut Inner, key: &Bytes, identity: Option<FrameIdentity>) {
        let Some(events) = &self.events else {
            return;
        };
        let previous = inner.announced.get(key).copied();
        match identity {
            Some(block) if previous == Some(block.hash) => {}
            Some(block) => {
                if previous.is_some() {
                    self.unannounce(inner, key);
                }
                inner.announced.insert(key.clone(), block.hash);
                let holders = inner.holders.entry(block.hash).or_default();
                *holders += 1;
                if *holders == 1 {
                    events.emit(StoreEvent::Stored(block));
                }
            }
            None => {
                events.note_non_block();
                if previous.is_some() {
                    self.unannounce(inner, key);
                }
            }
        }
    }

    /// Removes the announced block of `key` if the store no longer holds the key.
    fn forget_if_gone(&self, inner: &mut Inner, key: &[u8]) {
        if self.events.is_some() && inner.index.peek(key).is_none() {
            self.unannounce(inner, key);
        }
    }

    /// `key` no longer holds its announced block (if it had one): the block's removal
    /// is announced with its last holder.
    fn unannounce(&self, inner: &mut Inner, key: &[u8]) {
        let (Some(events), Some(hash)) = (&self.events, inner.announced.remove(key)) else {
            return;
        };
        let holders = inner.holders.entry(hash).or_default();
        *holders = holders.saturating_sub(1);
        if *holders == 0 {
            inner.holders.remove(&hash);
            events.emit(StoreEvent::Removed(hash));
        }
    }

    /// Announces the blocks a restarted store found on its tiers, reading each value's
    /// head (its frame's identity; the whole value is checked when it is read, and a
    /// corrupt one is removed then). Waits for room in the queues: nothing is served yet.
    async fn announce_recovered(&self, inner: &mut Inner) {
        let Some(events) = &self.events else {
            return;
        };
        let keys: Vec<Bytes> = inner.index.keys().cloned().collect();
        for key in keys {
            let Some(entry) = inner.index.peek(&key) else {
                continue;
            };
            let Some(objects) = &self.tiers[entry.tier as usize] else {
                continue;
            };
            let start = (FIXED_HEADER + key.len()) as u64;
            let head = |len: u64| start..entry.size.min(start + len);
            let path = path_of(entry.copy);
            // Most blocks' tokens fit the first read; a longer block takes a second.
            let mut identity = None;
            for len in [HEAD_READ_BYTES, entry.size] {
                let Ok(bytes) = objects.get_range(&path, head(len)).await else {
                    break;
                };
                match block_frame::read_identity(&bytes) {
                    Ok(block) => {
                        identity = Some(block);
                        break;
                    }
                    Err(block_frame::BlockFrameError::Truncated) if len < entry.size => {}
                    Err(_) => break,
                }
            }
            let identity = identity.filter(|block| !block.tokens.is_empty());
            let Some(block) = identity else {
                events.note_non_block();
                continue;
            };
            inner.announced.insert(key.clone(), block.hash);
            let holders = inner.holders.entry(block.hash).or_default();
            *holders += 1;
            if *holders == 1 {
                events.emit_waiting(StoreEvent::Stored(block)).await;
            }
        }
    }

    async fn write(
        &self,
        tier: Tier,
        copy: u64,
        record: PutPayload,
    ) -> Result<(), object_store::Error> {
        let objects = self.tiers[tier as usize]
            .as_ref()
            .expect("the index places nothing on a tier it has no bound for");
        objects.put(&path_of(copy), record).await.map(|_| ())
    }

    /// A copy's record off its tier, whole and checked: its header and its value (read
    /// into pages); `None` if it would not read or failed its check.
    async fn read_copy(&self, tier: Tier, copy: u64) -> Option<(record::Header, Value)> {
        let objects = self.tiers[tier as usize].as_ref()?;
        let got = objects.get(&path_of(copy)).await.ok()?;
        let mut reader = RecordReader::new(self.pages.clone(), self.max_value);
        match got.payload {
            // A local directory's file, read on a blocking thread in pieces of one buffer
            // (object_store's own read would allocate the whole record).
            GetResultPayload::File(mut file, _) => tokio::task::spawn_blocking(move || {
                use std::io::Read;
                let mut buffer = vec![0u8; READ_BUFFER];
                loop {
                    let n = file.read(&mut buffer).ok()?;
                    if n == 0 {
                        return reader.finish().ok();
                    }
                    reader.feed(&buffer[..n]).ok()?;
                }
            })
            .await
            .ok()?,
            GetResultPayload::Stream(mut stream) => {
                while let Some(bytes) = stream.try_next().await.ok()? {
                    reader.feed(&bytes).ok()?;
                }
                reader.finish().ok()
            }
        }
    }

    /// What DRAM's page pool did (INFO, metrics).
    pub fn page_counts(&self) -> crate::pages::PageCounts {
        self.pages.counts()
    }
}

/// Bytes a file of the disk or object tier is read by at a time.
const READ_BUFFER: usize = 64 << 10;

#[cfg(test)]
mod tests;
