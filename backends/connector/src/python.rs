//! The Python extension module `kvtwin._native` (feature `python`, built by maturin):
//! what the connector's Python side (`python/kvtwin/connector.py`, the class vLLM
//! loads) calls into.
//!
//! Owns: `block_identities` (kvtwin's hashes of a prompt's full blocks: the router's
//! and Dynamo's scheme, so events and lookups name blocks alike everywhere), the class
//! `Store` (a [`TierStore`] and the engine's [`EngineLayout`]: saves gather engine blocks
//! into the store, loads scatter them back; its tiers' events named by vLLM's media,
//! [`medium_of`]; and, when attached, the [`SharedTier`] below them, loaded from and
//! written to the same way) and the class `Shared` (the scheduler side's question to
//! the shared tier: how far a prompt's prefix is there). Never: hold a torch tensor (Python passes
//! addresses and keeps the tensors alive), or decide what to save or load (the
//! scheduler side does, in Python).

use crate::layout::EngineLayout;
use crate::shared::{SharedBlock, SharedTier};
use crate::store::{HeldChange, StoreConfig, TierStore};
use kvtwin::block::BlockIdentity;
use kvtwin::events::KvCacheEventData;
use kvtwin::ids::{LocalBlockHash, SequenceHash};
use kvtwin::tier::Tier;
use kvtwin::tokens::{compute_local_hashes, HashSeed};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::path::PathBuf;
use std::time::Duration;

/// `(sequence hash, local hash)` of each full block of `tokens`, first first, with the
/// hash seed of LoRA adapter `lora` and cache salt `salt` (neither: the default seed),
/// as the router hashes a request.
#[pyfunction]
#[pyo3(signature = (tokens, block_size, lora=None, salt=None))]
fn block_identities(
    tokens: Vec<u32>,
    block_size: usize,
    lora: Option<&str>,
    salt: Option<&str>,
) -> Vec<(u64, u64)> {
    let seed = HashSeed::for_request(lora, salt);
    let locals = compute_local_hashes(&tokens, block_size, seed);
    BlockIdentity::chain(&locals)
        .iter()
        .map(|id| (id.sequence_hash.get(), id.local_hash.get()))
        .collect()
}

/// The sequence hashes of the blocks a persistent disk tier's journal in `disk_dir`
/// names (any tier's; none without a journal): what the scheduler side's mirror starts
/// from after a restart, before the worker's store has said what it kept.
#[pyfunction]
fn journaled_blocks(disk_dir: PathBuf) -> PyResult<Vec<u64>> {
    let (entries, _) = crate::journal::Journal::read(&disk_dir, None).map_err(value_error)?;
    Ok(entries
        .iter()
        .map(|entry| entry.identity.sequence_hash.get())
        .collect())
}

/// A save's block: `(engine block, position, sequence hash, local hash, parent,
/// tokens)`; the tokens go to the shared store with the block (its KV events name them)
/// and may be empty without one.
type SaveBlock = (usize, u32, u64, u64, Option<u64>, Vec<u32>);

/// The connector's tiers and the engine's KV cache.
#[pyclass(unsendable, module = "kvtwin._native")]
struct Store {
    store: TierStore,
    layout: Option<EngineLayout>,
    shared: Option<SharedTier>,
}

/// The scheduler side's view of the shared tier.
#[pyclass(unsendable, module = "kvtwin._native")]
struct Shared {
    tier: SharedTier,
}

#[pymethods]
impl Shared {
    /// The shared store at `url` (`redis://[:PASSWORD@]HOST:PORT`), blocks named under
    /// `namespace`; connects at the first question.
    #[new]
    fn new(url: &str, namespace: &str) -> PyResult<Self> {
        Ok(Self {
            tier: SharedTier::new(url, namespace).map_err(value_error)?,
        })
    }

    /// How many of `hashes` (sequence hashes, a chain parent first) it holds as a
    /// leading run; raises when it cannot be asked.
    fn prefix(&mut self, hashes: Vec<u64>) -> PyResult<usize> {
        let hashes: Vec<SequenceHash> = hashes.into_iter().map(SequenceHash::new).collect();
        self.tier
            .prefix(&hashes)
            .map_err(|e| PyRuntimeError::new_err(e.to_string()))
    }

