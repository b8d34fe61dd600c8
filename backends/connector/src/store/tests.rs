//! The store's tests: saves and loads through both tiers, corruption, eviction, and a
//! disk tier that outlives the store.

use super::*;
use kvtwin::ids::LocalBlockHash;

const BYTES: usize = 4096;

fn store(memory_blocks: usize, disk_blocks: usize, dir: &tempfile::TempDir) -> TierStore {
    TierStore::new(StoreConfig {
        block_bytes: BYTES,
        block_size_tokens: 16,
        memory_blocks,
        disk_blocks,
        disk_dir: Some(dir.path().to_path_buf()),
        persistent: false,
    })
    .unwrap()
}

/// A chain of `len` blocks of family `family` (equal families share prefixes).
fn chain(family: u64, len: u64) -> Vec<BlockIdentity> {
    let locals: Vec<LocalBlockHash> = (0..len)
        .map(|i| LocalBlockHash::new(family * 1000 + i))
        .collect();
    BlockIdentity::chain(&locals)
}

fn hashes(chain: &[BlockIdentity]) -> Vec<SequenceHash> {
    chain.iter().map(|id| id.sequence_hash).collect()
}

/// Block `i`'s bytes: its index and sequence hash, repeated.
fn content(id: &BlockIdentity) -> Vec<u8> {
    let seed = id.sequence_hash.get().to_le_bytes();
    (0..BYTES)
        .map(|i| seed[i % 8] ^ (i / 8) as u8 ^ id.position as u8)
        .collect()
}

fn save(store: &mut TierStore, chain: &[BlockIdentity]) -> usize {
    store
        .save(chain, |i, out: &mut [u8]| {
            out.copy_from_slice(&content(&chain[i]));
            Ok::<(), String>(())
        })
        .unwrap()
}

fn load(store: &mut TierStore, chain: &[BlockIdentity]) -> (Vec<Vec<u8>>, Option<LoadError>) {
    let mut blocks = Vec::new();
    let result = store.load(&hashes(chain), |i, bytes| {
        assert_eq!(i, blocks.len());
        blocks.push(bytes.to_vec());
    });
    (blocks, result.err().map(|(_, e)| e))
}

#[test]
fn saved_blocks_come_back_byte_for_byte_from_memory_and_disk() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = store(4, 16, &dir);
    let blocks = chain(1, 6);
    assert_eq!(save(&mut store, &blocks), 6);
    assert!(store.flush(Duration::from_secs(10)));
    // Memory holds the last four; the first two were evicted and are only on disk
    // (the lookup may read more of the run from disk, where all six are).
    assert_eq!(store.blocks_by_tier(), (4, 6));
    let found = store.lookup(&hashes(&blocks));
    assert_eq!(found.blocks(), 6);
    assert!(found.disk >= 2, "{found:?}");
    let (loaded, error) = load(&mut store, &blocks);
    assert_eq!(error, None);
    assert_eq!(loaded.len(), 6);
    for (bytes, id) in loaded.iter().zip(&blocks) {
        assert!(*bytes == content(id), "block {}", id.position);
    }
    let stats = store.stats();
    assert_eq!(
        (stats.loaded_memory_blocks, stats.loaded_disk_blocks),
        (found.memory as u64, found.disk as u64)
    );
    // A longer prompt of the same prefix finds the six and loads only them.
    let longer = chain(1, 9);
    assert_eq!(store.lookup(&hashes(&longer)).blocks(), 6);
    assert_eq!(load(&mut store, &longer).0.len(), 6);
    // Saving the longer one adds its three new blocks only.
    assert_eq!(save(&mut store, &longer), 3);
    assert_eq!(store.stats().already_held_blocks, 6);
}

/// `error` is a corrupt block at `position` of the chain, read from `tier`.
fn assert_corrupt_at(error: &Option<LoadError>, position: usize, tier: Tier) {
    assert!(
        matches!(
            error,
            Some(LoadError::Corrupt { position: p, tier: t, .. }) if *p == position && *t == tier
        ),
        "{error:?}"
    );
}

