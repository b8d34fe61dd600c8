//! The store on real directories: values across the tiers, a restart, a flipped byte.

use super::*;
use kvtwin::block_frame;
use object_store::local::LocalFileSystem;

fn dir_store(path: &std::path::Path) -> Arc<dyn ObjectStore> {
    std::fs::create_dir_all(path).unwrap();
    Arc::new(LocalFileSystem::new_with_prefix(path).unwrap())
}

fn config(dir: &std::path::Path, limits: [u64; 3]) -> StoreConfig {
    StoreConfig {
        limits,
        disk: Some(dir_store(&dir.join("disk"))),
        object: Some(dir_store(&dir.join("object"))),
        max_value: 1 << 20,
        promote_on_hit: false,
        events: None,
    }
}

fn value(n: u8, len: usize) -> Bytes {
    Bytes::from(vec![n; len])
}

/// A record of a 1,000-byte value under a 2-byte key.
const RECORD: u64 = (FIXED_HEADER + 2 + 1000) as u64;

#[tokio::test]
async fn values_move_down_the_tiers_and_read_back_from_each() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(config(dir.path(), [RECORD, RECORD, RECORD]))
        .await
        .unwrap();
    for n in 0..4u8 {
        store
            .put(Bytes::from(format!("k{n}")), value(n, 1000))
            .await
            .unwrap();
    }
    let occupancy = store.occupancy().await;
    // k3 in memory, k2 on disk, k1 in the object tier, k0 gone.
    assert_eq!(occupancy.keys, 3);
    assert_eq!(occupancy.tiers.map(|(keys, ..)| keys), [1, 1, 1]);
    assert_eq!(store.get(b"k0").await.map(|v| v.to_bytes()), None);
    for n in 1..4u8 {
        assert_eq!(
            store
                .get(format!("k{n}").as_bytes())
                .await
                .map(|v| v.to_bytes()),
            Some(value(n, 1000))
        );
    }
    assert_eq!(store.counters.evictions[2].load(Ordering::Relaxed), 1);
    assert_eq!(
        store
            .counters
            .hits
            .each_ref()
            .map(|h| h.load(Ordering::Relaxed)),
        [1, 1, 1]
    );
    // Each tier's directory holds just its copy.
    let files = |tier: &str| std::fs::read_dir(dir.path().join(tier)).unwrap().count();
    assert_eq!((files("disk"), files("object")), (1, 1));
    assert!(store.delete(b"k1").await);
    assert!(!store.delete(b"k1").await);
    assert_eq!(files("object"), 0);
}

#[tokio::test]
async fn a_restart_finds_what_lay_on_disk_and_in_the_object_tier() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open(config(dir.path(), [RECORD, RECORD, RECORD]))
            .await
            .unwrap();
        for n in 0..3u8 {
            store
                .put(Bytes::from(format!("k{n}")), value(n, 1000))
                .await
                .unwrap();
        }
        // Overwritten: the newer copy is the one found again.
        store
            .put(Bytes::from_static(b"k0"), value(9, 1000))
            .await
            .unwrap();
    }
    let store = Store::open(config(dir.path(), [RECORD, RECORD, RECORD]))
        .await
        .unwrap();
    // DRAM's copy (k0's newest) is lost with the process; k2 (disk) and k1 (object) are not.
    assert_eq!(
        store.get(b"k2").await.map(|v| v.to_bytes()),
        Some(value(2, 1000))
    );
    assert_eq!(
        store.get(b"k1").await.map(|v| v.to_bytes()),
        Some(value(1, 1000))
    );
    assert_eq!(store.get(b"k0").await.map(|v| v.to_bytes()), None);
    // New copies never reuse a recovered copy's number.
    store
        .put(Bytes::from_static(b"k5"), value(5, 1000))
        .await
        .unwrap();
    assert_eq!(
        store.get(b"k2").await.map(|v| v.to_bytes()),
        Some(value(2, 1000))
    );
}

