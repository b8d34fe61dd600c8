//! A design space for the planner: what may vary, and every point of it.
//!
//! Owns: [`Space`] (a RON file: GPU profiles, routing, prefill workers, the shared tier's
//! size and any field by dotted path, which are tried as they are; workers and device, host and disk blocks
//! per worker, which the search treats as monotone), its check against a scenario
//! ([`Space::points`], errors naming the field), the [`PlanPoint`]s with what each costs
//! ([`Shape`]), and the sweep grid that covers the same points ([`Points::grid`]).
//! Never: run anything or choose among the points.
//!
//! The monotone dimensions are the premise of the search: in the model, more workers or
//! more cache never makes a latency worse. Every other dimension is a category the
//! search covers one by one.

use super::prices::{GpuShape, PriceError, Prices};
use super::run::configure;
use crate::ron_file::{self, RonFileError};
use crate::scenario::{OverrideError, Routing, Scenario};
use crate::shared::HOURS_PER_MONTH;
use kvtwin::tier::Tier;
use serde::Deserialize;
use std::path::Path;

/// What a plan may vary; an empty list keeps the scenario's value.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Space {
    /// Built-in compute profiles (a GPU and a model), e.g. `"h100-llama3-8b"`.
    #[serde(default)]
    pub gpu: Vec<String>,
    /// Workers in the prefill pool; 0 serves aggregated (no disaggregation).
    #[serde(default)]
    pub prefill_workers: Vec<usize>,
    /// How requests pick their worker.
    #[serde(default)]
    pub routing: Vec<Routing>,
    /// Blocks of the cluster's shared tier (`cluster.shared_tier.capacity_blocks`; 0:
    /// none), each priced at the scenario's `shared_tier.usd_per_gb_month`. Tried one by
    /// one: a larger store is not assumed faster (its reads share its links, and the
    /// router's credit moves requests).
    #[serde(default)]
    pub shared_blocks: Vec<u64>,
    /// Any other scenario field by dotted path (as `kvtwin run --set`) and its values
    /// (JSON, or plain strings), not assumed monotone: an eviction policy per tier
    /// (`("worker.tiers.0.eviction", ["Lru", "Priority"])`), the onboard policy, the
    /// scheduler's weights...
    #[serde(default)]
    pub set: Vec<(String, Vec<String>)>,
    /// Workers in the cluster (monotone).
    #[serde(default)]
    pub workers: Vec<usize>,
    /// Device blocks per worker (monotone).
    #[serde(default)]
    pub device_blocks: Vec<usize>,
    /// Host (DRAM) blocks per worker (monotone).
    #[serde(default)]
    pub host_blocks: Vec<usize>,
    /// Disk (SSD) blocks per worker (monotone).
    #[serde(default)]
    pub disk_blocks: Vec<usize>,
}

