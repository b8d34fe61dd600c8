//! The disk tier's index, kept beside its extent file so that the tier outlives the
//! engine: which block each slot holds (its identity and the BLAKE3 digest of its
//! bytes), as an append-only journal that a restart reads back.
//!
//! File format (`kvtwin-disk.index` in the tier's directory): a 32-byte header (the magic
//! `KVTWIDX1`, then the block's bytes, tokens and the tier's capacity in blocks, each a
//! `u64` LE), then 80-byte records: the kind (1: stored, 2: removed), whether the block
//! has a parent, two zero bytes, the slot (`u32`), the sequence hash, the local hash and
//! the parent (`u64` each), the position (`u32`), four zero bytes, the digest (32 bytes)
//! and the first 8 bytes of the BLAKE3 of everything before them, which finds a record
//! torn by a crash. A stored record says a slot holds a block from then on (the disk
//! copy had landed when it was written); a removed record that it no longer does.
//!
//! Reading stops at the first record that does not check, and keeps what came before:
//! a journal cut short loses its last records, never earlier ones. Every entry read
//! back is only a claim: a slot overwritten after its removed record was lost holds
//! other bytes, which the digest (and the extent's own checksum) refuse at the first
//! load, and the engine computes the block.
//!
//! Owns: [`Journal`] (read, create, append, rewrite), [`Entry`], [`Geometry`].
//! Never: read or write a block's bytes, or decide what a tier holds (the store does).

use kvtwin::block::BlockIdentity;
use kvtwin::ids::{BlockId, LocalBlockHash, SequenceHash};
use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// The journal's name in the disk tier's directory.
pub const INDEX_FILE: &str = "kvtwin-disk.index";

const MAGIC: [u8; 8] = *b"KVTWIDX1";
const HEADER_LEN: usize = 32;
const RECORD_LEN: usize = 80;
const STORED: u8 = 1;
const REMOVED: u8 = 2;

/// What the tier is: a journal of another geometry describes another tier's slots.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// Bytes of one block.
    pub block_bytes: u64,
    /// Tokens of one block.
    pub block_tokens: u64,
    /// Slots in the tier.
    pub capacity: u64,
}

/// A slot and the block it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The slot (the block's id in the disk tier).
    pub slot: BlockId,
    /// The block.
    pub identity: BlockIdentity,
    /// The BLAKE3 of its bytes when it was saved.
    pub digest: [u8; 32],
}

/// What opening found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Replayed {
    /// Records read and checked.
    pub records: u64,
    /// Bytes after the last good record (a torn or foreign tail), dropped.
    pub torn_bytes: u64,
    /// The file was of another geometry (or not a journal) and was started over.
    pub foreign: bool,
}

/// The open journal, appending.
#[derive(Debug)]
pub struct Journal {
    file: File,
    path: PathBuf,
    geometry: Geometry,
    /// Records in the file now.
    records: u64,
}

impl Journal {
    /// Reads `dir`'s journal for a tier of `geometry` (any tier's, given `None`: what a
    /// reader that only wants the blocks named takes): the entries it leaves standing,
    /// oldest first (by their stored record), and what was read. A missing file, or one
    /// of another geometry, reads as empty.
    pub fn read(dir: &Path, geometry: Option<Geometry>) -> io::Result<(Vec<Entry>, Replayed)> {
        let bytes = match std::fs::read(dir.join(INDEX_FILE)) {
            Ok(bytes) => bytes,
            Err(error) if error.kind() == io::ErrorKind::NotFound => Vec::new(),
            Err(error) => return Err(error),
        };
        let mut replayed = Replayed::default();
        if bytes.is_empty() {
            return Ok((Vec::new(), replayed));
        }
        let fits = |head: &[u8]| match geometry {
            Some(geometry) => head == header(geometry),
            None => head[..MAGIC.len()] == MAGIC,
        };
        if bytes.len() < HEADER_LEN || !fits(&bytes[..HEADER_LEN]) {
            replayed.foreign = true;
            return Ok((Vec::new(), replayed));
        }
        let (entries, records, good) = replay(&bytes[HEADER_LEN..]);
        replayed.records = records;
        replayed.torn_bytes = (bytes.len() - HEADER_LEN - good) as u64;
        Ok((entries, replayed))
    }