#[tokio::test]
async fn a_flipped_byte_on_disk_is_caught_dropped_and_answered_as_missing() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(config(dir.path(), [0, 10 * RECORD, 0]))
        .await
        .unwrap();
    store
        .put(Bytes::from_static(b"k1"), value(1, 1000))
        .await
        .unwrap();
    let file = std::fs::read_dir(dir.path().join("disk"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let mut bytes = std::fs::read(&file).unwrap();
    *bytes.last_mut().unwrap() ^= 0x40;
    std::fs::write(&file, bytes).unwrap();
    assert_eq!(store.get(b"k1").await.map(|v| v.to_bytes()), None);
    assert_eq!(store.counters.corrupt.load(Ordering::Relaxed), 1);
    assert!(!store.contains(b"k1").await, "dropped");
    assert!(!file.exists(), "deleted");
}

#[tokio::test]
async fn a_hit_below_moves_the_value_to_memory_when_told_to() {
    let dir = tempfile::tempdir().unwrap();
    let mut promoting = config(dir.path(), [RECORD, 4 * RECORD, 0]);
    promoting.promote_on_hit = true;
    let store = Store::open(promoting).await.unwrap();
    store
        .put(Bytes::from_static(b"k1"), value(1, 1000))
        .await
        .unwrap();
    store
        .put(Bytes::from_static(b"k2"), value(2, 1000))
        .await
        .unwrap();
    assert_eq!(
        store.get(b"k1").await.map(|v| v.to_bytes()),
        Some(value(1, 1000))
    );
    assert_eq!(store.counters.promotions.load(Ordering::Relaxed), 1);
    // k1 back in memory, k2 moved down in its place.
    assert_eq!(
        store.occupancy().await.tiers.map(|(keys, ..)| keys),
        [1, 1, 0]
    );
    assert_eq!(
        store.get(b"k1").await.map(|v| v.to_bytes()),
        Some(value(1, 1000))
    );
    assert_eq!(store.counters.hits[0].load(Ordering::Relaxed), 1);
}

#[tokio::test]
async fn values_over_the_bounds_are_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(config(dir.path(), [RECORD, 0, 0]))
        .await
        .unwrap();
    assert!(matches!(
        store.put(Bytes::from_static(b"k"), value(0, 2 << 20)).await,
        Err(StoreError::ValueTooLarge { .. })
    ));
    assert!(matches!(
        store.put(Bytes::from_static(b"k"), value(0, 5000)).await,
        Err(StoreError::Full(Full::TooLarge { .. }))
    ));
    assert!(matches!(
        store
            .put(Bytes::from(vec![b'k'; MAX_KEY + 1]), value(0, 1))
            .await,
        Err(StoreError::KeyTooLong(_))
    ));
    assert_eq!(store.counters.refused.load(Ordering::Relaxed), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_readers_and_writers_never_see_a_torn_value() {
    let dir = tempfile::tempdir().unwrap();
    // Small tiers: every put moves others down and out while readers lease them.
    let store = Arc::new(
        Store::open(config(dir.path(), [2 * RECORD, 3 * RECORD, 3 * RECORD]))
            .await
            .unwrap(),
    );
    let tasks: Vec<_> = (0..8u8)
        .map(|client| {
            let store = store.clone();
            tokio::spawn(async move {
                for round in 0..60u32 {
                    let n = ((round * 7 + u32::from(client)) % 10) as u8;
                    let key = Bytes::from(format!("k{n}"));
                    if round % 3 == 0 {
                        store.put(key, value(n, 1000)).await.unwrap();
                    } else if let Some(got) = store.get(&key).await.map(|v| v.to_bytes()) {
                        // Every value is its key's byte, whole.
                        assert_eq!(got, value(n, 1000));
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let occupancy = store.occupancy().await;
    assert_eq!(occupancy.leased, 0);
    for (_, used, limit) in occupancy.tiers {
        assert!(used <= limit);
    }
    assert_eq!(store.counters.corrupt.load(Ordering::Relaxed), 0);
}

/// A block frame of `len` bytes: block `hash` under `parent`, tokens of its own.
fn block(hash: u64, parent: Option<u64>, len: usize) -> Bytes {
    let tokens: Vec<u32> = (0..4).map(|t| hash as u32 * 10 + t).collect();
    Bytes::from(block_frame::encode(
        SequenceHash::new(hash),
        parent.map(SequenceHash::new),
        &tokens,
        &vec![hash as u8; len],
    ))
}

/// A store with events (one transport) over `limits`, and that transport's receiver.
async fn announcing(
    dir: &std::path::Path,
    limits: [u64; 3],
) -> (Store, crate::events::EventReceiver) {
    let mut events = StoreEvents::new();
    let receiver = events.add_transport("test", 1024);
    let mut config = config(dir, limits);
    config.events = Some(Arc::new(events));
    (Store::open(config).await.unwrap(), receiver)
}

/// What was announced since the last call: `+hash` stored, `-hash` removed.
fn announced(receiver: &mut crate::events::EventReceiver) -> Vec<String> {
    let mut seen = Vec::new();
    while let Ok(event) = receiver.queue.try_recv() {
        seen.push(match &*event {
            StoreEvent::Stored(block) => format!("+{}", block.hash.get()),
            StoreEvent::Removed(hash) => format!("-{}", hash.get()),
        });
    }
    seen
}

/// A record of a 1,000-byte block frame under a 2-byte key.
const BLOCK_RECORD: u64 = (FIXED_HEADER + 2 + block_frame::FIXED_BYTES + 16 + 1000) as u64;

#[tokio::test]
async fn blocks_are_announced_once_in_the_store_and_removed_with_their_last_copy() {
    let dir = tempfile::tempdir().unwrap();
    let r = BLOCK_RECORD;
    let (store, mut events) = announcing(dir.path(), [r, r, r]).await;
    for n in 1..=3u64 {
        let parent = (n > 1).then_some(n - 1);
        store
            .put(Bytes::from(format!("k{n}")), block(n, parent, 1000))
            .await
            .unwrap();
    }
    // Each moved down as the next came: moves are not removals.
    assert_eq!(announced(&mut events), ["+1", "+2", "+3"]);
    let frame = block(2, Some(1), 8);
    let decoded = block_frame::decode(&frame).unwrap();
    assert_eq!(decoded.identity.unwrap().tokens, [20, 21, 22, 23]);
    // The same block again, and read back (promotion off): nothing new.
    store
        .put(Bytes::from_static(b"k3"), block(3, Some(2), 1000))
        .await
        .unwrap();
    assert!(store.get(b"k1").await.is_some());
    assert_eq!(announced(&mut events), Vec::<String>::new());
    // A fourth pushes k1 out of the lowest tier: removed (room is made first).
    store
        .put(Bytes::from_static(b"k4"), block(4, Some(3), 1000))
        .await
        .unwrap();
    assert_eq!(announced(&mut events), ["-1", "+4"]);
    // DEL, and a block overwritten by something that is not one.
    assert!(store.delete(b"k2").await);
    store
        .put(Bytes::from_static(b"k3"), value(0, 1000))
        .await
        .unwrap();
    assert_eq!(announced(&mut events), ["-2", "-3"]);
    // Another client's values (and the connector's first frames) announce nothing,
    // counted.
    store
        .put(Bytes::from_static(b"lm"), Bytes::from_static(b"kv_bytes"))
        .await
        .unwrap();
    assert_eq!(announced(&mut events), Vec::<String>::new());
    let counters = &store.events.as_ref().unwrap().counters;
    assert_eq!(counters.non_block_values.load(Ordering::Relaxed), 2);
    assert_eq!(counters.stored.load(Ordering::Relaxed), 4);
    assert_eq!(counters.removed.load(Ordering::Relaxed), 3);
    assert_eq!(store.clear().await, 3);
    assert_eq!(announced(&mut events), ["-4"]);
}

#[tokio::test]
async fn one_block_under_two_keys_is_announced_once_and_removed_with_the_second() {
    let dir = tempfile::tempdir().unwrap();
    let (store, mut events) = announcing(dir.path(), [10 * BLOCK_RECORD, 0, 0]).await;
    for key in ["a:1", "b:1"] {
        store
            .put(Bytes::from(key), block(1, None, 1000))
            .await
            .unwrap();
    }
    assert_eq!(announced(&mut events), ["+1"]);
    assert!(store.delete(b"a:1").await);
    assert_eq!(announced(&mut events), Vec::<String>::new());
    assert!(store.delete(b"b:1").await);
    assert_eq!(announced(&mut events), ["-1"]);
}

#[tokio::test]
async fn a_restarted_store_announces_the_blocks_it_found_and_a_corrupt_one_goes() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (store, _) = announcing(dir.path(), [0, 10 * BLOCK_RECORD, 0]).await;
        store
            .put(Bytes::from_static(b"k1"), block(1, None, 1000))
            .await
            .unwrap();
        store
            .put(Bytes::from_static(b"k2"), block(2, Some(1), 1000))
            .await
            .unwrap();
        store
            .put(Bytes::from_static(b"lm"), value(7, 1000))
            .await
            .unwrap();
    }
    let (store, mut events) = announcing(dir.path(), [0, 10 * BLOCK_RECORD, 0]).await;
    let mut found = announced(&mut events);
    found.sort();
    assert_eq!(found, ["+1", "+2"]);
    // k2's bytes flipped on disk: found corrupt when read, dropped, removed.
    let digest_of_k2 = *blake3::hash(&block(2, Some(1), 1000)).as_bytes();
    for file in std::fs::read_dir(dir.path().join("disk")).unwrap() {
        let path = file.unwrap().path();
        let mut bytes = std::fs::read(&path).unwrap();
        if bytes.windows(32).any(|w| w == digest_of_k2) {
            *bytes.last_mut().unwrap() ^= 1;
            std::fs::write(&path, bytes).unwrap();
        }
    }
    assert_eq!(store.get(b"k2").await, None);
    assert_eq!(announced(&mut events), ["-2"]);
}
