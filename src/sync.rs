//! The one place kvtwin takes its thread-shared primitives from.
//!
//! Under `--cfg loom` these are loom's model-checked types, otherwise std's, with the same
//! API, so `tests/loom_*.rs` check the real pool code. Everything shared between threads
//! (pool state touched by handle drops on any thread, the in-process fabric) must use
//! these and nothing else. [`PoolLock`] is a pool's lock: loom's or std's mutex, or for a
//! pool one thread owns (a simulator's) a flag that thread alone sets, checked by thread.
//! Never: add primitives that no code uses.

#[cfg(loom)]
pub use loom::sync::{atomic::AtomicU64, Arc, Mutex, MutexGuard};

#[cfg(not(loom))]
pub use std::sync::{atomic::AtomicU64, Arc, Mutex, MutexGuard};

/// Locks `mutex`, recovering the data from a poisoned lock: a panic on another thread has
/// already been reported, and block accounting must stay reachable for the handles that
/// are still alive and for the invariant checks.
#[inline]
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    match mutex.lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    }
}

/// A lock for state either shared between threads or owned by one: a pool of a
/// simulator, which builds and runs its managers on one thread, takes it without an
/// atomic read-modify-write (each `lock xchg` or `lock cmpxchg` waits for the stores
/// before it, and a simulated block makes several: issue 33), and checks instead that
/// the thread locking it is the one that built it.
///
/// Safety of the owned form: its state is reached only through [`PoolLock::lock`], which
/// first compares the calling thread's [`thread_number`] with the owner's, written once
/// at construction, and panics on any other thread before touching `held` or the data.
/// So the data and `held` are only ever touched by the owner, one guard at a time
/// (`held`). A thread number is never reused, so a thread that merely has the address
/// of a dead owner's thread-local storage is not taken for it.
pub struct PoolLock<T> {
    mode: LockMode<T>,
}

enum LockMode<T> {
    /// Shared between threads: a mutex.
    Shared(Mutex<T>),
    /// Owned by the thread numbered `thread`.
    Owned {
        thread: u64,
        held: std::cell::Cell<bool>,
        data: std::cell::UnsafeCell<T>,
    },
}

// SAFETY: see the type's documentation: the owned form's cells are reached by its owner
// only (checked on every lock); the shared form is a `Mutex`, `Sync` for `T: Send`.
unsafe impl<T: Send> Sync for PoolLock<T> {}

impl<T> PoolLock<T> {
    /// A lock any thread may take.
    pub fn shared(data: T) -> Self {
        Self {
            mode: LockMode::Shared(Mutex::new(data)),
        }
    }

    /// A lock only the calling thread may take; [`PoolLock::lock`] panics on any other.
    pub fn owned_by_this_thread(data: T) -> Self {
        Self {
            mode: LockMode::Owned {
                thread: thread_number(),
                held: std::cell::Cell::new(false),
                data: std::cell::UnsafeCell::new(data),
            },
        }
    }

    /// Whether only the thread that built it may take it.
    pub fn is_owned(&self) -> bool {
        matches!(self.mode, LockMode::Owned { .. })
    }

    /// Locks the data; a shared lock recovers from poisoning as [`lock`] does.
    ///
    /// # Panics
    /// On an owned lock: from a thread other than its owner, or while the owner already
    /// holds it (where a mutex would deadlock).
    #[inline]
    pub fn lock(&self) -> PoolGuard<'_, T> {
        match &self.mode {
            LockMode::Shared(mutex) => {
                let mut guard = lock(mutex);
                let data = std::ptr::NonNull::from(&mut *guard);
                PoolGuard {
                    data,
                    release: Release::Shared(guard),
                }
            }
            LockMode::Owned { thread, held, data } => {
                assert!(
                    *thread == thread_number(),
                    "a pool owned by one thread (a simulator's) was used from another"
                );
                assert!(
                    !held.replace(true),
                    "a pool owned by one thread locked twice"
                );
                PoolGuard {
                    data: std::ptr::NonNull::new(data.get()).expect("a cell's pointer"),
                    release: Release::Owned(held),
                }
            }
        }
    }
}

impl<T> std::fmt::Debug for PoolLock<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolLock")
            .field("owned", &self.is_owned())
            .finish_non_exhaustive()
    }
}

/// The data of a [`PoolLock`], locked until dropped.
pub struct PoolGuard<'a, T> {
    /// Exclusive while the guard lives: the mutex's guard or the owner's `held` says so.
    data: std::ptr::NonNull<T>,
    release: Release<'a, T>,
}

enum Release<'a, T> {
    /// Unlocks when dropped.
    Shared(#[allow(dead_code)] MutexGuard<'a, T>),
    /// Cleared when the guard drops.
    Owned(&'a std::cell::Cell<bool>),
}

impl<T> std::ops::Deref for PoolGuard<'_, T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: the guard holds the lock (see `data`).
        unsafe { self.data.as_ref() }
    }
}

impl<T> std::ops::DerefMut for PoolGuard<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in `deref`, and `&mut self` makes this the only reference.
        unsafe { self.data.as_mut() }
    }
}

impl<T> Drop for PoolGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        if let Release::Owned(held) = self.release {
            held.set(false);
        }
        // A shared guard's mutex guard unlocks as the field drops, after this.
    }
}

/// This thread's number: given on first use from a process-wide counter, never reused
/// (unlike a thread-local's address or an OS thread id, which a later thread can get).
#[inline]
pub fn thread_number() -> u64 {
    // std's atomics, not loom's: a static, and no model needs to explore it.
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    thread_local! {
        static NUMBER: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    }
    NUMBER.with(|number| match number.get() {
        0 => {
            let given = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            number.set(given);
            given
        }
        given => given,
    })
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn an_owned_lock_gives_its_owner_the_data_and_refuses_another_thread() {
        let owned = Arc::new(PoolLock::owned_by_this_thread(vec![1]));
        owned.lock().push(2);
        assert_eq!(*owned.lock(), vec![1, 2]);
        assert!(owned.is_owned());
        let elsewhere = Arc::clone(&owned);
        let refused = std::thread::spawn(move || {
            elsewhere.lock().push(3);
        })
        .join();
        assert!(refused.is_err(), "another thread took an owned lock");
        // The refusal touched nothing: the owner still locks, and the data is as it was.
        assert_eq!(*owned.lock(), vec![1, 2]);
    }

    #[test]
    fn an_owned_lock_taken_twice_panics_instead_of_aliasing() {
        let owned = PoolLock::owned_by_this_thread(0u32);
        let first = owned.lock();
        let second = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _ = owned.lock();
        }));
        assert!(second.is_err());
        drop(first);
        // Released: it locks again.
        *owned.lock() += 1;
        assert_eq!(*owned.lock(), 1);
    }

    #[test]
    fn a_shared_lock_is_taken_by_every_thread() {
        let shared = Arc::new(PoolLock::shared(0u64));
        assert!(!shared.is_owned());
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let shared = Arc::clone(&shared);
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        *shared.lock() += 1;
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().expect("a thread of the shared lock");
        }
        assert_eq!(*shared.lock(), 4000);
    }

    #[test]
    fn thread_numbers_differ_between_threads_and_stay_on_one() {
        let here = thread_number();
        assert_eq!(here, thread_number());
        let there = std::thread::spawn(thread_number).join().expect("a thread");
        assert_ne!(here, there);
        assert_ne!(there, 0);
    }
}
