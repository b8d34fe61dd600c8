"""The connector's metrics, in vLLM's conventions for a connector's stats.

The worker side counts what each step did (``KvtwinStepCounter``): blocks loaded from
host memory (``cpu``) and from disk (``disk``) and the prompt tokens they gave the
engine, blocks saved, bytes both ways, blocks whose load failed, how long each load
and save call took (a load that read any block from disk counts as a ``disk`` load),
and how many blocks each tier holds. vLLM carries those stats (``KvtwinConnectorStats``,
plain dicts keyed by strings, so they cross its processes) to its API server, sums
them there and

- logs them with its throughput lines ("KV Transfer metrics: ...", ``reduce``),
- exports them on ``/metrics`` (``KvtwinPromMetrics``), named as vLLM names its own
  offloading connector's (``vllm:kv_offload_*``): ``vllm:kvtwin_loaded_blocks_total``,
  ``vllm:kvtwin_external_hit_tokens_total``, ``vllm:kvtwin_load_bytes_total`` and the
  histogram ``vllm:kvtwin_load_seconds``, each by ``tier``;
  ``vllm:kvtwin_saved_blocks_total``, ``vllm:kvtwin_save_bytes_total``,
  ``vllm:kvtwin_save_seconds``; ``vllm:kvtwin_failed_load_blocks_total``; the gauge
  ``vllm:kvtwin_blocks`` by ``tier``, what the store holds; and, from the scheduler
  side, ``vllm:kvtwin_unnamed_blocks_total`` and ``vllm:kvtwin_dropped_events_total``
  (what its KV events left out).

Never: touch the store (the connector reads its counters and passes the differences)
or keep more than ``SAMPLES_BOUND`` timings of one kind between two reports.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
)

TIERS = ("cpu", "disk")
# Timings of one kind kept between two reports, at most (later ones are left out).
SAMPLES_BOUND = 4096
# Seconds: a load or save of a few blocks from memory takes tens of microseconds; one
# from a slow disk, tens of milliseconds.
SECONDS_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
)

# Counters, by "name" or "name|tier".
COUNTERS = {
    "loaded_blocks": ("Blocks the kvtwin connector loaded into the engine, by tier.", True),
    "external_hit_tokens": (
        "Prompt tokens the engine found in the kvtwin connector's tiers, by tier.",
        True,
    ),
    "load_bytes": ("Bytes the kvtwin connector loaded into the engine, by tier.", True),
    "saved_blocks": ("Blocks the kvtwin connector saved from the engine.", False),
    "save_bytes": ("Bytes the kvtwin connector saved from the engine.", False),
    "failed_load_blocks": (
        "Blocks whose load failed (corrupt or gone); the engine computed them again.",
        False,
    ),
    "unnamed_blocks": (
        "Blocks of the store's tier events the connector could not name by vLLM's block "
        "hash (kept across a restart and not seen since): not published.",
        False,
    ),
    "dropped_events": ("KV events the connector dropped, vLLM not taking them.", False),
}
HISTOGRAMS = {
    "load_seconds": ("Seconds a kvtwin load took, by the deepest tier it read.", True),
    "save_seconds": ("Seconds a kvtwin save took (host memory; disk copies follow).", False),
}


def key(name: str, tier: str | None = None) -> str:
    return name if tier is None else f"{name}|{tier}"


@dataclass
class KvtwinConnectorStats(KVConnectorStats):
    """``data``: ``{"counters": {key: n}, "histograms": {key: [seconds]},
    "gauges": {key: n}}``, keys from :func:`key`."""

    def __post_init__(self) -> None:
        for part in ("counters", "histograms", "gauges"):
            self.data.setdefault(part, {})

    def reset(self) -> None:
        self.data = {"counters": {}, "histograms": {}, "gauges": {}}

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        """Counters add up, timings pool, gauges take the later reading."""
        if other.is_empty():
            return self
        counters, histograms = self.data["counters"], self.data["histograms"]
        for name, value in other.data.get("counters", {}).items():
            counters[name] = counters.get(name, 0) + value
        for name, samples in other.data.get("histograms", {}).items():
            pooled = histograms.setdefault(name, [])
            pooled.extend(samples[: max(SAMPLES_BOUND - len(pooled), 0)])
        self.data["gauges"].update(other.data.get("gauges", {}))
        return self

    def reduce(self) -> dict[str, int | float]:
        """The log line's figures: counters, blocks held, mean milliseconds."""
        out: dict[str, int | float] = {}
        for name, value in sorted(self.data["counters"].items()):
            out[name.replace("|", "_")] = value
        for name, value in sorted(self.data["gauges"].items()):
            out[name.replace("|", "_") + "_held"] = value
        for name, samples in sorted(self.data["histograms"].items()):
            if samples:
                mean_ms = sum(samples) / len(samples) * 1e3
                out[name.replace("|", "_").replace("seconds", "ms_mean")] = round(mean_ms, 3)
        return out

    def is_empty(self) -> bool:
        return not (self.data["counters"] or self.data["histograms"] or self.data["gauges"])