    /// A journal in `dir` for a tier of `geometry` holding `live` alone (what the caller
    /// kept of what [`Journal::read`] gave), replacing any there.
    pub fn create(dir: &Path, geometry: Geometry, live: &[Entry]) -> io::Result<Self> {
        let path = dir.join(INDEX_FILE);
        let file = write_fresh(&path, geometry, live)?;
        Ok(Self {
            file,
            path,
            geometry,
            records: live.len() as u64,
        })
    }

    /// Records in the file.
    pub fn records(&self) -> u64 {
        self.records
    }

    /// Appends `stored` and `removed` records in one write: blocks whose disk copies
    /// landed, and `(slot, hash)` of blocks that left their slots.
    pub fn append(
        &mut self,
        stored: &[Entry],
        removed: &[(BlockId, SequenceHash)],
    ) -> io::Result<()> {
        if stored.is_empty() && removed.is_empty() {
            return Ok(());
        }
        let mut bytes = Vec::with_capacity((stored.len() + removed.len()) * RECORD_LEN);
        // Removals first: a slot freed and filled again between two appends must read
        // back as its new block.
        for &(slot, hash) in removed {
            bytes.extend_from_slice(&record(REMOVED, slot, &removal(hash), &[0; 32]));
        }
        for entry in stored {
            bytes.extend_from_slice(&record(STORED, entry.slot, &entry.identity, &entry.digest));
        }
        self.file.write_all(&bytes)?;
        self.records += (stored.len() + removed.len()) as u64;
        Ok(())
    }

    /// Replaces the file with one holding `live` alone (written beside it, synced, then
    /// renamed over it), and appends to that from here on: a journal's compaction.
    pub fn rewrite(&mut self, live: &[Entry]) -> io::Result<()> {
        self.file = write_fresh(&self.path, self.geometry, live)?;
        self.records = live.len() as u64;
        Ok(())
    }

    /// Writes out what the kernel holds of the journal (after the extent's own sync, a
    /// caller wanting durability calls this).
    pub fn sync(&self) -> io::Result<()> {
        self.file.sync_data()
    }
}

/// Writes `path` anew (beside it, synced, renamed over it): the header, then `live`.
/// The file, open to append.
fn write_fresh(path: &Path, geometry: Geometry, live: &[Entry]) -> io::Result<File> {
    let fresh = path.with_extension("index.new");
    let mut bytes = Vec::with_capacity(HEADER_LEN + live.len() * RECORD_LEN);
    bytes.extend_from_slice(&header(geometry));
    for entry in live {
        bytes.extend_from_slice(&record(STORED, entry.slot, &entry.identity, &entry.digest));
    }
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&fresh)?;
    file.write_all(&bytes)?;
    file.sync_all()?;
    std::fs::rename(&fresh, path)?;
    Ok(file)
}

fn header(geometry: Geometry) -> [u8; HEADER_LEN] {
    let mut out = [0u8; HEADER_LEN];
    out[..8].copy_from_slice(&MAGIC);
    out[8..16].copy_from_slice(&geometry.block_bytes.to_le_bytes());
    out[16..24].copy_from_slice(&geometry.block_tokens.to_le_bytes());
    out[24..32].copy_from_slice(&geometry.capacity.to_le_bytes());
    out
}

/// The identity a removed record carries: the hash alone.
fn removal(hash: SequenceHash) -> BlockIdentity {
    BlockIdentity {
        sequence_hash: hash,
        local_hash: LocalBlockHash::new(0),
        parent: None,
        position: 0,
    }
}

