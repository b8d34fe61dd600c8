//! Traffic that changes: request streams time-scaled, looped and joined, and arrivals
//! redrawn from a seeded rate curve (a diurnal cycle, steps, a burst).
//!
//! Owns: [`speedup`], [`concat()`], [`repeat`] (whole streams: order, prompts and output
//! lengths kept, ids renumbered in arrival order), [`RateCurve`] (requests per second
//! over simulated time) and [`retime`] (arrivals drawn from a non-homogeneous Poisson
//! process of a curve by thinning, seeded, so the same seed gives the same arrivals).
//! Never: read files or change what a request asks for: only when it arrives (and, for
//! a looped copy asked to, which prefixes it names).

use crate::workload::Request;
use kvtwin::block::BlockIdentity;
use kvtwin::ids::{LocalBlockHash, RequestId, Timestamp};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

/// Requests per second over simulated time.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub enum RateCurve {
    /// The same rate throughout.
    Constant {
        /// Requests per second.
        per_s: f64,
    },
    /// A sinusoidal day: `mean_per_s × (1 + amplitude × cos(2π (t − peak_at_s) / period_s))`.
    Diurnal {
        /// Mean requests per second.
        mean_per_s: f64,
        /// Swing around the mean, as a share of it (0 ≤ amplitude ≤ 1).
        amplitude: f64,
        /// Length of one cycle, seconds (86,400 for a day).
        period_s: f64,
        /// When the rate peaks, seconds from the start.
        peak_at_s: f64,
    },
    /// A rate that changes at given times: (from second, requests per second), by time.
    Steps(Vec<(f64, f64)>),
    /// A base rate with a burst.
    Burst {
        /// Requests per second outside the burst.
        base_per_s: f64,
        /// Requests per second during it.
        peak_per_s: f64,
        /// When it starts, seconds.
        start_s: f64,
        /// How long it lasts, seconds.
        duration_s: f64,
    },
}

/// A rate curve that cannot describe arrivals.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum CurveError {
    /// A rate, time or share out of its range (names the field).
    #[error("rate curve: {field}: {value} {why}")]
    OutOfRange {
        /// The field.
        field: &'static str,
        /// Its value.
        value: f64,
        /// The range it must be in.
        why: &'static str,
    },
    /// Steps not in time order, or none.
    #[error("rate curve: Steps: {0}")]
    Steps(&'static str),
}

fn check(field: &'static str, value: f64, ok: bool, why: &'static str) -> Result<(), CurveError> {
    if ok && value.is_finite() {
        Ok(())
    } else {
        Err(CurveError::OutOfRange { field, value, why })
    }
}

impl RateCurve {
    /// Whether the curve describes arrivals: rates finite and ≥ 0, times ordered.
    pub fn check(&self) -> Result<(), CurveError> {
        const RATE: &str = "must be a finite rate ≥ 0";
        match self {
            RateCurve::Constant { per_s } => check("per_s", *per_s, *per_s >= 0.0, RATE),
            RateCurve::Diurnal {
                mean_per_s,
                amplitude,
                period_s,
                peak_at_s,
            } => {
                check("mean_per_s", *mean_per_s, *mean_per_s >= 0.0, RATE)?;
                check(
                    "amplitude",
                    *amplitude,
                    (0.0..=1.0).contains(amplitude),
                    "must be within 0..=1",
                )?;
                check("period_s", *period_s, *period_s > 0.0, "must be above 0")?;
                check("peak_at_s", *peak_at_s, true, "must be finite")
            }
            RateCurve::Steps(steps) => {
                if steps.is_empty() {
                    return Err(CurveError::Steps("no steps"));
                }
                if steps.windows(2).any(|w| w[0].0 >= w[1].0) {
                    return Err(CurveError::Steps("times must increase"));
                }
                for (at, rate) in steps {
                    check("steps time", *at, true, "must be finite")?;
                    check("steps rate", *rate, *rate >= 0.0, RATE)?;
                }
                Ok(())
            }
            RateCurve::Burst {
                base_per_s,
                peak_per_s,
                start_s,
                duration_s,
            } => {
                check("base_per_s", *base_per_s, *base_per_s >= 0.0, RATE)?;
                check("peak_per_s", *peak_per_s, *peak_per_s >= 0.0, RATE)?;
                check("start_s", *start_s, *start_s >= 0.0, "must be ≥ 0")?;
                check("duration_s", *duration_s, *duration_s >= 0.0, "must be ≥ 0")
            }
        }
    }