#[test]
fn a_corrupt_block_stops_the_load_there() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = store(8, 0, &dir);
    let blocks = chain(2, 4);
    save(&mut store, &blocks);
    // Block 2's bytes change under the store.
    let plan = store.manager.lookup(&hashes(&blocks), store.now());
    let id = plan.device_blocks().block_ids().nth(2).unwrap();
    drop(plan);
    store
        .manager
        .hardware()
        .write_block(Tier::Device, id, &vec![0xAB; BYTES])
        .unwrap();
    let (loaded, error) = load(&mut store, &blocks);
    assert_eq!(loaded.len(), 2, "the blocks before it are loaded");
    assert_corrupt_at(&error, 2, Tier::Device);
    assert_eq!(store.stats().corrupt_blocks, 1);
}

#[test]
fn evicted_blocks_are_neither_found_nor_remembered() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = store(2, 0, &dir);
    let first = chain(3, 2);
    let second = chain(4, 2);
    save(&mut store, &first);
    save(&mut store, &second);
    assert_eq!(store.lookup(&hashes(&first)), Found::default());
    assert_eq!(store.lookup(&hashes(&second)).blocks(), 2);
    // Only the held blocks' digests are kept.
    assert_eq!(store.held_blocks(), 2);
    assert_eq!(store.blocks_by_tier(), (2, 0));
    // The events say so: two stored, two removed, two stored.
    let events = store.take_events();
    let removed: usize = events
        .iter()
        .map(|e| match &e.data {
            KvCacheEventData::Removed { block_hashes, .. } => block_hashes.len(),
            _ => 0,
        })
        .sum();
    assert_eq!(removed, 2);
    // And the changes a mirror applies: four held, the first two gone (a chain's
    // tail is evicted before its head).
    let (a, b) = (hashes(&first), hashes(&second));
    assert_eq!(
        store.take_held_changes(),
        vec![
            HeldChange::Held(a[0]),
            HeldChange::Held(a[1]),
            HeldChange::Gone(a[1]),
            HeldChange::Gone(a[0]),
            HeldChange::Held(b[0]),
            HeldChange::Held(b[1]),
        ]
    );
    assert!(store.take_held_changes().is_empty());
}

#[test]
fn a_disk_tier_without_a_directory_is_refused() {
    let error = TierStore::new(StoreConfig {
        block_bytes: BYTES,
        block_size_tokens: 16,
        memory_blocks: 4,
        disk_blocks: 4,
        disk_dir: None,
        persistent: false,
    })
    .err()
    .expect("refused");
    assert_eq!(
        error.to_string(),
        "a disk tier of 4 blocks needs a directory (disk_dir)"
    );
}

fn persistent_store(dir: &tempfile::TempDir) -> Result<TierStore, StoreError> {
    TierStore::new(StoreConfig {
        block_bytes: BYTES,
        block_size_tokens: 16,
        memory_blocks: 4,
        disk_blocks: 16,
        disk_dir: Some(dir.path().to_path_buf()),
        persistent: true,
    })
}

/// A persistent store on `dir` that saves `blocks`, flushes and is dropped.
fn save_and_close(dir: &tempfile::TempDir, blocks: &[BlockIdentity]) {
    let mut store = persistent_store(dir).unwrap();
    save(&mut store, blocks);
    assert!(store.flush(Duration::from_secs(10)));
}