/// A space that does not fit its scenario.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SpaceError {
    /// Unreadable, malformed, or an unknown field (names file, line, column).
    #[error(transparent)]
    File(#[from] RonFileError),
    /// A value of a field does not apply to the scenario (an unknown path, a value that
    /// does not fit, an unknown GPU profile).
    #[error("{file}: {field}: {source}")]
    Value {
        /// The space file.
        file: String,
        /// The field (`gpu`, `set[0]`, `host_blocks`...).
        field: String,
        /// Why.
        source: Box<OverrideError>,
    },
    /// A field that cannot hold what it was given.
    #[error("{file}: {field}: {reason}")]
    Field {
        /// The space file.
        file: String,
        /// The field.
        field: String,
        /// Why.
        reason: String,
    },
    /// A point's GPU has no price.
    #[error(transparent)]
    Price(#[from] PriceError),
    /// Every point is invalid.
    #[error("{file}: no point of the space is a valid configuration (e.g. {example})")]
    NoValidPoint {
        /// The space file.
        file: String,
        /// One point's reason.
        example: String,
    },
}

/// One dimension of the space: a scenario path and its values.
#[derive(Clone, Debug, PartialEq)]
pub struct Axis {
    /// The space's field it comes from.
    pub field: String,
    /// The scenario path it sets.
    pub path: String,
    /// Its values, as `--set` takes them.
    pub values: Vec<String>,
    /// Its values, short, for tables.
    pub labels: Vec<String>,
}

/// What a point is, in the terms of cost and capacity.
#[derive(Clone, Debug, PartialEq)]
pub struct Shape {
    /// Workers (replicas of the model).
    pub workers: usize,
    /// Of those, the prefill pool (0: aggregated).
    pub prefill_workers: usize,
    /// The GPUs of one worker.
    pub gpu: GpuShape,
    /// Blocks per worker, per tier (index: `Tier::index`).
    pub blocks: [usize; 4],
    /// Bytes of one block.
    pub bytes_per_block: u64,
    /// Blocks of the shared tier, for the whole cluster (0: none).
    pub shared_blocks: u64,
    /// Its price, US dollars per GB-month.
    pub shared_usd_per_gb_month: f64,
}

impl Shape {
    /// GB (10⁹ bytes) per worker in `tier`.
    pub fn gb(&self, tier: Tier) -> f64 {
        self.blocks[tier.index()] as f64 * self.bytes_per_block as f64 / 1e9
    }

    /// GPUs in the cluster.
    pub fn gpus(&self) -> u64 {
        self.workers as u64 * u64::from(self.gpu.count)
    }

    /// GB (10⁹ bytes) of the shared tier.
    pub fn shared_gb(&self) -> f64 {
        self.shared_blocks as f64 * self.bytes_per_block as f64 / 1e9
    }

    /// US dollars per hour at `prices` (`file` names their source in errors): GPUs,
    /// plus host DRAM and SSD by the GB (device memory comes with the GPU), per worker;
    /// plus the shared tier by the GB at its own price, once for the cluster.
    pub fn usd_per_hour(&self, prices: &Prices, file: &str) -> Result<f64, PriceError> {
        let gpu = prices.gpu(&self.gpu.name, file)? * f64::from(self.gpu.count);
        let memory = self.gb(Tier::Host) * prices.dram_usd_per_gb_hour
            + self.gb(Tier::Disk) * prices.ssd_usd_per_gb_hour;
        let shared = self.shared_gb() * self.shared_usd_per_gb_month / HOURS_PER_MONTH;
        Ok(self.workers as f64 * (gpu + memory) + shared)
    }
}

/// One point of the space.
#[derive(Clone, Debug, PartialEq)]
pub struct PlanPoint {
    /// Its combination of the non-monotone dimensions (index into [`Points::categories`]).
    pub category: usize,
    /// Its level on each monotone dimension: workers, device, host, disk blocks (0 on a
    /// dimension the space does not vary).
    pub levels: [usize; 4],
    /// Its overrides, `PATH=VALUE`.
    pub sets: Vec<String>,
    /// What it is, for costs and tables.
    pub shape: Shape,
    /// US dollars per hour.
    pub usd_per_hour: f64,
    /// Why it is not a configuration one could run (the prefill pool takes every worker;
    /// the device blocks do not fit in the GPUs' memory next to the weights); `None`
    /// when it is valid.
    pub invalid: Option<String>,
}

impl PlanPoint {
    /// The order the planner minimises: cost, then fewer workers and blocks, then the
    /// category's order. The exhaustive sweep's optimum is the least of this order too.
    pub fn key(&self) -> (f64, [usize; 4], usize) {
        (self.usd_per_hour, self.levels, self.category)
    }

    /// `self` against `other` in [`PlanPoint::key`] order.
    pub fn key_cmp(&self, other: &PlanPoint) -> std::cmp::Ordering {
        let (a, b) = (self.key(), other.key());
        a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2))
    }

    /// Whether `self` sorts before `other` in [`PlanPoint::key`] order.
    pub fn before(&self, other: &PlanPoint) -> bool {
        self.key_cmp(other).is_lt()
    }

    /// Whether `self` has at most `other`'s workers and blocks on every monotone
    /// dimension, in the same category.
    pub fn below(&self, other: &PlanPoint) -> bool {
        self.category == other.category
            && self.levels.iter().zip(other.levels).all(|(a, b)| *a <= b)
    }
}