    /// Where it is, without a password.
    fn url(&self) -> String {
        self.tier.url().to_string()
    }
}

fn value_error(e: impl std::fmt::Display) -> PyErr {
    PyValueError::new_err(e.to_string())
}

#[pymethods]
impl Store {
    /// Host memory of `memory_blocks` blocks of `block_bytes`, written through to
    /// `disk_blocks` on disk in `disk_dir`, kept there for the next store when
    /// `persistent` (the blocks of the last one found again).
    #[new]
    #[pyo3(signature = (block_bytes, block_size_tokens, memory_blocks, disk_blocks=0, disk_dir=None, persistent=true))]
    fn new(
        block_bytes: usize,
        block_size_tokens: usize,
        memory_blocks: usize,
        disk_blocks: usize,
        disk_dir: Option<PathBuf>,
        persistent: bool,
    ) -> PyResult<Self> {
        let store = TierStore::new(StoreConfig {
            block_bytes,
            block_size_tokens,
            memory_blocks,
            disk_blocks,
            disk_dir,
            persistent,
        })
        .map_err(value_error)?;
        Ok(Self {
            store,
            layout: None,
            shared: None,
        })
    }

    /// Puts the shared store at `url` below the store's tiers, blocks named under
    /// `namespace` (`load_shared`, `put_shared`).
    fn attach_shared(&mut self, url: &str, namespace: &str) -> PyResult<()> {
        self.shared = Some(SharedTier::new(url, namespace).map_err(value_error)?);
        Ok(())
    }

    /// Loads `(engine block, sequence hash)` pairs, a chain parent first, from the
    /// shared store into the engine's blocks: `(blocks loaded, why the rest were not or
    /// None)`.
    fn load_shared(&mut self, blocks: Vec<(usize, u64)>) -> PyResult<(usize, Option<String>)> {
        let Self { layout, shared, .. } = self;
        let layout = layout.as_ref().ok_or_else(no_layout)?;
        let shared = shared.as_mut().ok_or_else(no_shared)?;
        let block_bytes = layout.block_bytes();
        load_into(
            layout,
            &blocks,
            "not in the shared store, or not whole",
            |hashes, scatter| {
                shared
                    .get(hashes, block_bytes, |i, bytes| scatter(i, bytes))
                    .map_err(|e| (0, e.to_string()))
            },
        )
    }

    /// Writes engine blocks (a save's chain) to the shared store, those it is not known
    /// to hold, each with its parent and tokens (what the store's KV events say); how
    /// many were sent. Raises when the store cannot take them.
    fn put_shared(&mut self, blocks: Vec<SaveBlock>) -> PyResult<usize> {
        let Self { layout, shared, .. } = self;
        let layout = layout.as_ref().ok_or_else(no_layout)?;
        let shared = shared.as_mut().ok_or_else(no_shared)?;
        let mut bytes = Vec::with_capacity(blocks.len());
        for block in &blocks {
            let mut buffer = vec![0u8; layout.block_bytes()];
            layout.gather(block.0, &mut buffer).map_err(value_error)?;
            bytes.push((SequenceHash::new(block.2), buffer));
        }
        let chain: Vec<SharedBlock<'_>> = blocks
            .iter()
            .zip(&bytes)
            .map(|(block, (hash, bytes))| SharedBlock {
                hash: *hash,
                parent: block.4.map(SequenceHash::new),
                tokens: &block.5,
                bytes: bytes.as_slice(),
            })
            .collect();
        shared
            .put(&chain)
            .map_err(|e| PyRuntimeError::new_err(e.to_string()))
    }