    /// Requests per second at `t_s` seconds.
    pub fn rate_at(&self, t_s: f64) -> f64 {
        match self {
            RateCurve::Constant { per_s } => *per_s,
            RateCurve::Diurnal {
                mean_per_s,
                amplitude,
                period_s,
                peak_at_s,
            } => {
                let phase = std::f64::consts::TAU * (t_s - peak_at_s) / period_s;
                mean_per_s * (1.0 + amplitude * phase.cos())
            }
            RateCurve::Steps(steps) => steps
                .iter()
                .take_while(|(at, _)| *at <= t_s)
                .last()
                .map_or(0.0, |(_, rate)| *rate),
            RateCurve::Burst {
                base_per_s,
                peak_per_s,
                start_s,
                duration_s,
            } => {
                if t_s >= *start_s && t_s < start_s + duration_s {
                    *peak_per_s
                } else {
                    *base_per_s
                }
            }
        }
    }

    /// The highest rate the curve reaches (the thinning envelope).
    pub fn max_rate(&self) -> f64 {
        match self {
            RateCurve::Constant { per_s } => *per_s,
            RateCurve::Diurnal {
                mean_per_s,
                amplitude,
                ..
            } => mean_per_s * (1.0 + amplitude),
            RateCurve::Steps(steps) => steps.iter().map(|(_, r)| *r).fold(0.0, f64::max),
            RateCurve::Burst {
                base_per_s,
                peak_per_s,
                ..
            } => base_per_s.max(*peak_per_s),
        }
    }
}

/// Requests dated by their new arrivals, in the order given (arrivals non-decreasing),
/// renumbered.
fn renumbered(requests: impl Iterator<Item = Request>) -> Vec<Request> {
    requests
        .enumerate()
        .map(|(i, mut request)| {
            request.id = RequestId::new(i as u64);
            request
        })
        .collect()
}

/// `requests` `factor` times as fast (arrivals divided by it; 2: twice the rate).
/// `factor` must be above 0.
pub fn speedup(requests: &[Request], factor: f64) -> Vec<Request> {
    let factor = if factor > 0.0 && factor.is_finite() {
        factor
    } else {
        1.0
    };
    renumbered(requests.iter().cloned().map(|mut r| {
        r.arrival = Timestamp::from_nanos((r.arrival.as_nanos() as f64 / factor) as u64);
        r
    }))
}

/// The streams one after the other: each starts `gap_ns` after the previous one's last
/// arrival, keeping its own spacing (its first request at that start).
pub fn concat(streams: &[&[Request]], gap_ns: u64) -> Vec<Request> {
    let mut out = Vec::new();
    let mut start = 0u64;
    for stream in streams {
        let Some(first) = stream.first().map(|r| r.arrival.as_nanos()) else {
            continue;
        };
        let mut last = start;
        for request in stream.iter() {
            let mut request = request.clone();
            let at = start + request.arrival.as_nanos().saturating_sub(first);
            request.arrival = Timestamp::from_nanos(at);
            last = last.max(at);
            out.push(request);
        }
        start = last.saturating_add(gap_ns);
    }
    renumbered(out.into_iter())
}

/// `requests` `times` times in a row ([`concat()`] with `gap_ns`). With `fresh_prefixes`,
/// copy `k` names its blocks anew (each local hash mixed with `k`), so that no copy hits
/// an earlier copy's cache: the same shape of traffic, from new users.
pub fn repeat(
    requests: &[Request],
    times: usize,
    gap_ns: u64,
    fresh_prefixes: bool,
) -> Vec<Request> {
    let copies: Vec<Vec<Request>> = (0..times)
        .map(|k| {
            if !fresh_prefixes || k == 0 {
                return requests.to_vec();
            }
            requests
                .iter()
                .map(|r| {
                    let locals: Vec<LocalBlockHash> = r
                        .blocks
                        .iter()
                        .map(|b| LocalBlockHash::new(mix(b.local_hash.get(), k as u64)))
                        .collect();
                    Request {
                        blocks: BlockIdentity::chain(&locals),
                        ..r.clone()
                    }
                })
                .collect()
        })
        .collect();
    let streams: Vec<&[Request]> = copies.iter().map(Vec::as_slice).collect();
    concat(&streams, gap_ns)
}