fn record(
    kind: u8,
    slot: BlockId,
    identity: &BlockIdentity,
    digest: &[u8; 32],
) -> [u8; RECORD_LEN] {
    let mut out = [0u8; RECORD_LEN];
    out[0] = kind;
    out[1] = u8::from(identity.parent.is_some());
    out[4..8].copy_from_slice(&slot.get().to_le_bytes());
    out[8..16].copy_from_slice(&identity.sequence_hash.get().to_le_bytes());
    out[16..24].copy_from_slice(&identity.local_hash.get().to_le_bytes());
    let parent = identity.parent.map_or(0, SequenceHash::get);
    out[24..32].copy_from_slice(&parent.to_le_bytes());
    out[32..36].copy_from_slice(&identity.position.to_le_bytes());
    out[40..72].copy_from_slice(digest);
    let check = blake3::hash(&out[..72]);
    out[72..80].copy_from_slice(&check.as_bytes()[..8]);
    out
}

fn u64_at(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(word)
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    let mut word = [0u8; 4];
    word.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(word)
}

/// The entries `records` leave standing (oldest stored first), the records read and the
/// bytes they span (up to the first that does not check).
fn replay(records: &[u8]) -> (Vec<Entry>, u64, usize) {
    // Slot → (order stored, entry); a hash lives in one slot at a time.
    let mut by_slot: BTreeMap<u32, (u64, Entry)> = BTreeMap::new();
    let mut by_hash: BTreeMap<SequenceHash, u32> = BTreeMap::new();
    let mut read = 0u64;
    let mut good = 0usize;
    for chunk in records.chunks_exact(RECORD_LEN) {
        let intact = blake3::hash(&chunk[..72]).as_bytes()[..8] == chunk[72..80]
            && chunk[2..4] == [0, 0]
            && chunk[1] <= 1
            && matches!(chunk[0], STORED | REMOVED);
        if !intact {
            break;
        }
        let slot = u32_at(chunk, 4);
        let hash = SequenceHash::new(u64_at(chunk, 8));
        if chunk[0] == STORED {
            let mut digest = [0u8; 32];
            digest.copy_from_slice(&chunk[40..72]);
            let entry = Entry {
                slot: BlockId::new(slot),
                identity: BlockIdentity {
                    sequence_hash: hash,
                    local_hash: LocalBlockHash::new(u64_at(chunk, 16)),
                    parent: (chunk[1] == 1).then(|| SequenceHash::new(u64_at(chunk, 24))),
                    position: u32_at(chunk, 32),
                },
                digest,
            };
            // An older copy elsewhere, whose removed record was lost, is stale.
            if let Some(old_slot) = by_hash.insert(hash, slot) {
                if old_slot != slot {
                    by_slot.remove(&old_slot);
                }
            }
            if let Some((_, displaced)) = by_slot.insert(slot, (read, entry)) {
                if displaced.identity.sequence_hash != hash {
                    by_hash.remove(&displaced.identity.sequence_hash);
                }
            }
        } else if by_slot
            .get(&slot)
            .is_some_and(|(_, entry)| entry.identity.sequence_hash == hash)
        {
            by_slot.remove(&slot);
            by_hash.remove(&hash);
        }
        read += 1;
        good += RECORD_LEN;
    }
    let mut live: Vec<(u64, Entry)> = by_slot.into_values().collect();
    live.sort_by_key(|(order, _)| *order);
    (
        live.into_iter().map(|(_, entry)| entry).collect(),
        read,
        good,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const GEOMETRY: Geometry = Geometry {
        block_bytes: 4096,
        block_tokens: 16,
        capacity: 8,
    };

    fn entry(slot: u32, position: u32, parent: Option<u64>, hash: u64) -> Entry {
        Entry {
            slot: BlockId::new(slot),
            identity: BlockIdentity {
                sequence_hash: SequenceHash::new(hash),
                local_hash: LocalBlockHash::new(hash ^ 0xff),
                parent: parent.map(SequenceHash::new),
                position,
            },
            digest: [hash as u8; 32],
        }
    }

    #[test]
    fn what_was_stored_and_not_removed_reads_back_in_the_order_stored() {
        let dir = tempfile::tempdir().unwrap();
        let (entries, replayed) = Journal::read(dir.path(), Some(GEOMETRY)).unwrap();
        assert!(entries.is_empty());
        assert_eq!(replayed, Replayed::default());
        let mut journal = Journal::create(dir.path(), GEOMETRY, &entries).unwrap();
        let (a, b, c) = (
            entry(3, 0, None, 10),
            entry(1, 1, Some(10), 11),
            entry(5, 0, None, 20),
        );
        journal.append(&[a, b], &[]).unwrap();
        journal.append(&[c], &[]).unwrap();
        // Slot 1 is freed and takes another block; block 20 moves from slot 5 to 6
        // without its removal (a lost record): its newest place stands.
        let d = entry(1, 0, None, 30);
        let moved = entry(6, 0, None, 20);
        journal
            .append(&[d, moved], &[(BlockId::new(1), SequenceHash::new(11))])
            .unwrap();
        // A removal naming another block than the slot holds changes nothing.
        journal
            .append(&[], &[(BlockId::new(3), SequenceHash::new(99))])
            .unwrap();
        assert_eq!(journal.records(), 7);
        drop(journal);
        let (entries, replayed) = Journal::read(dir.path(), Some(GEOMETRY)).unwrap();
        assert_eq!(entries, vec![a, d, moved]);
        assert_eq!((replayed.records, replayed.torn_bytes), (7, 0));
    }

    #[test]
    fn a_torn_tail_is_dropped_and_a_rewrite_keeps_only_the_live_entries() {
        let dir = tempfile::tempdir().unwrap();
        let mut journal = Journal::create(dir.path(), GEOMETRY, &[]).unwrap();
        let (a, b) = (entry(0, 0, None, 1), entry(2, 0, None, 2));
        journal.append(&[a, b], &[]).unwrap();
        drop(journal);
        // A crash mid-write: half a record, and a bit flipped in the second.
        let path = dir.path().join(INDEX_FILE);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[HEADER_LEN + RECORD_LEN + 50] ^= 1;
        bytes.extend_from_slice(&[7u8; 40]);
        std::fs::write(&path, &bytes).unwrap();
        let (entries, replayed) = Journal::read(dir.path(), Some(GEOMETRY)).unwrap();
        assert_eq!(entries, vec![a]);
        assert_eq!(replayed.records, 1);
        assert_eq!(replayed.torn_bytes, (RECORD_LEN + 40) as u64);
        let mut journal = Journal::create(dir.path(), GEOMETRY, &entries).unwrap();
        journal.append(&[b], &[]).unwrap();
        assert_eq!(journal.records(), 2);
        // Compacted: b alone.
        journal.rewrite(&[b]).unwrap();
        journal.append(&[a], &[]).unwrap();
        drop(journal);
        assert_eq!(
            std::fs::metadata(&path).unwrap().len(),
            (HEADER_LEN + 2 * RECORD_LEN) as u64
        );
        let (entries, replayed) = Journal::read(dir.path(), Some(GEOMETRY)).unwrap();
        assert_eq!(entries, vec![b, a]);
        assert_eq!(replayed.torn_bytes, 0);
    }

    #[test]
    fn a_journal_of_another_tier_reads_as_empty() {
        let dir = tempfile::tempdir().unwrap();
        let mut journal = Journal::create(dir.path(), GEOMETRY, &[]).unwrap();
        journal.append(&[entry(0, 0, None, 1)], &[]).unwrap();
        drop(journal);
        let bigger = Geometry {
            capacity: 16,
            ..GEOMETRY
        };
        let (entries, replayed) = Journal::read(dir.path(), Some(bigger)).unwrap();
        assert!(entries.is_empty());
        assert!(replayed.foreign);
        // A reader that takes any tier's still finds the block named.
        let (entries, _) = Journal::read(dir.path(), None).unwrap();
        assert_eq!(entries.len(), 1);
        std::fs::write(dir.path().join(INDEX_FILE), b"not a journal").unwrap();
        let (entries, replayed) = Journal::read(dir.path(), Some(GEOMETRY)).unwrap();
        assert!(entries.is_empty() && replayed.foreign);
    }
}
