//! NIXL (feature `nixl`): real bytes between agents, memory to memory over UCX and memory
//! to file over POSIX, through `nixl-sys` with its `stub-api`.
//!
//! Owns: [`NixlLibrary`] (loads `libnixl_capi.so` by explicit path before any `nixl-sys`
//! call, so a missing library is a [`NixlError`], never the stub's abort),
//! [`NixlAgent`] (an agent with its backends, registrations of [`HostBuffer`]s and
//! [`FileRegion`]s, metadata exchange, transfers polled to completion), [`NixlPeer`] (an
//! agent's metadata and its layout descriptor, serialised for a peer) and [`NixlFabric`]
//! (a [`kvtwin::fabric::Fabric`] that carries MRDN v1 frames from one agent's registered
//! memory to another's).
//!
//! Invariants: no `nixl-sys` function runs before [`NixlLibrary::load`] succeeded (every
//! constructor here takes a `&NixlLibrary`); memory stays registered, and a transfer's
//! memory stays alive, until the transfer has completed or failed (registrations own
//! their buffers, transfers borrow their registrations, and an unfinished transfer waits
//! for its backend when dropped).
//! Never: panic or abort on a missing or broken library, hand out references into memory
//! a backend may write (buffers are read and written by copy), or start a thread or a
//! listener of its own (metadata is exchanged by the caller, in process or over any
//! transport).

mod agent;
mod fabric;
mod library;
mod memory;
mod peer;

pub use agent::{
    BlockTarget, FileRegistration, HostRegistration, NixlAgent, NixlBackend, RemotePeer, Target,
    Transfer, TransferOp, TransferState,
};
pub use fabric::{NixlFabric, NixlFabricConfig, NixlFabricError};
pub use library::{NixlLibrary, CAPI_LIBRARY, LIB_DIR_ENV};
pub use memory::{FileRegion, HostBuffer};
pub use peer::{NixlPeer, PeerError};

use kvtwin::layout::LayoutError;
use std::path::PathBuf;
use std::time::Duration;

/// A NIXL operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NixlError {
    /// [`LIB_DIR_ENV`] names no folder.
    #[error("{LIB_DIR_ENV} is not set: run scripts/setup-nixl.sh and export what it prints")]
    LibraryDirUnset,
    /// No `libnixl_capi.so` where it was looked for.
    #[error("{} not found (run scripts/setup-nixl.sh)", path.display())]
    LibraryMissing {
        /// The path tried.
        path: PathBuf,
    },
    /// The library is there but the dynamic loader refused it (a missing dependency, the
    /// wrong architecture).
    #[error("cannot load {}: {reason}", path.display())]
    LibraryLoad {
        /// The path tried.
        path: PathBuf,
        /// The loader's message.
        reason: String,
    },
    /// The library loaded, yet `nixl-sys` still resolves to its stubs (its own lookup by
    /// name did not find the loaded library): calling it would abort the process.
    #[error("nixl-sys did not pick up {} and is still a stub", path.display())]
    Stub {
        /// The library that was loaded.
        path: PathBuf,
    },
    /// The agent's NIXL installation has no plugin for a backend.
    #[error("no NIXL plugin {plugin} (available: {available:?})")]
    PluginMissing {
        /// The plugin asked for.
        plugin: &'static str,
        /// The plugins found.
        available: Vec<String>,
    },
    /// The agent was not created with a backend an operation needs.
    #[error("agent {agent} has no {backend:?} backend")]
    NoBackend {
        /// The agent.
        agent: String,
        /// The backend.
        backend: NixlBackend,
    },
    /// A `nixl-sys` call failed.
    #[error("NIXL {op} failed: {source}")]
    Call {
        /// What was being done.
        op: &'static str,
        /// The error `nixl-sys` returned.
        #[source]
        source: nixl_sys::NixlError,
    },
    /// A posted transfer ended in error.
    #[error("NIXL transfer of {bytes} bytes failed: {source}")]
    TransferFailed {
        /// Bytes the transfer was to move.
        bytes: u64,
        /// The status `nixl-sys` reported.
        #[source]
        source: nixl_sys::NixlError,
    },
    /// A transfer did not complete in time (it is still waited for when dropped).
    #[error("NIXL transfer of {bytes} bytes still in progress after {waited:?}")]
    Timeout {
        /// Bytes the transfer was to move.
        bytes: u64,
        /// How long it was waited for.
        waited: Duration,
    },
    /// A byte range outside the memory or file it should lie in.
    #[error("range {addr:#x}+{len} lies outside {base:#x}+{capacity}")]
    OutOfBounds {
        /// Start of the range.
        addr: u64,
        /// Its length.
        len: u64,
        /// Start of the memory or file.
        base: u64,
        /// Its length.
        capacity: u64,
    },
    /// Local and remote ranges that do not pair up (count or lengths differ).
    #[error("{local} local and {remote} remote ranges, or their lengths, do not match")]
    RangeMismatch {
        /// Local ranges.
        local: usize,
        /// Remote ranges.
        remote: usize,
    },
    /// Two layouts whose blocks have different shapes.
    #[error("layouts do not match: {local_layers} × {local_layer_bytes} B vs {remote_layers} × {remote_layer_bytes} B per block")]
    LayoutMismatch {
        /// Layers of a local block.
        local_layers: u32,
        /// Bytes of a local layer.
        local_layer_bytes: u64,
        /// Layers of a remote block.
        remote_layers: u32,
        /// Bytes of a remote layer.
        remote_layer_bytes: u64,
    },
    /// A transfer with nothing to move.
    #[error("empty transfer")]
    EmptyTransfer,
    /// A buffer of zero bytes, or one too large to allocate.
    #[error("cannot allocate a host buffer of {len} bytes")]
    Alloc {
        /// The size asked for.
        len: usize,
    },
    /// A layout computation failed (block or layer out of range, overflow).
    #[error(transparent)]
    Layout(#[from] LayoutError),
    /// A peer description could not be built.
    #[error(transparent)]
    Peer(#[from] PeerError),
    /// A registration used with an agent other than the one that made it.
    #[error("agent {agent} cannot use a registration of agent {owner}")]
    ForeignRegistration {
        /// The agent asked to use it.
        agent: String,
        /// The agent that registered it.
        owner: String,
    },
    /// File I/O around a registration failed.
    #[error("file I/O: {0}")]
    Io(#[from] std::io::Error),
}

impl NixlError {
    fn call(op: &'static str) -> impl FnOnce(nixl_sys::NixlError) -> Self {
        move |source| NixlError::Call { op, source }
    }
}
