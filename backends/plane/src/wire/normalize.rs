//! One engine's decoded batches, normalised the way Dynamo's router normalises them
//! before indexing: events of KV cache groups the index does not keep are left out
//! (counted by reason), and every stored block's tokens hash is seeded with the request's
//! LoRA adapter and cache salt (the salt inherited along a chain) and extended with its
//! multimodal and uninterpreted extra keys.
//!
//! Owns: [`EngineNormalizer`] (per engine stream: the learned kind of each `(rank,
//! group_idx)`, and a [`SaltTracker`]), [`GroupReason`] and [`NormalizerStats`].
//! Groups, as Dynamo's `ZmqEventNormalizer::filter_reason` decides (ai-dynamo/dynamo
//! `lib/kv-router/src/zmq_wire/mod.rs`, the version with `propagate_cache_namespace`):
//! an event naming its `kv_cache_spec_kind` is kept when that is a main attention kind
//! (`full_attention`, `mla_attention`, `sink_full_attention`), left out otherwise
//! (`non_main_attention_kind`, or `unknown_kind` for a kind nobody knows); an event
//! naming only its `group_idx` is judged by the kind a `BlockStored` of that rank and
//! group announced before (`non_main_attention_group`), and when none did, kept for group
//! 0 and left out for the others (`unlearned_group_idx`). Hybrid models (sliding window,
//! Mamba) publish one event stream per group; only the full-attention group's blocks are
//! a prefix cache a router can score.
//! Bounded: at most [`GROUP_KINDS_MAX`] learned groups (a group past it stays unlearned)
//! and the tracker's capacity.
//! Never: decode bytes (`super::engine`), number events (callers hand in ids), or hash a
//! block differently from Dynamo where Dynamo interprets its keys.

use super::convert::{check_fits, stored_blocks_seeded};
use super::engine::{BlockRemoved, BlockStored, EngineBatch, EngineEvent};
use super::extra_keys::salt_of;
use super::salts::SaltTracker;
use super::WireError;
use kvtwin::ids::LocalBlockHash;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Learned `(rank, group_idx)` kinds kept at most.
pub const GROUP_KINDS_MAX: usize = 1024;

/// Why an event of a KV cache group was left out (Dynamo's `ZmqEventFilterReason`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum GroupReason {
    /// Its `kv_cache_spec_kind` is not a main attention kind.
    NonMainAttentionKind,
    /// Its `kv_cache_spec_kind` is one nobody knows.
    UnknownKind,
    /// Its `group_idx` was announced with a kind that is not main attention.
    NonMainAttentionGroup,
    /// A `group_idx` other than 0 whose kind was never announced.
    UnlearnedGroupIdx,
}

impl GroupReason {
    /// Every reason, in label order of the counters.
    pub const ALL: [GroupReason; 4] = [
        GroupReason::NonMainAttentionKind,
        GroupReason::UnknownKind,
        GroupReason::NonMainAttentionGroup,
        GroupReason::UnlearnedGroupIdx,
    ];

    /// The stable label (drop counters, metrics).
    pub const fn reason(self) -> &'static str {
        match self {
            GroupReason::NonMainAttentionKind => "non_main_attention_kind",
            GroupReason::UnknownKind => "unknown_kind",
            GroupReason::NonMainAttentionGroup => "non_main_attention_group",
            GroupReason::UnlearnedGroupIdx => "unlearned_group_idx",
        }
    }

    /// Whether `reason` is one of these labels.
    pub fn is_group_reason(reason: &str) -> bool {
        Self::ALL.iter().any(|r| r.reason() == reason)
    }
}

/// What a cache kind is to a router.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum KindClass {
    Main,
    Other,
    Unknown,
}

fn classify(kind: &str) -> KindClass {
    match kind {
        "full_attention" | "mla_attention" | "sink_full_attention" => KindClass::Main,
        "sliding_window"
        | "sliding_window_mla"
        | "mamba"
        | "chunked_local_attention"
        | "encoder_only_attention"
        | "cross_attention" => KindClass::Other,
        _ => KindClass::Unknown,
    }
}

/// What a normaliser kept track of.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NormalizerStats {
    /// Salted blocks tracked now.
    pub salted_blocks: u64,
    /// Tracker entries evicted past its capacity, over its life.
    pub salt_evictions: u64,
}

/// An event kept, with its stored blocks hashed.
#[derive(Debug)]
pub(crate) enum Normalized<'a> {
    Stored {
        stored: &'a BlockStored,
        blocks: Vec<(u64, LocalBlockHash)>,
    },
    Removed(&'a BlockRemoved),
    Cleared,
}

/// One engine stream's normaliser; see the module documentation.
#[derive(Clone, Debug, Default)]
pub struct EngineNormalizer {
    kinds: BTreeMap<(u32, u32), KindClass>,
    salts: SaltTracker,
}

