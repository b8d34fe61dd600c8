//! The store on real directories: values across the tiers, a restart, a flipped byte.

use super::*;
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
