//! The bounded pool of worker threads that runs transfers, and the queue their
//! completions wait in.
//!
//! Owns: [`Workers`] (the threads and the job channel; dropping it closes the channel,
//! lets the threads finish the jobs already sent, and joins them) and [`Completions`] (a
//! FIFO of finished transfers stamped with the time they finished, and a condition
//! variable a driver can wait on). A worker that panics in the middle of a copy reports
//! that transfer failed and goes on, so the manager never waits for a completion that
//! will not come.
//! Never: bound the jobs itself (the hardware refuses submissions beyond its in-flight
//! bound before they reach the channel), or decide what a completion means.

use super::disk::AlignedBuf;
use super::store::{Scratch, Stores};
use super::{lock, HostClock};
use kvtwin::hardware::{Clock, Completion, TransferError, TransferRequest};
use kvtwin::ids::{Timestamp, TransferId};
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

/// One transfer handed to the workers.
#[derive(Debug)]
pub(crate) struct Job {
    pub(crate) id: TransferId,
    pub(crate) request: TransferRequest,
}

/// Finished transfers, oldest first, each with when it finished.
#[derive(Debug, Default)]
pub(crate) struct Completions {
    queue: Mutex<VecDeque<(Timestamp, Completion)>>,
    ready: Condvar,
}

impl Completions {
    /// Queues a finished transfer, stamped now (under the lock, so the stamps of the
    /// queue never decrease), and wakes waiters.
    pub(crate) fn push(&self, clock: &HostClock, completion: Completion) {
        let mut queue = lock(&self.queue);
        queue.push_back((clock.now(), completion));
        self.ready.notify_all();
    }

    /// The oldest completion, if it finished by `now`.
    pub(crate) fn pop_due(&self, now: Timestamp) -> Option<Completion> {
        let mut queue = lock(&self.queue);
        match queue.front() {
            Some((at, _)) if *at <= now => queue.pop_front().map(|(_, completion)| completion),
            _ => None,
        }
    }

    /// Waits up to `timeout` for a completion to be queued; whether one is.
    pub(crate) fn wait(&self, timeout: Duration) -> bool {
        let queue = lock(&self.queue);
        let (queue, _) = self
            .ready
            .wait_timeout_while(queue, timeout, |queue| queue.is_empty())
            .unwrap_or_else(PoisonError::into_inner);
        !queue.is_empty()
    }
}

/// What the workers share with the hardware.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) stores: Stores,
    pub(crate) completions: Completions,
    pub(crate) clock: HostClock,
}

/// The worker threads.
#[derive(Debug)]
pub(crate) struct Workers {
    sender: Option<Sender<Job>>,
    threads: Vec<JoinHandle<()>>,
}

impl Workers {
    /// One thread per staging buffer.
    pub(crate) fn spawn(
        shared: &Arc<Shared>,
        staging: Vec<AlignedBuf>,
    ) -> Result<Self, std::io::Error> {
        let (sender, receiver) = mpsc::channel();
        let receiver = Arc::new(Mutex::new(receiver));
        let mut workers = Self {
            sender: Some(sender),
            threads: Vec::with_capacity(staging.len()),
        };
        for (index, buffer) in staging.into_iter().enumerate() {
            let shared = shared.clone();
            let receiver = receiver.clone();
            // On error `workers` drops here, which joins the threads already started.
            let thread = std::thread::Builder::new()
                .name(format!("kvtwin-host-{index}"))
                .spawn(move || run(&shared, &receiver, buffer))?;
            workers.threads.push(thread);
        }
        Ok(workers)
    }

    /// Hands `job` to a worker; gives it back if every worker is gone.
    pub(crate) fn send(&self, job: Job) -> Result<(), Job> {
        match &self.sender {
            Some(sender) => sender.send(job).map_err(|error| error.0),
            None => Err(job),
        }
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        // Closing the channel ends each worker once the jobs already sent are done.
        drop(self.sender.take());
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

fn run(shared: &Shared, jobs: &Mutex<Receiver<Job>>, staging: AlignedBuf) {
    let mut scratch = Scratch::new(staging);
    loop {
        // One worker waits in `recv` holding the lock, the others wait for the lock.
        let job = lock(jobs).recv();
        let Ok(Job { id, request }) = job else {
            return;
        };
        let result = catch_unwind(AssertUnwindSafe(|| {
            shared.stores.execute(&request, &mut scratch)
        }))
        .unwrap_or(Err(TransferError::Failed {
            tier: request.src_tier,
        }));
        let counters = &shared.stores.counters;
        match result {
            Ok(()) => counters.transfers_completed.fetch_add(1, Ordering::Relaxed),
            Err(_) => counters.transfers_failed.fetch_add(1, Ordering::Relaxed),
        };
        shared
            .completions
            .push(&shared.clock, Completion { id, result });
    }
}