impl EngineNormalizer {
    /// A normaliser whose tracker keeps at most `salted_blocks_max` salted blocks.
    pub fn new(salted_blocks_max: usize) -> Self {
        Self {
            kinds: BTreeMap::new(),
            salts: SaltTracker::new(salted_blocks_max),
        }
    }

    /// The engine restarted: what it announced before no longer holds.
    pub fn restarted(&mut self) {
        self.kinds.clear();
        self.salts.clear();
    }

    /// Its counts.
    pub fn stats(&self) -> NormalizerStats {
        NormalizerStats {
            salted_blocks: self.salts.len() as u64,
            salt_evictions: self.salts.evicted(),
        }
    }

    fn learn(&mut self, rank: u32, group: Option<u32>, kind: Option<&str>) {
        let (Some(group), Some(kind)) = (group, kind) else {
            return;
        };
        if self.kinds.len() < GROUP_KINDS_MAX || self.kinds.contains_key(&(rank, group)) {
            self.kinds.insert((rank, group), classify(kind));
        }
    }

    fn verdict(&self, rank: u32, group: Option<u32>, kind: Option<&str>) -> Option<GroupReason> {
        if let Some(kind) = kind {
            return match classify(kind) {
                KindClass::Main => None,
                KindClass::Other => Some(GroupReason::NonMainAttentionKind),
                KindClass::Unknown => Some(GroupReason::UnknownKind),
            };
        }
        let group = group?;
        match self.kinds.get(&(rank, group)) {
            Some(KindClass::Main) => None,
            Some(KindClass::Other) => Some(GroupReason::NonMainAttentionGroup),
            Some(KindClass::Unknown) => Some(GroupReason::UnknownKind),
            None if group == 0 => None,
            None => Some(GroupReason::UnlearnedGroupIdx),
        }
    }