/// The points of a space, and its axes.
#[derive(Clone, Debug)]
pub struct Points {
    /// The non-monotone axes (their product is the categories).
    pub category_axes: Vec<Axis>,
    /// The monotone axes the space varies (workers, device, host, disk blocks; absent
    /// ones left out).
    pub monotone_axes: Vec<(usize, Axis)>,
    /// Each category's label (its axes' labels).
    pub categories: Vec<String>,
    /// Levels on each monotone dimension (1 where the space does not vary it).
    pub levels: [usize; 4],
    /// Every point, categories outermost, then workers, device, host, disk blocks.
    pub points: Vec<PlanPoint>,
}

impl Points {
    /// The point of `category` at `levels`.
    pub fn at(&self, category: usize, levels: [usize; 4]) -> &PlanPoint {
        &self.points[self.index(category, levels)]
    }

    /// The index in [`Points::points`] of the point of `category` at `levels`.
    pub fn index(&self, category: usize, levels: [usize; 4]) -> usize {
        let [w, d, h, k] = levels;
        let [nw, nd, nh, nk] = self.levels;
        (((category * nw + w) * nd + d) * nh + h) * nk + k
    }

    /// Every axis as `kvtwin sweep --grid PATH=V1,V2,...` arguments, categories first,
    /// so an exhaustive sweep covers exactly these points.
    pub fn grid(&self) -> Vec<String> {
        self.category_axes
            .iter()
            .chain(self.monotone_axes.iter().map(|(_, axis)| axis))
            .map(|axis| format!("{}={}", axis.path, axis.values.join(",")))
            .collect()
    }
}

/// The monotone dimensions, in the order of [`PlanPoint::levels`].
const MONOTONE: [(&str, Option<Tier>); 4] = [
    ("workers", None),
    ("device_blocks", Some(Tier::Device)),
    ("host_blocks", Some(Tier::Host)),
    ("disk_blocks", Some(Tier::Disk)),
];

impl Space {
    /// The space of a RON file.
    pub fn load(path: &Path) -> Result<Self, SpaceError> {
        Ok(ron_file::load(path)?)
    }

