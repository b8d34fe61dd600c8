//! A NIXL agent: its backends, what it registered, the peers it knows, and transfers.
//!
//! Owns: [`NixlAgent`] (an `nixl-sys` agent created with the backends asked for),
//! [`HostRegistration`] and [`FileRegistration`] (registered memory and files, which own
//! what they register), [`RemotePeer`] (a peer's loaded metadata and checked layout) and
//! [`Transfer`] (a posted request, polled to completion).
//! Transfers address bytes the way `kvtwin::layout` does: absolute addresses for memory,
//! offsets for files; block-level transfers take the (block, layer) addresses from a
//! layout on each side, so a peer's blocks are found through the descriptor it sent.
//! Never: post a transfer whose local ranges lie outside the registration it names, or
//! release one that is still moving bytes without waiting for it first.

use super::memory::{FileRegion, HostBuffer};
use super::peer::NixlPeer;
use super::{NixlError, NixlLibrary};
use kvtwin::layout::{Address, AnyLayout, BlockLayout};
use nixl_sys::{Agent, Backend, MemType, OptArgs, XferDescList, XferOp, XferRequest, XferStatus};
use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A NIXL transfer backend (a plugin of the library).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum NixlBackend {
    /// UCX: memory to memory between agents (on one host, over loopback or shared
    /// memory; set `UCX_NET_DEVICES=lo` to keep it off real NICs).
    Ucx,
    /// POSIX: memory to file and back within one agent.
    Posix,
}

impl NixlBackend {
    /// The plugin's name in the library.
    pub const fn plugin(self) -> &'static str {
        match self {
            NixlBackend::Ucx => "UCX",
            NixlBackend::Posix => "POSIX",
        }
    }
}

/// Which way bytes go, seen from the agent that posts the transfer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransferOp {
    /// From the target (peer memory or file) into local memory.
    Read,
    /// From local memory into the target.
    Write,
}

impl From<TransferOp> for XferOp {
    fn from(op: TransferOp) -> Self {
        match op {
            TransferOp::Read => XferOp::Read,
            TransferOp::Write => XferOp::Write,
        }
    }
}

/// Where a posted transfer stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransferState {
    /// Bytes are still moving.
    InProgress,
    /// Every byte arrived.
    Done,
}

/// A NIXL agent with its backends. Drop it after its transfers and registrations (they
/// borrow or keep it alive).
pub struct NixlAgent {
    agent: Agent,
    name: String,
    backends: BTreeMap<NixlBackend, Backend>,
}