/// A 64-bit mix of a hash and a copy number (SplitMix64's finaliser), so that copies'
/// hashes differ from each other and from the original's.
fn mix(hash: u64, copy: u64) -> u64 {
    let mut z = hash ^ copy.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `requests`, in their order, with arrivals redrawn from `curve`: a non-homogeneous
/// Poisson process by thinning (candidates at the curve's highest rate, each kept with
/// probability rate ÷ highest), seeded by `seed`. Requests after the curve's rate stays
/// 0 for `horizon_s` seconds are dropped (they would never arrive).
pub fn retime(
    requests: &[Request],
    curve: &RateCurve,
    seed: u64,
    horizon_s: f64,
) -> Result<Vec<Request>, CurveError> {
    curve.check()?;
    let envelope = curve.max_rate();
    if envelope <= 0.0 {
        return Ok(Vec::new());
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut t = 0.0f64;
    let mut out = Vec::with_capacity(requests.len());
    for request in requests {
        loop {
            let u: f64 = rng.gen();
            t += -(1.0 - u).ln() / envelope;
            if t > horizon_s {
                return Ok(renumbered(out.into_iter()));
            }
            let keep: f64 = rng.gen();
            if keep * envelope <= curve.rate_at(t) {
                break;
            }
        }
        let mut request = request.clone();
        request.arrival = Timestamp::from_nanos((t * 1e9) as u64);
        out.push(request);
    }
    Ok(renumbered(out.into_iter()))
}

/// How a scenario's requests are reshaped in time before the run (the scenario's
/// `traffic` field): looped, retimed from a rate curve, then sped up, in that order (a
/// curve's times, and its horizon, are before the speed-up).
/// Absent, the requests arrive as the workload has them, and no random number is drawn.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrafficSpec {
    /// Times the workload plays in a row ([`repeat`]); 1: once.
    pub repeat: usize,
    /// Seconds between one copy's last arrival and the next copy's first.
    pub repeat_gap_s: f64,
    /// Whether each copy after the first names its prompt blocks anew (new users with
    /// the same shape of traffic), so no copy hits an earlier copy's cache.
    pub fresh_prefixes: bool,
    /// Arrivals divided by this ([`speedup`]; 2: twice the rate).
    pub speedup: f64,
    /// Arrivals redrawn from this curve ([`retime`]), keeping the requests' order;
    /// requests beyond `horizon_s` are dropped.
    pub rate: Option<RateCurve>,
    /// Seconds of traffic a `rate` curve draws at most.
    pub horizon_s: f64,
}

impl Default for TrafficSpec {
    /// The workload as it is.
    fn default() -> Self {
        Self {
            repeat: 1,
            repeat_gap_s: 0.0,
            fresh_prefixes: false,
            speedup: 1.0,
            rate: None,
            horizon_s: 86_400.0,
        }
    }
}

/// A traffic section that cannot reshape a workload.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum TrafficError {
    /// A field out of its range.
    #[error("traffic.{field}: {value} {why}")]
    OutOfRange {
        /// The field.
        field: &'static str,
        /// Its value.
        value: f64,
        /// The range it must be in.
        why: &'static str,
    },
    /// The rate curve is not a curve.
    #[error("traffic.rate: {0}")]
    Curve(#[from] CurveError),
}

impl TrafficSpec {
    /// What makes this section unusable, if anything.
    pub fn check(&self) -> Result<(), TrafficError> {
        let bad = |field, value: f64, ok: bool, why| {
            if ok && value.is_finite() {
                Ok(())
            } else {
                Err(TrafficError::OutOfRange { field, value, why })
            }
        };
        bad(
            "repeat",
            self.repeat as f64,
            self.repeat >= 1,
            "must be at least 1",
        )?;
        bad(
            "repeat_gap_s",
            self.repeat_gap_s,
            self.repeat_gap_s >= 0.0,
            "must be 0 or more",
        )?;
        bad(
            "speedup",
            self.speedup,
            self.speedup > 0.0,
            "must be above 0",
        )?;
        bad(
            "horizon_s",
            self.horizon_s,
            self.horizon_s > 0.0,
            "must be above 0",
        )?;
        if let Some(curve) = &self.rate {
            curve.check()?;
        }
        Ok(())
    }

    /// `requests` (in arrival order) reshaped: repeated, retimed, then sped up, with the
    /// curve's draws seeded by `seed`.
    pub fn apply(&self, requests: Vec<Request>, seed: u64) -> Result<Vec<Request>, TrafficError> {
        self.check()?;
        let mut requests = requests;
        if self.repeat > 1 {
            let gap_ns = (self.repeat_gap_s * 1e9) as u64;
            requests = repeat(&requests, self.repeat, gap_ns, self.fresh_prefixes);
        }
        if let Some(curve) = &self.rate {
            requests = retime(&requests, curve, seed, self.horizon_s)?;
        }
        if self.speedup != 1.0 {
            requests = speedup(&requests, self.speedup);
        }
        Ok(requests)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(arrivals_ms: &[u64]) -> Vec<Request> {
        arrivals_ms
            .iter()
            .enumerate()
            .map(|(i, ms)| Request {
                id: RequestId::new(i as u64),
                arrival: Timestamp::from_nanos(ms * 1_000_000),
                blocks: BlockIdentity::chain(&[
                    LocalBlockHash::new(1),
                    LocalBlockHash::new(i as u64 + 2),
                ]),
                input_tokens: 32,
                output_tokens: 4,
                think_tokens: 0,
            })
            .collect()
    }

    fn arrivals_ms(requests: &[Request]) -> Vec<u64> {
        requests
            .iter()
            .map(|r| r.arrival.as_nanos() / 1_000_000)
            .collect()
    }

    #[test]
    fn speedup_divides_arrivals_and_keeps_order() {
        let fast = speedup(&stream(&[0, 100, 300]), 2.0);
        assert_eq!(arrivals_ms(&fast), vec![0, 50, 150]);
        assert_eq!(fast[2].id, RequestId::new(2));
        assert_eq!(arrivals_ms(&speedup(&stream(&[10]), f64::NAN)), vec![10]);
    }

    #[test]
    fn concat_and_repeat_lay_streams_end_to_end() {
        let a = stream(&[5, 10]);
        let b = stream(&[100, 150]);
        let joined = concat(&[&a, &b], 20_000_000);
        assert_eq!(arrivals_ms(&joined), vec![0, 5, 25, 75]);
        assert_eq!(
            joined.iter().map(|r| r.id.get()).collect::<Vec<_>>(),
            vec![0, 1, 2, 3]
        );
        let looped = repeat(&a, 3, 0, false);
        assert_eq!(arrivals_ms(&looped), vec![0, 5, 5, 10, 10, 15]);
        assert_eq!(
            looped[2].blocks, a[0].blocks,
            "a plain loop names the same prefixes"
        );
        let fresh = repeat(&a, 2, 0, true);
        assert_eq!(fresh[0].blocks, a[0].blocks);
        assert_ne!(
            fresh[2].blocks[0].sequence_hash,
            a[0].blocks[0].sequence_hash
        );
        // Within a copy, shared prefixes stay shared.
        assert_eq!(fresh[2].blocks[0], fresh[3].blocks[0]);
    }

    #[test]
    fn curves_give_their_rates_and_bad_ones_name_the_field() {
        let day = RateCurve::Diurnal {
            mean_per_s: 10.0,
            amplitude: 0.5,
            period_s: 100.0,
            peak_at_s: 25.0,
        };
        assert!((day.rate_at(25.0) - 15.0).abs() < 1e-9);
        assert!((day.rate_at(75.0) - 5.0).abs() < 1e-9);
        assert_eq!(day.max_rate(), 15.0);
        let steps = RateCurve::Steps(vec![(0.0, 1.0), (10.0, 4.0)]);
        assert_eq!((steps.rate_at(9.9), steps.rate_at(10.0)), (1.0, 4.0));
        let burst = RateCurve::Burst {
            base_per_s: 1.0,
            peak_per_s: 9.0,
            start_s: 5.0,
            duration_s: 2.0,
        };
        assert_eq!(
            (burst.rate_at(4.0), burst.rate_at(6.0), burst.rate_at(7.0)),
            (1.0, 9.0, 1.0)
        );
        let bad = RateCurve::Diurnal {
            mean_per_s: 1.0,
            amplitude: 2.0,
            period_s: 1.0,
            peak_at_s: 0.0,
        };
        assert!(bad.check().unwrap_err().to_string().contains("amplitude"));
        assert!(RateCurve::Steps(vec![(5.0, 1.0), (1.0, 1.0)])
            .check()
            .is_err());
        assert!(RateCurve::Constant { per_s: -1.0 }
            .check()
            .unwrap_err()
            .to_string()
            .contains("per_s"));
    }

    #[test]
    fn retimed_arrivals_follow_the_curve_and_the_seed() {
        let requests = stream(&vec![0; 20_000]);
        let burst = RateCurve::Burst {
            base_per_s: 10.0,
            peak_per_s: 100.0,
            start_s: 100.0,
            duration_s: 50.0,
        };
        let a = retime(&requests, &burst, 7, 1e9).unwrap();
        assert_eq!(a, retime(&requests, &burst, 7, 1e9).unwrap());
        assert_ne!(
            arrivals_ms(&a),
            arrivals_ms(&retime(&requests, &burst, 8, 1e9).unwrap())
        );
        assert!(a.windows(2).all(|w| w[0].arrival <= w[1].arrival));
        let count = |from_s: f64, to_s: f64| {
            a.iter()
                .filter(|r| {
                    let t = r.arrival.as_nanos() as f64 / 1e9;
                    t >= from_s && t < to_s
                })
                .count() as f64
        };
        // 1,000 expected before the burst, 5,000 during it (Poisson: within 10 %).
        assert!(
            (count(0.0, 100.0) - 1000.0).abs() < 100.0,
            "{}",
            count(0.0, 100.0)
        );
        assert!(
            (count(100.0, 150.0) - 5000.0).abs() < 500.0,
            "{}",
            count(100.0, 150.0)
        );
        // A horizon drops what would arrive after it.
        let short = retime(&requests, &burst, 7, 10.0).unwrap();
        assert!(short.len() < 200 && short.iter().all(|r| r.arrival.as_nanos() <= 10_000_000_000));
    }

    #[test]
    fn a_traffic_section_loops_retimes_and_speeds_up_in_that_order() {
        let base = stream(&[0, 100, 200]);
        assert_eq!(TrafficSpec::default().apply(base.clone(), 1).unwrap(), base);
        let looped = TrafficSpec {
            repeat: 2,
            repeat_gap_s: 0.1,
            speedup: 2.0,
            ..TrafficSpec::default()
        };
        let out = looped.apply(base.clone(), 1).unwrap();
        assert_eq!(arrivals_ms(&out), vec![0, 50, 100, 150, 200, 250]);
        let retimed = TrafficSpec {
            rate: Some(RateCurve::Constant { per_s: 10.0 }),
            horizon_s: 1_000.0,
            ..TrafficSpec::default()
        };
        let a = retimed.apply(base.clone(), 7).unwrap();
        assert_eq!(a, retimed.apply(base.clone(), 7).unwrap());
        assert_ne!(arrivals_ms(&a), arrivals_ms(&base));
        // The speed-up applies to the retimed arrivals.
        let faster = TrafficSpec {
            speedup: 2.0,
            ..retimed.clone()
        };
        let halved: Vec<u64> = a.iter().map(|r| r.arrival.as_nanos() / 2).collect();
        let b: Vec<u64> = faster
            .apply(base.clone(), 7)
            .unwrap()
            .iter()
            .map(|r| r.arrival.as_nanos())
            .collect();
        assert!(
            halved.iter().zip(&b).all(|(h, b)| h.abs_diff(*b) <= 1),
            "{halved:?} {b:?}"
        );
        let bad = TrafficSpec {
            speedup: 0.0,
            ..TrafficSpec::default()
        };
        let message = bad.apply(base, 1).unwrap_err().to_string();
        assert!(message.starts_with("traffic.speedup: 0"), "{message}");
    }
}