    /// The engine's KV cache: per layer the address of its first block's page, each
    /// layer `num_blocks` pages of `page_bytes`. The caller keeps the tensors alive for
    /// as long as this store lives.
    fn register_layout(
        &mut self,
        addresses: Vec<usize>,
        num_blocks: usize,
        page_bytes: usize,
    ) -> PyResult<()> {
        // SAFETY: the Python side holds the engine's tensors for the store's life and
        // calls save and load only between forward passes (see `EngineLayout::from_raw`).
        let layout = unsafe { EngineLayout::from_raw(&addresses, num_blocks, page_bytes) }
            .map_err(value_error)?;
        if layout.block_bytes() != self.store.block_bytes() {
            return Err(PyValueError::new_err(format!(
                "the engine's blocks are {} bytes ({} layers × {page_bytes}), the store's {}",
                layout.block_bytes(),
                layout.layers(),
                self.store.block_bytes()
            )));
        }
        self.layout = Some(layout);
        Ok(())
    }

    /// The leading run of `hashes` held: `(in memory, only on disk)`.
    fn lookup(&mut self, hashes: Vec<u64>) -> (usize, usize) {
        let hashes: Vec<SequenceHash> = hashes.into_iter().map(SequenceHash::new).collect();
        let found = self.store.lookup(&hashes);
        (found.memory, found.disk)
    }

    /// Saves engine blocks (a chain, parent first) the store does not hold yet; how many
    /// were saved.
    fn save(&mut self, blocks: Vec<SaveBlock>) -> PyResult<usize> {
        let Self { store, layout, .. } = self;
        let layout = layout.as_ref().ok_or_else(no_layout)?;
        let chain: Vec<BlockIdentity> = blocks
            .iter()
            .map(|&(_, position, sequence, local, parent, _)| BlockIdentity {
                sequence_hash: SequenceHash::new(sequence),
                local_hash: LocalBlockHash::new(local),
                parent: parent.map(SequenceHash::new),
                position,
            })
            .collect();
        let engine_blocks: Vec<usize> = blocks.iter().map(|b| b.0).collect();
        store
            .save(&chain, |i, out| layout.gather(engine_blocks[i], out))
            .map_err(|e| PyRuntimeError::new_err(e.to_string()))
    }

    /// Loads `(engine block, sequence hash)` pairs, a chain parent first, into the
    /// engine's blocks: `(blocks loaded, why the rest were not or None)`.
    fn load(&mut self, blocks: Vec<(usize, u64)>) -> PyResult<(usize, Option<String>)> {
        let Self { store, layout, .. } = self;
        let layout = layout.as_ref().ok_or_else(no_layout)?;
        // Fewer than asked: the rest were evicted before the lookup found them.
        load_into(layout, &blocks, "no longer held", |hashes, scatter| {
            store
                .load(hashes, |i, bytes| scatter(i, bytes))
                .map_err(|(loaded, e)| (loaded, e.to_string()))
        })
    }

    /// Blocks that became held by the store and blocks no longer held, since the last
    /// call: `(held, gone)` sequence hashes, for the scheduler side's mirror.
    fn take_held_changes(&mut self) -> (Vec<u64>, Vec<u64>) {
        let (mut held, mut gone) = (Vec::new(), Vec::new());
        for change in self.store.take_held_changes() {
            match change {
                HeldChange::Held(hash) => held.push(hash.get()),
                HeldChange::Gone(hash) => gone.push(hash.get()),
            }
        }
        (held, gone)
    }

    /// What the store's tiers did since the last call, oldest first, for the engine's KV
    /// events: `(stored, medium, sequence hashes)`, a chain parent first when stored;
    /// `(false, None, [])` when every block of every tier went at once.
    fn take_tier_events(&mut self) -> Vec<(bool, Option<&'static str>, Vec<u64>)> {
        self.store
            .take_events()
            .into_iter()
            .map(|event| match event.data {
                KvCacheEventData::Stored { blocks, tier, .. } => (
                    true,
                    Some(medium_of(tier)),
                    blocks.iter().map(|block| block.block_hash.get()).collect(),
                ),
                KvCacheEventData::Removed { block_hashes, tier } => (
                    false,
                    Some(medium_of(tier)),
                    block_hashes.iter().map(|hash| hash.get()).collect(),
                ),
                KvCacheEventData::Cleared => (false, None, Vec::new()),
            })
            .collect()
    }