#[test]
fn a_persistent_disk_tier_is_found_again_by_the_next_store() {
    let dir = tempfile::tempdir().unwrap();
    let blocks = chain(5, 6);
    {
        let mut first = persistent_store(&dir).unwrap();
        save(&mut first, &blocks);
        assert!(first.flush(Duration::from_secs(10)));
        // One store per directory.
        let error = persistent_store(&dir).err().expect("the file is locked");
        assert!(error.to_string().contains("in use"), "{error}");
    }
    let mut second = persistent_store(&dir).unwrap();
    assert_eq!(second.stats().adopted_blocks, 6);
    // Host memory starts empty: all six come from disk, byte for byte.
    assert_eq!(
        second.lookup(&hashes(&blocks)),
        Found { memory: 0, disk: 6 }
    );
    let (loaded, error) = load(&mut second, &blocks);
    assert_eq!(error, None);
    for (bytes, id) in loaded.iter().zip(&blocks) {
        assert!(*bytes == content(id), "block {}", id.position);
    }
    // The mirror hears of them as held; saving them again copies nothing.
    let held = second.take_held_changes();
    assert_eq!(held.len(), 6);
    assert!(held
        .iter()
        .all(|change| matches!(change, HeldChange::Held(_))));
    assert_eq!(save(&mut second, &blocks), 0);
    // Blocks saved now are journaled too: a third store finds all nine.
    let longer = chain(5, 9);
    assert_eq!(save(&mut second, &longer), 3);
    assert!(second.flush(Duration::from_secs(10)));
    drop(second);
    let mut third = persistent_store(&dir).unwrap();
    assert_eq!(third.lookup(&hashes(&longer)).blocks(), 9);
}

#[test]
fn a_slot_changed_on_disk_between_stores_fails_its_digest_at_load() {
    let dir = tempfile::tempdir().unwrap();
    let blocks = chain(6, 4);
    save_and_close(&dir, &blocks);
    // Block 2's slot, rewritten with another block's bytes and a valid trailer is out
    // of reach; flipping one byte of its data is what a bad disk does.
    let (entries, _) = crate::journal::Journal::read(dir.path(), None).unwrap();
    let slot = entries
        .iter()
        .find(|entry| entry.identity.position == 2)
        .unwrap()
        .slot;
    let stride = (BYTES + kvtwin_backends::host::TRAILER_LEN)
        .next_multiple_of(kvtwin_backends::host::DIRECT_IO_ALIGN);
    let path = dir.path().join(kvtwin_backends::host::KEPT_FILE);
    let mut file = std::fs::read(&path).unwrap();
    file[slot.index() * stride + 100] ^= 0xFF;
    std::fs::write(&path, &file).unwrap();
    let mut second = persistent_store(&dir).unwrap();
    assert_eq!(second.lookup(&hashes(&blocks)).blocks(), 4);
    let (loaded, error) = load(&mut second, &blocks);
    assert_eq!(loaded.len(), 2, "the blocks before it are loaded");
    assert_corrupt_at(&error, 2, Tier::Disk);
    assert_eq!(second.stats().corrupt_blocks, 1);
    // The bad copy is forgotten: the run stops before it, and saving the chain again
    // (the engine's recompute) writes it anew, after which all four load.
    assert_eq!(second.lookup(&hashes(&blocks)).blocks(), 2);
    assert_eq!(save(&mut second, &blocks), 2);
    assert!(second.flush(Duration::from_secs(10)));
    let (loaded, error) = load(&mut second, &blocks);
    assert_eq!((loaded.len(), error), (4, None));
}

#[test]
fn a_journal_without_its_file_or_a_store_that_does_not_persist_finds_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let blocks = chain(7, 3);
    save_and_close(&dir, &blocks);
    std::fs::remove_file(dir.path().join(kvtwin_backends::host::KEPT_FILE)).unwrap();
    let mut second = persistent_store(&dir).unwrap();
    assert_eq!(second.stats().adopted_blocks, 0);
    assert_eq!(second.lookup(&hashes(&blocks)), Found::default());
    drop(second);
    // Without `persistent` the tier's file goes with the store.
    let other = tempfile::tempdir().unwrap();
    {
        let mut first = store(4, 16, &other);
        save(&mut first, &blocks);
        assert!(first.flush(Duration::from_secs(10)));
    }
    assert_eq!(std::fs::read_dir(other.path()).unwrap().count(), 0);
}

#[test]
fn a_save_longer_than_the_copies_allowed_in_flight_reaches_the_disk_whole() {
    // 100 blocks at once, more than the 64 copies the manager lets fly: every one
    // lands on disk all the same.
    let dir = tempfile::tempdir().unwrap();
    let mut store = store(128, 256, &dir);
    let long = chain(7, 100);
    assert_eq!(save(&mut store, &long), 100);
    assert!(store.flush(Duration::from_secs(10)));
    assert_eq!(store.blocks_by_tier(), (100, 100));
}
