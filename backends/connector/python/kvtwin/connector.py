"""kvtwin as vLLM's KV cache tier: the ``KVConnectorBase_V1`` vLLM loads.

Start vLLM with::

    --kv-transfer-config '{"kv_connector": "KvtwinConnector",
      "kv_connector_module_path": "kvtwin.connector", "kv_role": "kv_both",
      "kv_load_failure_policy": "recompute",
      "kv_connector_extra_config": {"host_bytes": 1073741824,
                                    "disk_bytes": 4294967296, "disk_dir": "/var/tmp/kvtwin"}}'

The disk tier outlives the engine (``"disk_persistent": false`` turns that off): its
file and its journal stay in ``disk_dir`` (one engine per directory), and the next
engine started on it finds the prefixes they hold.

A shared store below both tiers (``"shared_store": "redis://[:TOKEN@]HOST:PORT"``, a
``kvtwin store`` that many engines use; ``"shared_namespace"``, by default the model
and block size, so only engines that can read each other's blocks share them): every
block saved is also written there, and a prompt whose prefix continues there past what
this engine's own tiers hold loads it from there, so a prefix one engine computed is
loaded by another.

Two halves in two processes, as vLLM runs them:

- The scheduler side (engine core) keeps a mirror of which blocks the store holds,
  named by kvtwin's sequence hashes of the prompt's full blocks (the router's and
  Dynamo's scheme). It answers how many prompt tokens beyond the engine's own prefix
  hit the store holds (a leading run, leaving the last prompt token to compute), plans
  their loads into the blocks vLLM allocated, and plans saves of every prompt block
  that becomes full in a step. Loads are synchronous: vLLM runs them before the step's
  forward pass.
- The worker side owns the store (``kvtwin._native.Store``: host memory written
  through to disk, BLAKE3 per block) and the engine's KV tensors as a layout; it runs
  the loads before the forward pass and the saves after it, reports blocks whose load
  failed (vLLM recomputes them) and sends the store's changes (blocks newly held, blocks
  evicted) back to the scheduler side's mirror through the worker metadata.
- After a restart on a persistent disk tier, the scheduler side's mirror starts from
  the tier's journal, before the worker's store has said what it kept; the worker's
  first metadata then replaces the mirror with the store's own account.
- With a shared store, the scheduler side asks it (``kvtwin._native.Shared``, one
  KVTWIN.PREFIX a request) how far the prompt's prefix continues there past the
  mirror's run; the worker loads those blocks from it after the local ones
  (``Store.load_shared``, each checked with BLAKE3) and writes what it saves
  (``Store.put_shared``: each block with its parent and tokens, which the saves'
  metadata carries, so the store's KV events can name it to routers). A store that
  cannot be reached counts as holding nothing;
  a shared load that fails is reported like a local one (vLLM recomputes).
- KV events for the store's tiers: the worker sends what its tiers did (blocks stored
  in or removed from host memory and disk) with the same metadata, and the scheduler
  side turns it into vLLM's ``BlockStored`` / ``BlockRemoved`` with medium ``CPU`` or
  ``DISK``, named by vLLM's own block hashes (remembered from the request whose save it
  planned, with the block's tokens and parent), which vLLM publishes in the engine's
  own KV event batches (``take_events``): a router that follows the engine sees its
  offloaded blocks beside its GPU ones, by tier. A block the scheduler side cannot name
  (one kept across a restart, before a request shows its tokens again) is not
  announced, and its removal not either.

Never: decide what vLLM schedules, or hold a block's bytes on the scheduler side.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable

from vllm.distributed.kv_events import BlockRemoved, BlockStored, KVCacheEvent
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorWorkerMetadata,
)
from vllm.logger import init_logger
from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash, resolve_block_hashes

from kvtwin._native import Shared, Store, block_identities, journaled_blocks
from kvtwin.metrics import (
    KvtwinConnectorStats,
    KvtwinPromMetrics,
    KvtwinStepCounter,
    scheduler_stats,
)

if TYPE_CHECKING:
    import torch
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

# Under vLLM's logger, so its handlers (and VLLM_LOGGING_LEVEL) apply.
logger = init_logger(f"vllm.{__name__}")

# A save's block: (engine block id, position, sequence hash, local hash, parent hash,
# tokens). The tokens travel only with a shared store (its KV events name each block's
# tokens, so routers hash them); empty otherwise.
SaveBlock = tuple[int, int, int, int, "int | None", list[int]]
# What one of the store's tiers did: (stored, medium, sequence hashes); medium None with
# nothing stored is every tier emptied.
TierEvent = tuple[bool, "str | None", list[int]]

# Events waiting for vLLM's next batch, at most: past it the oldest go (counted).
PENDING_EVENTS_BOUND = 65_536
# Blocks the scheduler side can name in events, at most (their vLLM hash, parent and
# tokens; dropped when the store lets the block go, so only a store larger than this
# loses names, counted).
NAMES_BOUND = 1 << 20


@dataclass
class KvtwinMetadata(KVConnectorMetadata):
    """What the worker does this step: loads before the forward pass, saves after."""

    # Per request: [(engine block id, sequence hash)], a chain, parent first.
    loads: list[tuple[str, list[tuple[int, int]]]] = field(default_factory=list)
    # Per request: the chain's continuation in the shared store, loaded after `loads`.
    shared_loads: list[tuple[str, list[tuple[int, int]]]] = field(default_factory=list)
    # Chains of prompt blocks that became full this step.
    saves: list[list[SaveBlock]] = field(default_factory=list)


@dataclass
class KvtwinWorkerMetadata(KVConnectorWorkerMetadata):
    """The store's changes since the last step, for the scheduler side's mirror."""

    held: list[int] = field(default_factory=list)
    gone: list[int] = field(default_factory=list)
    # The store's first word: `held` is all it holds, the mirror starts over from it.
    reset: bool = False
    # What its tiers did, oldest first, for the engine's KV events.
    events: list[TierEvent] = field(default_factory=list)

    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVConnectorWorkerMetadata:
        assert isinstance(other, KvtwinWorkerMetadata)
        return KvtwinWorkerMetadata(
            self.held + other.held,
            self.gone + other.gone,
            self.reset or other.reset,
            self.events + other.events,
        )


@dataclass
class BlockName:
    """How vLLM's events name a block the store may hold: as the engine's own do."""

    block_hash: Any  # vLLM's ExternalBlockHash (bytes, or an int)
    parent: Any  # its parent's, None for a prompt's first block
    tokens: list[int]
    lora_id: int | None
    lora_name: str | None


@dataclass
class _Tracked:
    """A request the scheduler side follows until it finishes."""

    identities: list[tuple[int, int]]  # (sequence, local) of the prompt's full blocks
    request: "Request"  # vLLM's, for its block hashes and tokens
    block_ids: list[int] = field(default_factory=list)
    saved_upto: int = 0  # prompt blocks planned for saving so far


class KvtwinConnector(KVConnectorBase_V1):
    """kvtwin's tiers behind vLLM's KV connector API; see the module documentation."""

    def __init__(
        self,
        vllm_config: "VllmConfig",
        role: KVConnectorRole,
        kv_cache_config: "KVCacheConfig | None" = None,
    ):
        super().__init__(
            vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config
        )
        self._block_size = vllm_config.cache_config.block_size
        extra = self._kv_transfer_config
        self._host_bytes = int(extra.get_from_extra_config("host_bytes", 1 << 30))
        self._disk_bytes = int(extra.get_from_extra_config("disk_bytes", 0))
        self._disk_dir = extra.get_from_extra_config("disk_dir", None)
        self._disk_persistent = bool(extra.get_from_extra_config("disk_persistent", True))
        if self._disk_bytes > 0 and not self._disk_dir:
            raise ValueError(
                "kvtwin connector: kv_connector_extra_config has disk_bytes but no disk_dir"
            )
        self._shared_url = extra.get_from_extra_config("shared_store", None)
        self._shared_namespace = str(
            extra.get_from_extra_config(
                "shared_namespace",
                f"kvtwin:{vllm_config.model_config.model}:{self._block_size}",
            )
        )
        # Scheduler side: the shared store's answers (None without one).
        self._shared: Shared | None = None
        if role == KVConnectorRole.SCHEDULER and self._shared_url:
            self._shared = Shared(self._shared_url, self._shared_namespace)
            logger.info(
                "kvtwin connector: shared store %s, blocks under %s",
                self._shared.url(),
                self._shared_namespace,
            )
        self._shared_errors = 0
        self._shared_hits: dict[str, tuple[int, int]] = {}
        self._shared_loads: dict[str, list[tuple[int, int]]] = {}
        # Scheduler side.
        self._mirror: set[int] = set()
        if role == KVConnectorRole.SCHEDULER and self._persistent_disk():
            self._mirror.update(journaled_blocks(self._disk_dir))
            logger.info(
                "kvtwin connector: the disk tier's journal in %s names %d blocks",
                self._disk_dir,
                len(self._mirror),
            )
        self._tracked: dict[str, _Tracked] = {}
        # Events: what names each block the store may hold (sequence hash -> vLLM's
        # block hash, its parent's, its tokens), which of them each medium was told of,
        # and the events vLLM has not taken yet.
        self._names: dict[int, BlockName] = {}
        self._announced: dict[str, set[int]] = {"CPU": set(), "DISK": set()}
        self._pending: deque[KVCacheEvent] = deque(maxlen=PENDING_EVENTS_BOUND)
        self._unnamed_blocks = 0
        self._dropped_events = 0
        self._local_hits: dict[str, int] = {}
        self._loads: dict[str, list[tuple[int, int]]] = {}
        # Worker side.
        self._store: Store | None = None
        self._first_meta_sent = False
        self._kv_caches: dict[str, "torch.Tensor"] = {}
        self._load_errors: set[int] = set()
        self._counter: KvtwinStepCounter | None = None

    def _persistent_disk(self) -> bool:
        return self._disk_persistent and self._disk_bytes > 0 and bool(self._disk_dir)

    # ------------------------------------------------------------------ scheduler side

    def _identities(self, request: "Request") -> list[tuple[int, int]]:
        tracked = self._tracked.get(request.request_id)
        if tracked is not None:
            return tracked.identities
        lora = request.lora_request.lora_name if request.lora_request else None
        identities = block_identities(
            list(request.prompt_token_ids or []),
            self._block_size,
            lora,
            request.cache_salt,
        )
        self._tracked[request.request_id] = _Tracked(identities, request)
        return identities

    def get_num_new_matched_tokens(
        self, request: "Request", num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        identities = self._identities(request)
        prompt = len(request.prompt_token_ids or [])
        # The last prompt token is always computed: it samples the first output.
        usable = max(prompt - 1, 0) // self._block_size
        run = 0
        for sequence, _ in identities[:usable]:
            if sequence not in self._mirror:
                break
            run += 1
        # Asked again each time vLLM asks (a request it could not schedule comes back).
        start = max(run, num_computed_tokens // self._block_size)
        shared = self._shared_prefix(identities, start, usable)
        if shared:
            self._shared_hits[request.request_id] = (run, shared)
            run = start + shared
        else:
            self._shared_hits.pop(request.request_id, None)
        external = run * self._block_size - num_computed_tokens
        if external <= 0:
            return 0, False
        self._local_hits[request.request_id] = num_computed_tokens
        return external, False

    def _shared_prefix(self, identities: list[tuple[int, int]], start: int, usable: int) -> int:
        """Blocks of the prompt from `start` on that the shared store holds in a run."""
        if self._shared is None or start >= usable:
            return 0
        try:
            return self._shared.prefix([sequence for sequence, _ in identities[start:usable]])
        except RuntimeError as error:
            # Unreachable or refusing: it holds nothing this time; said once in a while.
            if self._shared_errors % 100 == 0:
                logger.warning("kvtwin connector: %s (counted as holding nothing)", error)
            self._shared_errors += 1
            return 0

    def update_state_after_alloc(
        self, request: "Request", blocks: "KVCacheBlocks", num_external_tokens: int
    ) -> None:
        shared_hit = self._shared_hits.pop(request.request_id, None)
        if num_external_tokens <= 0:
            return
        local = self._local_hits.pop(request.request_id, 0)
        first = local // self._block_size
        count = num_external_tokens // self._block_size
        block_ids = blocks.get_block_ids()[0]
        identities = self._identities(request)
        chain = [(block_ids[first + i], identities[first + i][0]) for i in range(count)]
        # The mirror's run comes from this engine's tiers; what follows, from the shared
        # store.
        mine = count if shared_hit is None else min(max(shared_hit[0] - first, 0), count)
        if mine:
            self._loads[request.request_id] = chain[:mine]
        if mine < count:
            self._shared_loads[request.request_id] = chain[mine:]

    def build_connector_meta(
        self, scheduler_output: "SchedulerOutput"
    ) -> KVConnectorMetadata:
        meta = KvtwinMetadata(
            loads=list(self._loads.items()), shared_loads=list(self._shared_loads.items())
        )
        self._loads.clear()
        self._shared_loads.clear()
        scheduled = scheduler_output.num_scheduled_tokens
        for new in scheduler_output.scheduled_new_reqs:
            tracked = self._tracked.get(new.req_id)
            if tracked is None:
                continue
            tracked.block_ids = list(new.block_ids[0])
            self._plan_saves(meta, tracked, new.num_computed_tokens + scheduled.get(new.req_id, 0))
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            tracked = self._tracked.get(req_id)
            if tracked is None:
                continue
            new_ids = cached.new_block_ids[i]
            if req_id in cached.resumed_req_ids:
                # Preempted and back: its blocks were freed and allocated anew.
                tracked.block_ids = list(new_ids[0]) if new_ids else []
            elif new_ids:
                tracked.block_ids.extend(new_ids[0])
            # vLLM went back (a load that failed is computed again): the blocks from
            # there are saved once computed, not with what the failed load left.
            tracked.saved_upto = min(
                tracked.saved_upto, cached.num_computed_tokens[i] // self._block_size
            )
            computed = cached.num_computed_tokens[i] + scheduled.get(req_id, 0)
            self._plan_saves(meta, tracked, computed)
        return meta

    def _plan_saves(self, meta: KvtwinMetadata, tracked: _Tracked, computed: int) -> None:
        """Saves the prompt blocks that are full once this step's tokens are computed."""
        full = min(computed // self._block_size, len(tracked.identities), len(tracked.block_ids))
        if full <= tracked.saved_upto:
            return
        chain: list[SaveBlock] = []
        request = tracked.request
        prompt = request.prompt_token_ids or []
        for position in range(tracked.saved_upto, full):
            sequence, local = tracked.identities[position]
            parent = tracked.identities[position - 1][0] if position > 0 else None
            start = position * self._block_size
            tokens = list(prompt[start : start + self._block_size]) if self._shared_url else []
            chain.append(
                (tracked.block_ids[position], position, sequence, local, parent, tokens)
            )
            self._name(request, position, sequence)
        tracked.saved_upto = full
        meta.saves.append(chain)

    def _name(self, request: "Request", position: int, sequence: int) -> None:
        """Remembers how vLLM names the prompt block at `position`, for its events."""
        if sequence in self._names:
            return
        # vLLM's hashes of this block size: its cache hashes at `hash_block_size`,
        # which is the block size here but may be finer.
        hash_block_size = self._vllm_config.cache_config.hash_block_size or self._block_size
        hashes = resolve_block_hashes(request.block_hashes, hash_block_size, self._block_size)
        if position >= len(hashes) or len(self._names) >= NAMES_BOUND:
            self._unnamed_blocks += 1
            return
        start = position * self._block_size
        parent = maybe_convert_block_hash(hashes[position - 1]) if position > 0 else None
        lora = request.lora_request
        self._names[sequence] = BlockName(
            maybe_convert_block_hash(hashes[position]),
            parent,
            list(request.prompt_token_ids[start : start + self._block_size]),
            lora.adapter_id if lora else None,
            lora.name if lora else None,
        )

    def _publish(self, events: list[TierEvent]) -> None:
        """vLLM's events for what the store's tiers did, in order."""
        for stored, medium, hashes in events:
            if medium is None:
                # Every tier emptied: each medium loses what it was told of.
                for name, told in self._announced.items():
                    removed = [self._names[s].block_hash for s in told if s in self._names]
                    if removed:
                        self._queue(BlockRemoved(block_hashes=removed, medium=name))
                    told.clear()
                continue
            told = self._announced.setdefault(medium, set())
            if stored:
                for sequence in hashes:
                    name = self._names.get(sequence)
                    if name is None:
                        self._unnamed_blocks += 1
                        continue
                    told.add(sequence)
                    self._queue(
                        BlockStored(
                            block_hashes=[name.block_hash],
                            parent_block_hash=name.parent,
                            token_ids=name.tokens,
                            block_size=self._block_size,
                            lora_id=name.lora_id,
                            medium=medium,
                            lora_name=name.lora_name,
                        )
                    )
            else:
                removed = [
                    self._names[s].block_hash for s in hashes if s in told and s in self._names
                ]
                told.difference_update(hashes)
                if removed:
                    self._queue(BlockRemoved(block_hashes=removed, medium=medium))

    def _queue(self, event: KVCacheEvent) -> None:
        if len(self._pending) == PENDING_EVENTS_BOUND:
            self._dropped_events += 1  # the deque lets its oldest go
        self._pending.append(event)

    def update_connector_output(self, connector_output: "KVConnectorOutput") -> None:
        meta = connector_output.kv_connector_worker_meta
        if isinstance(meta, KvtwinWorkerMetadata):
            self._publish(meta.events)
            if meta.reset:
                self._mirror.clear()
            self._mirror.update(meta.held)
            self._mirror.difference_update(meta.gone)
            # A block no tier holds needs no name any more.
            for sequence in meta.gone:
                self._names.pop(sequence, None)

    def take_events(self) -> Iterable[KVCacheEvent]:
        events = list(self._pending)
        self._pending.clear()
        return events

    def request_finished(
        self, request: "Request", block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        self._tracked.pop(request.request_id, None)
        self._local_hits.pop(request.request_id, None)
        self._loads.pop(request.request_id, None)
        self._shared_hits.pop(request.request_id, None)
        self._shared_loads.pop(request.request_id, None)
        return False, None

    # --------------------------------------------------------------------- worker side

    def register_kv_caches(self, kv_caches: dict[str, "torch.Tensor"]) -> None:
        tensors = list(kv_caches.values())
        if not tensors:
            raise ValueError("kvtwin connector: the engine registered no KV cache")
        num_blocks = tensors[0].shape[0]
        for name, tensor in kv_caches.items():
            if not tensor.is_contiguous() or tensor.shape[0] != num_blocks:
                raise ValueError(
                    f"kvtwin connector: layer {name}'s KV cache {tuple(tensor.shape)} is not "
                    f"{num_blocks} contiguous blocks (vLLM's CPU layout, ../shared/ENGINES.md)"
                )
        page_bytes = tensors[0][0].numel() * tensors[0].element_size()
        block_bytes = page_bytes * len(tensors)
        memory_blocks = max(self._host_bytes // block_bytes, 1)
        disk_blocks = self._disk_bytes // block_bytes
        self._store = Store(
            block_bytes,
            self._block_size,
            memory_blocks,
            disk_blocks,
            self._disk_dir if disk_blocks else None,
            self._disk_persistent,
        )
        self._store.register_layout([t.data_ptr() for t in tensors], num_blocks, page_bytes)
        if self._shared_url:
            self._store.attach_shared(self._shared_url, self._shared_namespace)
        self._counter = KvtwinStepCounter(block_bytes, self._block_size)
        # The store copies to and from these addresses: keep the tensors alive with it.
        self._kv_caches = dict(kv_caches)
        logger.info(
            "kvtwin connector: %d layers, blocks of %d bytes; %d in host memory, %d on disk",
            len(tensors),
            block_bytes,
            memory_blocks,
            disk_blocks,
        )
        stats = self._store.stats()
        if self._persistent_disk():
            logger.info(
                "kvtwin connector: the disk tier in %s kept %d blocks of the last engine's "
                "(%d left out: their prefix was gone)",
                self._disk_dir,
                stats["adopted_blocks"],
                stats["orphaned_blocks"],
            )

    def start_load_kv(self, forward_context: "ForwardContext", **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, KvtwinMetadata)
        if self._store is None:
            return
        cut: set[str] = set()
        for req_id, blocks in meta.loads:
            before, started = self._store.stats(), time.perf_counter()
            loaded, error = self._store.load(blocks)
            if self._counter is not None:
                self._counter.loaded(before, self._store.stats(), time.perf_counter() - started)
            if error is not None:
                cut.add(req_id)
                self._failed_load(req_id, blocks, loaded, error)
        for req_id, blocks in meta.shared_loads:
            if req_id in cut:
                # The chain broke before these: vLLM computes from there.
                self._load_errors.update(block for block, _ in blocks)
                continue
            loaded, error = self._store.load_shared(blocks)
            if error is not None:
                self._failed_load(req_id, blocks, loaded, f"shared store: {error}")

    def _failed_load(
        self, req_id: str, blocks: list[tuple[int, int]], loaded: int, error: str
    ) -> None:
        self._load_errors.update(block for block, _ in blocks[loaded:])
        logger.warning(
            "kvtwin connector: request %s loaded %d of %d blocks: %s",
            req_id,
            loaded,
            len(blocks),
            error,
        )

    def wait_for_layer_load(self, layer_name: str) -> None:
        # Loads are whole blocks, all layers, before the forward pass.
        return

    def save_kv_layer(
        self, layer_name: str, kv_layer: "torch.Tensor", attn_metadata: Any, **kwargs: Any
    ) -> None:
        # Saves are whole blocks, all layers, after the forward pass (wait_for_save).
        return

    def wait_for_save(self) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, KvtwinMetadata)
        if self._store is None:
            return
        for chain in meta.saves:
            # A block whose load failed this step holds no KV (vLLM computes it again,
            # and the scheduler side plans its save then): the chain stops before it.
            cut = next(
                (i for i, block in enumerate(chain) if block[0] in self._load_errors),
                len(chain),
            )
            if cut:
                before, started = self._store.stats(), time.perf_counter()
                self._store.save(chain[:cut])
                if self._counter is not None:
                    self._counter.saved(before, self._store.stats(), time.perf_counter() - started)
                if self._shared_url:
                    try:
                        self._store.put_shared(chain[:cut])
                    except RuntimeError as error:
                        logger.warning("kvtwin connector: not written to the shared store: %s", error)

    def get_block_ids_with_load_errors(self) -> set[int]:
        failed, self._load_errors = self._load_errors, set()
        return failed

    def build_connector_worker_meta(self) -> KVConnectorWorkerMetadata | None:
        if self._store is None:
            return None
        held, gone = self._store.take_held_changes()
        events = self._store.take_tier_events()
        reset, self._first_meta_sent = not self._first_meta_sent, True
        if not held and not gone and not reset and not events:
            return None
        return KvtwinWorkerMetadata(held, gone, reset, events)

    def get_kv_connector_stats(self) -> KvtwinConnectorStats | None:
        if self._store is None or self._counter is None:
            # The scheduler side: what its events left out since it last said.
            stats = scheduler_stats(self._unnamed_blocks, self._dropped_events)
            self._unnamed_blocks = self._dropped_events = 0
            return stats
        return self._counter.take(self._store.stats())

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> KvtwinConnectorStats:
        return KvtwinConnectorStats(data=dict(data) if data else {})

    @classmethod
    def build_prom_metrics(
        cls,
        vllm_config: "VllmConfig",
        metric_types: dict[type, type],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> KvtwinPromMetrics:
        return KvtwinPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)