impl fmt::Debug for NixlAgent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NixlAgent")
            .field("name", &self.name)
            .field("backends", &self.backends.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// Host memory registered with an agent; it owns the buffer, so the memory outlives the
/// registration.
#[derive(Debug)]
pub struct HostRegistration {
    // Dropped first: deregisters before the buffer can be freed.
    _handle: nixl_sys::RegistrationHandle,
    buffer: Arc<HostBuffer>,
    agent: String,
}

impl HostRegistration {
    /// The registered buffer.
    pub fn buffer(&self) -> &Arc<HostBuffer> {
        &self.buffer
    }
}

/// A file registered with an agent's POSIX backend; it owns the open file.
#[derive(Debug)]
pub struct FileRegistration {
    // Dropped first: deregisters before the file is closed.
    _handle: nixl_sys::RegistrationHandle,
    file: Arc<FileRegion>,
    agent: String,
}

impl FileRegistration {
    /// The registered file.
    pub fn file(&self) -> &Arc<FileRegion> {
        &self.file
    }
}

/// A peer whose metadata this agent has loaded, with the layout it offers (checked).
#[derive(Clone, Debug)]
pub struct RemotePeer {
    name: String,
    layout: AnyLayout,
}

impl RemotePeer {
    /// The peer agent's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Where its blocks are.
    pub fn layout(&self) -> &AnyLayout {
        &self.layout
    }
}

/// The other side of a transfer, by address ranges.
#[derive(Clone, Copy, Debug)]
pub enum Target<'a> {
    /// Memory registered by the agent of this name, whose metadata this agent loaded;
    /// ranges are its absolute addresses. Moves over UCX.
    Remote {
        /// The peer agent's name.
        agent: &'a str,
    },
    /// A file this agent registered; ranges are offsets. Moves over POSIX.
    File(&'a FileRegistration),
}

/// The other side of a block transfer, with the layout that places its blocks.
#[derive(Clone, Copy, Debug)]
pub enum BlockTarget<'a> {
    /// A connected peer's memory, laid out as its descriptor says.
    Peer(&'a RemotePeer),
    /// A file this agent registered, laid out by `layout` (offsets from 0).
    File {
        /// The registered file.
        file: &'a FileRegistration,
        /// Where its blocks are.
        layout: &'a AnyLayout,
    },
}

impl NixlAgent {
    /// An agent named `name` (unique among the agents that will talk to it) with the
    /// given backends.
    pub fn new(
        library: &NixlLibrary,
        name: &str,
        backends: &[NixlBackend],
    ) -> Result<Self, NixlError> {
        // The library is what makes the calls below safe from the stubs' abort.
        let _loaded = library;
        let agent = Agent::new(name).map_err(NixlError::call("create agent"))?;
        let plugins = agent
            .get_available_plugins()
            .map_err(NixlError::call("list plugins"))?;
        let available: Vec<String> = plugins
            .iter()
            .filter_map(|plugin| plugin.ok().map(str::to_owned))
            .collect();
        let mut created = BTreeMap::new();
        for &backend in backends {
            let plugin = backend.plugin();
            if !available.iter().any(|name| name == plugin) {
                return Err(NixlError::PluginMissing { plugin, available });
            }
            let (_mem_types, params) = agent
                .get_plugin_params(plugin)
                .map_err(NixlError::call("read plugin parameters"))?;
            let handle = agent
                .create_backend(plugin, &params)
                .map_err(NixlError::call("create backend"))?;
            created.insert(backend, handle);
        }
        Ok(Self {
            agent,
            name: name.to_owned(),
            backends: created,
        })
    }

    /// The agent's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether it was created with `backend`.
    pub fn has_backend(&self, backend: NixlBackend) -> bool {
        self.backends.contains_key(&backend)
    }

    /// Registers `buffer` with every backend of this agent that handles host memory.
    /// Register after creating the agent: a backend sees only what was registered with
    /// it.
    pub fn register_host(&self, buffer: Arc<HostBuffer>) -> Result<HostRegistration, NixlError> {
        let handle = self
            .agent
            .register_memory(&*buffer, None)
            .map_err(NixlError::call("register host memory"))?;
        Ok(HostRegistration {
            _handle: handle,
            buffer,
            agent: self.name.clone(),
        })
    }

    /// Registers `file` with the POSIX backend.
    pub fn register_file(&self, file: Arc<FileRegion>) -> Result<FileRegistration, NixlError> {
        let backend = self.backend(NixlBackend::Posix)?;
        let mut args = OptArgs::new().map_err(NixlError::call("create arguments"))?;
        args.add_backend(backend)
            .map_err(NixlError::call("select backend"))?;
        let handle = self
            .agent
            .register_memory(&*file, Some(&args))
            .map_err(NixlError::call("register file"))?;
        Ok(FileRegistration {
            _handle: handle,
            file,
            agent: self.name.clone(),
        })
    }

    /// This agent's metadata (connection info and registered memory), for a peer's
    /// [`NixlAgent::load_remote`]. Take it after registering what the peer should see.
    pub fn metadata(&self) -> Result<Vec<u8>, NixlError> {
        self.agent
            .get_local_md()
            .map_err(NixlError::call("get local metadata"))
    }

    /// Loads a peer's metadata; returns the peer's name.
    pub fn load_remote(&self, metadata: &[u8]) -> Result<String, NixlError> {
        self.agent
            .load_remote_md(metadata)
            .map_err(NixlError::call("load remote metadata"))
    }

    /// This agent's metadata and `layout` (of memory it registered), for a peer's
    /// [`NixlAgent::connect`].
    pub fn describe(&self, layout: &dyn BlockLayout) -> Result<NixlPeer, NixlError> {
        Ok(NixlPeer::new(self.metadata()?, layout.descriptor())?)
    }

    /// Loads what a peer's [`NixlAgent::describe`] sent, after checking its layout.
    pub fn connect(&self, peer: &NixlPeer) -> Result<RemotePeer, NixlError> {
        let layout = peer.layout().clone().into_layout()?;
        let name = self.load_remote(peer.agent_metadata())?;
        Ok(RemotePeer { name, layout })
    }

    /// Forgets a peer's metadata.
    pub fn disconnect(&self, peer: &RemotePeer) -> Result<(), NixlError> {
        self.agent
            .invalidate_remote_md(&peer.name)
            .map_err(NixlError::call("invalidate remote metadata"))
    }

    /// Posts a transfer of `local` ranges (in `local`'s buffer) to or from `target`
    /// ranges, pairwise (same count, same lengths). The transfer borrows the agent and
    /// the registrations, so neither can go while bytes move.
    pub fn transfer<'a>(
        &'a self,
        op: TransferOp,
        local: &'a HostRegistration,
        local_ranges: &[Address],
        target: Target<'a>,
        target_ranges: &[Address],
    ) -> Result<Transfer<'a>, NixlError> {
        if local_ranges.is_empty() {
            return Err(NixlError::EmptyTransfer);
        }
        let paired = local_ranges.len() == target_ranges.len()
            && local_ranges
                .iter()
                .zip(target_ranges)
                .all(|(l, t)| l.len == t.len);
        if !paired {
            return Err(NixlError::RangeMismatch {
                local: local_ranges.len(),
                remote: target_ranges.len(),
            });
        }
        self.check_owner(&local.agent)?;
        for range in local_ranges {
            local.buffer.offset_of(range.addr, range.len)?;
        }
        let (backend, remote_agent, mem_type, device_id) = match target {
            Target::Remote { agent } => (NixlBackend::Ucx, agent, MemType::Dram, 0),
            Target::File(file) => {
                self.check_owner(&file.agent)?;
                for range in target_ranges {
                    file.file.check(range.addr, range.len)?;
                }
                (
                    NixlBackend::Posix,
                    self.name.as_str(),
                    MemType::File,
                    file.file.fd(),
                )
            }
        };
        let mut args = OptArgs::new().map_err(NixlError::call("create arguments"))?;
        args.add_backend(self.backend(backend)?)
            .map_err(NixlError::call("select backend"))?;
        let mut local_list =
            XferDescList::new(MemType::Dram).map_err(NixlError::call("create descriptor list"))?;
        let mut remote_list =
            XferDescList::new(mem_type).map_err(NixlError::call("create descriptor list"))?;
        let mut bytes = 0u64;
        for (l, t) in local_ranges.iter().zip(target_ranges) {
            // Both checked against memory or a file that exists, so they fit in usize.
            local_list.add_desc(l.addr as usize, l.len as usize, 0);
            remote_list.add_desc(t.addr as usize, t.len as usize, device_id);
            bytes = bytes.saturating_add(l.len);
        }
        let request = self
            .agent
            .create_xfer_req(
                op.into(),
                &local_list,
                &remote_list,
                remote_agent,
                Some(&args),
            )
            .map_err(NixlError::call("create transfer request"))?;
        let in_progress = self
            .agent
            .post_xfer_req(&request, None)
            .map_err(|source| NixlError::TransferFailed { bytes, source })?;
        Ok(Transfer {
            agent: &self.agent,
            request,
            bytes,
            finished: !in_progress,
            _memory: PhantomData,
        })
    }

    /// Posts a transfer of whole blocks: local block `local_blocks[i]` (placed by
    /// `local_layout` in `local`'s buffer) to or from block `target_blocks[i]` of the
    /// target, layer by layer. Both layouts must have blocks of the same shape.
    pub fn transfer_blocks<'a>(
        &'a self,
        op: TransferOp,
        local: &'a HostRegistration,
        local_layout: &dyn BlockLayout,
        local_blocks: &[usize],
        target: BlockTarget<'a>,
        target_blocks: &[usize],
    ) -> Result<Transfer<'a>, NixlError> {
        let (target_layout, plain): (&dyn BlockLayout, Target<'a>) = match target {
            BlockTarget::Peer(peer) => (
                &peer.layout,
                Target::Remote {
                    agent: peer.name.as_str(),
                },
            ),
            BlockTarget::File { file, layout } => (layout, Target::File(file)),
        };
        let (l, t) = (local_layout.config(), target_layout.config());
        let (l_bytes, t_bytes) = (l.layer_bytes()?, t.layer_bytes()?);
        if l.num_layers != t.num_layers || l_bytes != t_bytes {
            return Err(NixlError::LayoutMismatch {
                local_layers: l.num_layers,
                local_layer_bytes: l_bytes,
                remote_layers: t.num_layers,
                remote_layer_bytes: t_bytes,
            });
        }
        if local_blocks.len() != target_blocks.len() {
            return Err(NixlError::RangeMismatch {
                local: local_blocks.len(),
                remote: target_blocks.len(),
            });
        }
        let layers = l.num_layers as usize;
        let mut local_ranges = Vec::with_capacity(local_blocks.len() * layers);
        let mut target_ranges = Vec::with_capacity(local_blocks.len() * layers);
        for (&lb, &tb) in local_blocks.iter().zip(target_blocks) {
            for layer in 0..layers {
                local_ranges.push(local_layout.offset(lb, layer)?);
                target_ranges.push(target_layout.offset(tb, layer)?);
            }
        }
        self.transfer(op, local, &local_ranges, plain, &target_ranges)
    }

    fn backend(&self, backend: NixlBackend) -> Result<&Backend, NixlError> {
        self.backends
            .get(&backend)
            .ok_or_else(|| NixlError::NoBackend {
                agent: self.name.clone(),
                backend,
            })
    }

    fn check_owner(&self, owner: &str) -> Result<(), NixlError> {
        if owner == self.name {
            Ok(())
        } else {
            Err(NixlError::ForeignRegistration {
                agent: self.name.clone(),
                owner: owner.to_owned(),
            })
        }
    }
}