    /// Every point of the space around `base`, each checked, with its cost at `prices`.
    /// `file` names the space in errors, `prices_file` the prices.
    pub fn points(
        &self,
        base: &Scenario,
        prices: &Prices,
        file: &str,
        prices_file: &str,
    ) -> Result<Points, SpaceError> {
        let field_error = |field: &str, reason: String| SpaceError::Field {
            file: file.to_string(),
            field: field.to_string(),
            reason,
        };
        let mut category_axes = Vec::new();
        if let Some(error) = self
            .gpu
            .iter()
            .find_map(|g| crate::compute::ComputeModel::builtin(g).err())
        {
            return Err(field_error("gpu", error.to_string()));
        }
        if !self.gpu.is_empty() {
            category_axes.push(Axis {
                field: "gpu".into(),
                path: "hardware.compute".into(),
                values: self
                    .gpu
                    .iter()
                    .map(|g| format!("{{\"Builtin\":{}}}", serde_json::Value::from(g.as_str())))
                    .collect(),
                labels: self.gpu.clone(),
            });
        }
        if !self.prefill_workers.is_empty() {
            let values = self
                .prefill_workers
                .iter()
                .map(|&n| match (n, base.cluster.disaggregation) {
                    (0, _) => "null".to_string(),
                    (n, Some(d)) => serde_json::json!({
                        "prefill_workers": n,
                        "frame_blocks": d.frame_blocks,
                        "switch_bytes_per_s": d.switch_bytes_per_s,
                        "switch_latency_ns": d.switch_latency_ns,
                    })
                    .to_string(),
                    (n, None) => serde_json::json!({ "prefill_workers": n }).to_string(),
                })
                .collect();
            category_axes.push(Axis {
                field: "prefill_workers".into(),
                path: "cluster.disaggregation".into(),
                values,
                labels: self
                    .prefill_workers
                    .iter()
                    .map(|n| format!("{n}P"))
                    .collect(),
            });
        }
        if !self.shared_blocks.is_empty() {
            let mut sizes = self.shared_blocks.clone();
            sizes.sort_unstable();
            sizes.dedup();
            category_axes.push(Axis {
                field: "shared_blocks".into(),
                path: "cluster.shared_tier.capacity_blocks".into(),
                values: sizes.iter().map(u64::to_string).collect(),
                labels: sizes
                    .iter()
                    .map(|n| match n {
                        0 => "no shared tier".to_string(),
                        n => format!("shared {n}"),
                    })
                    .collect(),
            });
        }
        if !self.routing.is_empty() {
            let names: Vec<String> = self.routing.iter().map(|r| format!("{r:?}")).collect();
            category_axes.push(Axis {
                field: "routing".into(),
                path: "cluster.routing".into(),
                values: names.clone(),
                labels: names,
            });
        }
        for (i, (path, values)) in self.set.iter().enumerate() {
            let field = format!("set[{i}]");
            if values.is_empty() {
                return Err(field_error(&field, format!("{path}: no values")));
            }
            category_axes.push(Axis {
                field,
                path: path.clone(),
                values: values.clone(),
                labels: values.iter().map(|v| format!("{path}={v}")).collect(),
            });
        }
        let mut monotone_axes = Vec::new();
        let given = [
            &self.workers,
            &self.device_blocks,
            &self.host_blocks,
            &self.disk_blocks,
        ];
        for (dim, ((field, tier), values)) in MONOTONE.iter().zip(given).enumerate() {
            if values.is_empty() {
                continue;
            }
            if values.contains(&0) {
                return Err(field_error(
                    field,
                    "0 is not a size: every value must be at least 1".into(),
                ));
            }
            let mut sorted = values.clone();
            sorted.sort_unstable();
            sorted.dedup();
            let path = match tier {
                None => "cluster.workers".to_string(),
                Some(tier) => {
                    let index = base
                        .worker
                        .tiers
                        .iter()
                        .position(|t| t.tier == *tier)
                        .ok_or_else(|| {
                            field_error(
                                field,
                                format!(
                                    "the scenario's worker has no {tier:?} tier to size (add it to \
                                     worker.tiers first)"
                                ),
                            )
                        })?;
                    format!("worker.tiers.{index}.capacity_blocks")
                }
            };
            monotone_axes.push((
                dim,
                Axis {
                    field: field.to_string(),
                    path,
                    values: sorted.iter().map(usize::to_string).collect(),
                    labels: sorted.iter().map(usize::to_string).collect(),
                },
            ));
        }
        // Each value alone must apply to the scenario, so that an error names its field.
        for axis in category_axes
            .iter()
            .chain(monotone_axes.iter().map(|(_, a)| a))
        {
            for value in &axis.values {
                match configure(base, &[format!("{}={value}", axis.path)], base.seed) {
                    // A value may need another axis's (prefill workers need workers):
                    // points that stay unrunnable are marked invalid one by one.
                    Ok(_) | Err(OverrideError::Invalid(_)) => {}
                    Err(source) => {
                        return Err(SpaceError::Value {
                            file: file.to_string(),
                            field: axis.field.clone(),
                            source: Box::new(source),
                        })
                    }
                }
            }
        }
        enumerate(
            base,
            prices,
            prices_file,
            file,
            category_axes,
            monotone_axes,
        )
    }
}