class KvtwinStepCounter:
    """What the worker side did since its last report, from the store's own counters."""

    def __init__(self, block_bytes: int, block_size: int) -> None:
        self._block_bytes = block_bytes
        self._block_size = block_size
        self._stats = KvtwinConnectorStats()
        self._reported_gauges: dict[str, int] | None = None

    def _count(self, name: str, value: int, tier: str | None = None) -> None:
        if value:
            counters = self._stats.data["counters"]
            counters[key(name, tier)] = counters.get(key(name, tier), 0) + value

    def _time(self, name: str, seconds: float, tier: str | None = None) -> None:
        samples = self._stats.data["histograms"].setdefault(key(name, tier), [])
        if len(samples) < SAMPLES_BOUND:
            samples.append(seconds)

    def loaded(self, before: dict[str, int], after: dict[str, int], seconds: float) -> None:
        """One load call, between two readings of the store's counters."""
        memory = after["loaded_memory_blocks"] - before["loaded_memory_blocks"]
        disk = after["loaded_disk_blocks"] - before["loaded_disk_blocks"]
        failed = (after["corrupt_blocks"] - before["corrupt_blocks"]) + (
            after["missing_blocks"] - before["missing_blocks"]
        )
        for tier, blocks in (("cpu", memory), ("disk", disk)):
            self._count("loaded_blocks", blocks, tier)
            self._count("external_hit_tokens", blocks * self._block_size, tier)
            self._count("load_bytes", blocks * self._block_bytes, tier)
        self._count("failed_load_blocks", failed)
        if memory or disk:
            self._time("load_seconds", seconds, "disk" if disk else "cpu")

    def saved(self, before: dict[str, int], after: dict[str, int], seconds: float) -> None:
        """One save call, between two readings of the store's counters."""
        blocks = after["saved_blocks"] - before["saved_blocks"]
        self._count("saved_blocks", blocks)
        self._count("save_bytes", blocks * self._block_bytes)
        if blocks:
            self._time("save_seconds", seconds)

    def take(self, stats: dict[str, int]) -> KvtwinConnectorStats | None:
        """The stats since the last call, with what each tier holds now (the store's
        ``stats()``); None when the store did nothing and its tiers did not change."""
        gauges = {
            key("blocks", "cpu"): stats["memory_blocks"],
            key("blocks", "disk"): stats["disk_blocks"],
        }
        taken, self._stats = self._stats, KvtwinConnectorStats()
        quiet = not taken.data["counters"] and not taken.data["histograms"]
        if quiet and gauges == self._reported_gauges:
            return None
        taken.data["gauges"] = gauges
        self._reported_gauges = gauges
        return taken


def scheduler_stats(unnamed_blocks: int, dropped_events: int) -> KvtwinConnectorStats | None:
    """The scheduler side's counts since its last report, or None when both are 0."""
    counters = {
        name: value
        for name, value in (("unnamed_blocks", unnamed_blocks), ("dropped_events", dropped_events))
        if value
    }
    if not counters:
        return None
    return KvtwinConnectorStats(data={"counters": counters})


class KvtwinPromMetrics(KVConnectorPromMetrics):
    """Registers the connector's metrics with vLLM's and records each report."""

    def __init__(
        self,
        vllm_config: Any,
        metric_types: dict[type, type],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        # (engine, key) -> the metric with its labels bound.
        self._bound: dict[tuple[int, str], Any] = {}
        with_tier = labelnames + ["tier"]
        families: list[tuple[str, Any, bool]] = []
        for name, (text, by_tier) in COUNTERS.items():
            family = self._counter_cls(
                name=f"vllm:kvtwin_{name}", documentation=text,
                labelnames=with_tier if by_tier else labelnames,
            )
            families.append((name, family, by_tier))
        for name, (text, by_tier) in HISTOGRAMS.items():
            family = self._histogram_cls(
                name=f"vllm:kvtwin_{name}", documentation=text, buckets=SECONDS_BUCKETS,
                labelnames=with_tier if by_tier else labelnames,
            )
            families.append((name, family, by_tier))
        gauge = self._gauge_cls(
            name="vllm:kvtwin_blocks",
            documentation="Blocks the kvtwin connector holds, by tier.",
            labelnames=with_tier,
            multiprocess_mode="mostrecent",
        )
        families.append(("blocks", gauge, True))
        for engine, values in per_engine_labelvalues.items():
            for name, family, by_tier in families:
                if by_tier:
                    for tier in TIERS:
                        self._bound[(engine, key(name, tier))] = family.labels(*values, tier)
                else:
                    self._bound[(engine, key(name))] = family.labels(*values)

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        for name, value in transfer_stats_data.get("counters", {}).items():
            metric = self._bound.get((engine_idx, name))
            if metric is not None and value > 0:
                metric.inc(value)
        for name, samples in transfer_stats_data.get("histograms", {}).items():
            metric = self._bound.get((engine_idx, name))
            if metric is not None:
                for seconds in samples:
                    metric.observe(seconds)
        for name, value in transfer_stats_data.get("gauges", {}).items():
            metric = self._bound.get((engine_idx, name))
            if metric is not None:
                metric.set(value)