/// A posted transfer. Poll it, or wait for it; dropping one that is still in progress
/// waits for it first (up to [`Transfer::DROP_WAIT`]), since its memory must outlive it.
pub struct Transfer<'a> {
    agent: &'a Agent,
    request: XferRequest,
    bytes: u64,
    /// Done or failed: nothing moves any more.
    finished: bool,
    _memory: PhantomData<&'a HostRegistration>,
}

impl fmt::Debug for Transfer<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Transfer")
            .field("bytes", &self.bytes)
            .field("finished", &self.finished)
            .finish()
    }
}

impl Transfer<'_> {
    /// How long a drop waits for a transfer still in progress before releasing it.
    pub const DROP_WAIT: Duration = Duration::from_secs(30);

    /// Bytes it moves.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Asks NIXL where the transfer stands.
    pub fn poll(&mut self) -> Result<TransferState, NixlError> {
        if self.finished {
            return Ok(TransferState::Done);
        }
        match self.agent.get_xfer_status(&self.request) {
            Ok(XferStatus::Success) => {
                self.finished = true;
                Ok(TransferState::Done)
            }
            Ok(XferStatus::InProgress) => Ok(TransferState::InProgress),
            Err(source) => {
                self.finished = true;
                Err(NixlError::TransferFailed {
                    bytes: self.bytes,
                    source,
                })
            }
        }
    }

    /// Polls until the transfer is done, fails, or `timeout` passes (then it is still
    /// in progress and may be waited for again).
    pub fn wait(&mut self, timeout: Duration) -> Result<(), NixlError> {
        let start = Instant::now();
        let mut polls = 0u32;
        loop {
            if self.poll()? == TransferState::Done {
                return Ok(());
            }
            let waited = start.elapsed();
            if waited >= timeout {
                return Err(NixlError::Timeout {
                    bytes: self.bytes,
                    waited,
                });
            }
            // Small transfers finish within microseconds: spin briefly before sleeping.
            polls += 1;
            if polls < 64 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(20));
            }
        }
    }
}

impl Drop for Transfer<'_> {
    fn drop(&mut self) {
        if !self.finished {
            // An error or a timeout here has nowhere to go; the request is released
            // either way (NIXL cancels what it can).
            let _ = self.wait(Self::DROP_WAIT);
        }
    }
}