    /// Waits at most `seconds` for the copies to disk; whether they all landed.
    fn flush(&mut self, seconds: f64) -> bool {
        self.store
            .flush(Duration::from_secs_f64(seconds.clamp(0.0, 3600.0)))
    }

    /// The counters, by name.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let stats = self.store.stats();
        let dict = PyDict::new(py);
        dict.set_item("saved_blocks", stats.saved_blocks)?;
        dict.set_item("already_held_blocks", stats.already_held_blocks)?;
        dict.set_item("loaded_memory_blocks", stats.loaded_memory_blocks)?;
        dict.set_item("loaded_disk_blocks", stats.loaded_disk_blocks)?;
        dict.set_item("corrupt_blocks", stats.corrupt_blocks)?;
        dict.set_item("missing_blocks", stats.missing_blocks)?;
        dict.set_item("dropped_events", stats.dropped_events)?;
        dict.set_item("adopted_blocks", stats.adopted_blocks)?;
        dict.set_item("orphaned_blocks", stats.orphaned_blocks)?;
        dict.set_item("journal_errors", stats.journal_errors)?;
        dict.set_item("held_blocks", self.store.held_blocks())?;
        let (memory, disk) = self.store.blocks_by_tier();
        dict.set_item("memory_blocks", memory)?;
        dict.set_item("disk_blocks", disk)?;
        if let Some(shared) = &self.shared {
            let s = shared.stats();
            dict.set_item("loaded_shared_blocks", s.loaded_blocks)?;
            dict.set_item("shared_missing_blocks", s.missing_blocks)?;
            dict.set_item("shared_corrupt_blocks", s.corrupt_blocks)?;
            dict.set_item("shared_put_blocks", s.put_blocks)?;
            dict.set_item("shared_known_blocks", s.known_blocks)?;
            dict.set_item("shared_errors", s.errors)?;
        }
        Ok(dict)
    }
}

/// The medium vLLM's KV events name a store tier by: the manager's first tier is the
/// store's host memory (`CPU`), its disk tier `DISK` (WIRE.md: both tiers kvtwin's router
/// counts apart from the engine's own `GPU` blocks).
fn medium_of(tier: Tier) -> &'static str {
    match tier {
        Tier::Disk => "DISK",
        _ => "CPU",
    }
}

/// Reads `blocks` (engine block, sequence hash; a chain parent first) into the engine's
/// blocks with `read`, which hands each block's bytes to its callback in order and says
/// how many it handed (or how many before what stopped it): `(blocks loaded, why the rest
/// were not)`, `short` saying why when fewer came without an error.
fn load_into(
    layout: &EngineLayout,
    blocks: &[(usize, u64)],
    short: &str,
    read: impl FnOnce(&[SequenceHash], &mut dyn FnMut(usize, &[u8])) -> Result<usize, (usize, String)>,
) -> PyResult<(usize, Option<String>)> {
    let hashes: Vec<SequenceHash> = blocks.iter().map(|b| SequenceHash::new(b.1)).collect();
    let mut failed = None;
    let result = read(&hashes, &mut |i, bytes| {
        if let Err(e) = layout.scatter(blocks[i].0, bytes) {
            failed.get_or_insert(e.to_string());
        }
    });
    if let Some(e) = failed {
        return Err(PyRuntimeError::new_err(e));
    }
    Ok(match result {
        Ok(loaded) if loaded < blocks.len() => (
            loaded,
            Some(format!(
                "{} of {} blocks {short}",
                blocks.len() - loaded,
                blocks.len()
            )),
        ),
        Ok(loaded) => (loaded, None),
        Err((loaded, e)) => (loaded, Some(e)),
    })
}

fn no_shared() -> PyErr {
    PyRuntimeError::new_err("attach_shared first: the store has no shared tier")
}

fn no_layout() -> PyErr {
    PyRuntimeError::new_err("register_layout first: the store has no engine KV cache")
}

/// The module.
#[pymodule]
fn _native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_function(wrap_pyfunction!(block_identities, module)?)?;
    module.add_function(wrap_pyfunction!(journaled_blocks, module)?)?;
    module.add_class::<Store>()?;
    module.add_class::<Shared>()?;
    Ok(())
}