/// Every combination of the axes, checked and priced.
fn enumerate(
    base: &Scenario,
    prices: &Prices,
    prices_file: &str,
    file: &str,
    category_axes: Vec<Axis>,
    monotone_axes: Vec<(usize, Axis)>,
) -> Result<Points, SpaceError> {
    let mut levels = [1usize; 4];
    for (dim, axis) in &monotone_axes {
        levels[*dim] = axis.values.len();
    }
    let category_sizes: Vec<usize> = category_axes.iter().map(|a| a.values.len()).collect();
    let category_count: usize = category_sizes.iter().product();
    let mut categories = Vec::with_capacity(category_count);
    let mut points = Vec::new();
    for category in 0..category_count {
        // Mixed radix, the first axis slowest (as the sweep's grid order has it).
        let mut picks = vec![0; category_axes.len()];
        let mut rest = category;
        for (i, size) in category_sizes.iter().enumerate().rev() {
            picks[i] = rest % size;
            rest /= size;
        }
        let mut label = Vec::new();
        let mut category_sets = Vec::new();
        for (axis, &pick) in category_axes.iter().zip(&picks) {
            // A dimension of one value tells the categories nothing apart.
            if axis.values.len() > 1 {
                label.push(axis.labels[pick].clone());
            }
            category_sets.push(format!("{}={}", axis.path, axis.values[pick]));
        }
        categories.push(if label.is_empty() {
            base.name.clone()
        } else {
            label.join(" ")
        });
        for w in 0..levels[0] {
            for d in 0..levels[1] {
                for h in 0..levels[2] {
                    for k in 0..levels[3] {
                        let at = [w, d, h, k];
                        let mut sets = category_sets.clone();
                        for (dim, axis) in &monotone_axes {
                            sets.push(format!("{}={}", axis.path, axis.values[at[*dim]]));
                        }
                        points.push(point(base, prices, prices_file, category, at, sets)?);
                    }
                }
            }
        }
    }
    if let Some(example) = points.iter().find_map(|p| p.invalid.clone()) {
        if points.iter().all(|p| p.invalid.is_some()) {
            return Err(SpaceError::NoValidPoint {
                file: file.to_string(),
                example,
            });
        }
    }
    Ok(Points {
        category_axes,
        monotone_axes,
        categories,
        levels,
        points,
    })
}

/// One point: its scenario checked, its shape and price.
fn point(
    base: &Scenario,
    prices: &Prices,
    prices_file: &str,
    category: usize,
    levels: [usize; 4],
    sets: Vec<String>,
) -> Result<PlanPoint, SpaceError> {
    let configured = configure(base, &sets, base.seed);
    let scenario = configured.as_ref().unwrap_or(base);
    let model = scenario
        .hardware
        .compute_model()
        .unwrap_or(crate::compute::ComputeModel::Dynosim);
    let mut blocks = [0; 4];
    for tier in &scenario.worker.tiers {
        blocks[tier.tier.index()] = tier.capacity_blocks;
    }
    let shape = Shape {
        workers: scenario.cluster.workers,
        prefill_workers: scenario
            .cluster
            .disaggregation
            .map_or(0, |d| d.prefill_workers),
        gpu: GpuShape::of(&model, &prices.default_gpu),
        blocks,
        bytes_per_block: scenario.worker.bytes_per_block,
        shared_blocks: scenario.cluster.shared_tier.capacity_blocks,
        shared_usd_per_gb_month: scenario.cluster.shared_tier.usd_per_gb_month,
    };
    let usd_per_hour = shape.usd_per_hour(prices, prices_file)?;
    let device_bytes = blocks[Tier::Device.index()] as u64 * shape.bytes_per_block;
    let invalid = match (&configured, shape.gpu.kv_bytes()) {
        (Err(error), _) => Some(error.to_string()),
        (Ok(_), Some(room)) if device_bytes > room => Some(format!(
            "{} device blocks ({:.1} GB) do not fit in {} × {} next to the weights ({:.1} GB for KV)",
            blocks[Tier::Device.index()],
            device_bytes as f64 / 1e9,
            shape.gpu.count,
            shape.gpu.name,
            room as f64 / 1e9
        )),
        _ => None,
    };
    Ok(PlanPoint {
        category,
        levels,
        sets,
        shape,
        usd_per_hour,
        invalid,
    })
}