    /// The events of `batch` to index, stored blocks hashed; events left out push their
    /// reason onto `filtered`. All or nothing: a stored event whose tokens do not fill
    /// its blocks refuses the batch before anything is learned or tracked.
    pub(crate) fn normalize<'a>(
        &mut self,
        batch: &'a EngineBatch,
        filtered: &mut Vec<&'static str>,
    ) -> Result<Vec<Normalized<'a>>, WireError> {
        for event in &batch.events {
            if let EngineEvent::BlockStored(stored) = event {
                check_fits(stored)?;
            }
        }
        let rank = batch.dp_rank.unwrap_or(0);
        let mut out = Vec::with_capacity(batch.events.len());
        for event in &batch.events {
            match event {
                EngineEvent::BlockStored(stored) => {
                    let kind = stored.kv_cache_spec_kind.as_deref();
                    self.learn(rank, stored.group_idx, kind);
                    if let Some(reason) = self.verdict(rank, stored.group_idx, kind) {
                        filtered.push(reason.reason());
                        continue;
                    }
                    let blocks = self.stored(rank, stored)?;
                    out.push(Normalized::Stored { stored, blocks });
                }
                EngineEvent::BlockRemoved(removed) => {
                    let kind = removed.kv_cache_spec_kind.as_deref();
                    if let Some(reason) = self.verdict(rank, removed.group_idx, kind) {
                        filtered.push(reason.reason());
                        continue;
                    }
                    self.salts.remove(rank, &removed.block_hashes);
                    out.push(Normalized::Removed(removed));
                }
                EngineEvent::AllBlocksCleared => {
                    self.salts.clear_rank(rank);
                    out.push(Normalized::Cleared);
                }
            }
        }
        Ok(out)
    }

    /// A stored event's blocks, hashed under its own salt or its parent's, and the
    /// tracker told.
    fn stored(
        &mut self,
        rank: u32,
        stored: &BlockStored,
    ) -> Result<Vec<(u64, LocalBlockHash)>, WireError> {
        let own: Option<&str> = stored
            .cache_salt
            .as_deref()
            .filter(|salt| !salt.is_empty())
            .or_else(|| {
                // vLLM sends the salt with the block that starts the request only.
                if stored.parent_block_hash.is_some() {
                    return None;
                }
                let first = stored.extra_keys.as_ref()?.first()?.as_ref()?;
                salt_of(first, stored.lora_name.as_deref())
            });
        let salt: Option<Arc<str>> = match own {
            Some(salt) => Some(Arc::from(salt)),
            None => stored
                .parent_block_hash
                .and_then(|parent| self.salts.salt_of(rank, parent).cloned()),
        };
        let blocks: Vec<(u64, LocalBlockHash)> =
            stored_blocks_seeded(stored, salt.as_deref())?.collect();
        match &salt {
            Some(salt) => self.salts.insert(rank, &stored.block_hashes, salt),
            None => self.salts.remove(rank, &stored.block_hashes),
        }
        Ok(blocks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::extra_keys::ExtraKey;
    use crate::wire::{WorkerEvent, WorkerEventData};
    use kvtwin::ids::WorkerId;
    use kvtwin::tokens::{compute_local_hash, HashSeed};

    fn stored(hashes: &[u64], parent: Option<u64>, tokens: std::ops::Range<u32>) -> BlockStored {
        BlockStored {
            block_hashes: hashes.to_vec(),
            parent_block_hash: parent,
            token_ids: tokens.collect(),
            block_size: 4,
            ..BlockStored::default()
        }
    }

    fn run(
        normalizer: &mut EngineNormalizer,
        events: Vec<EngineEvent>,
    ) -> (Vec<WorkerEvent>, Vec<&'static str>) {
        let batch = EngineBatch::new(0, 0.0, events, Some(0));
        let (mut out, mut filtered) = (Vec::new(), Vec::new());
        normalizer
            .worker_events(&batch, WorkerId::new(1), &mut out, &mut filtered)
            .unwrap();
        (out, filtered)
    }

    fn locals(event: &WorkerEvent) -> Vec<u64> {
        match &event.data {
            WorkerEventData::Stored { blocks, .. } => blocks.iter().map(|b| b.1.get()).collect(),
            _ => Vec::new(),
        }
    }

    #[test]
    fn a_salt_in_the_first_block_seeds_the_whole_chain_across_batches() {
        let salted = HashSeed::for_request(None, Some("tenant-a"));
        let mut normalizer = EngineNormalizer::default();
        let first = BlockStored {
            extra_keys: Some(vec![Some(vec![ExtraKey::Str("tenant-a".into())])]),
            ..stored(&[1], None, 0..4)
        };
        let (out, _) = run(&mut normalizer, vec![EngineEvent::BlockStored(first)]);
        let expected: Vec<u32> = (0..4).collect();
        assert_eq!(
            locals(&out[0]),
            [compute_local_hash(&expected, salted).get()]
        );
        // The continuation carries no salt: it is inherited from its parent.
        let (out, _) = run(
            &mut normalizer,
            vec![EngineEvent::BlockStored(stored(&[2], Some(1), 4..8))],
        );
        let expected: Vec<u32> = (4..8).collect();
        assert_eq!(
            locals(&out[0]),
            [compute_local_hash(&expected, salted).get()]
        );
        assert_eq!(normalizer.stats().salted_blocks, 2);
        // Removed blocks and a cleared cache are forgotten.
        let removed = BlockRemoved {
            block_hashes: vec![2],
            ..BlockRemoved::default()
        };
        run(&mut normalizer, vec![EngineEvent::BlockRemoved(removed)]);
        assert_eq!(normalizer.stats().salted_blocks, 1);
        run(&mut normalizer, vec![EngineEvent::AllBlocksCleared]);
        assert_eq!(normalizer.stats().salted_blocks, 0);
        let (out, _) = run(
            &mut normalizer,
            vec![EngineEvent::BlockStored(stored(&[3], Some(1), 4..8))],
        );
        let plain: Vec<u32> = (4..8).collect();
        assert_eq!(
            locals(&out[0]),
            [compute_local_hash(&plain, HashSeed::default()).get()]
        );
    }

    #[test]
    fn kv_cache_groups_are_kept_or_left_out_as_dynamo_decides() {
        let mut normalizer = EngineNormalizer::default();
        let group = |group: Option<u32>, kind: Option<&str>| {
            EngineEvent::BlockStored(BlockStored {
                group_idx: group,
                kv_cache_spec_kind: kind.map(str::to_string),
                ..stored(&[7], None, 0..4)
            })
        };
        let (out, filtered) = run(
            &mut normalizer,
            vec![
                group(Some(0), Some("full_attention")),
                group(Some(1), Some("sliding_window")),
                group(Some(2), Some("brand_new_kind")),
                // Learned above: group 1 is sliding window.
                group(Some(1), None),
                group(Some(3), None),
                group(Some(0), None),
                group(None, None),
            ],
        );
        assert_eq!(out.len(), 3);
        assert_eq!(
            filtered,
            [
                "non_main_attention_kind",
                "unknown_kind",
                "non_main_attention_group",
                "unlearned_group_idx"
            ]
        );
        let removed = BlockRemoved {
            block_hashes: vec![7],
            group_idx: Some(1),
            ..BlockRemoved::default()
        };
        let (out, filtered) = run(&mut normalizer, vec![EngineEvent::BlockRemoved(removed)]);
        assert!(out.is_empty());
        assert_eq!(filtered, ["non_main_attention_group"]);
        assert!(GroupReason::is_group_reason("unlearned_group_idx"));
        // A restart forgets what was learned.
        normalizer.restarted();
        let (_, filtered) = run(&mut normalizer, vec![group(Some(1), None)]);
        assert_eq!(filtered, ["unlearned_group_idx"]);
    }
}
