//! The one place kvtwin takes its thread-shared primitives from.
//!
//! Under `--cfg loom` these are loom's model-checked types, otherwise std's, with the same
//! API, so `tests/loom_*.rs` check the real pool code. Everything shared between threads
//! (pool state touched by handle drops on any thread, the in-process fabric) must use
//! these and nothing else. Never: add primitives that no code uses.

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
