//! Service-level objectives: upper bounds on a run's latencies, and how far a run is
//! from them.
//!
//! Owns: [`Slo`] (parsed from `ttft_p99_ms=X,tpot_p99_ms=Y`), [`Verdict`] (each bound's
//! value, margin and whether it holds; the binding constraint) and [`SloError`].
//! Never: pick configurations (the search does) or run anything.

use super::summary::{RunSummary, METRICS};

/// Upper bounds on metrics of [`RunSummary::metric`], in the order given.
#[derive(Clone, Debug, PartialEq)]
pub struct Slo {
    /// (metric, bound in milliseconds).
    pub bounds: Vec<(String, f64)>,
}

/// An SLO could not be parsed.
#[derive(Debug, thiserror::Error, PartialEq)]
#[non_exhaustive]
pub enum SloError {
    /// Nothing given.
    #[error("--slo: no bound given; expected METRIC=MS[,METRIC=MS...], metrics: {known}")]
    Empty {
        /// The metrics there are.
        known: String,
    },
    /// Not `METRIC=VALUE`.
    #[error("--slo {item:?}: expected METRIC=MS, e.g. ttft_p99_ms=2000")]
    Syntax {
        /// The item.
        item: String,
    },
    /// A metric there is not.
    #[error("--slo {metric}: no such metric; metrics: {known}")]
    UnknownMetric {
        /// The name given.
        metric: String,
        /// The metrics there are.
        known: String,
    },
    /// A bound that is not a positive number.
    #[error("--slo {metric}={value}: the bound must be a number of milliseconds above 0")]
    BadBound {
        /// The metric.
        metric: String,
        /// The value given.
        value: String,
    },
    /// One metric bounded twice.
    #[error("--slo {metric}: bounded twice")]
    Duplicate {
        /// The metric.
        metric: String,
    },
}

/// One bound, judged on one run.
#[derive(Clone, Debug, PartialEq)]
pub struct Judged {
    /// The metric.
    pub metric: String,
    /// The bound, milliseconds.
    pub bound: f64,
    /// The run's value, milliseconds.
    pub value: f64,
}

impl Judged {
    /// Whether the run meets the bound.
    pub fn holds(&self) -> bool {
        self.value <= self.bound
    }

    /// Room left under the bound as a share of it (negative: over by that share).
    pub fn margin(&self) -> f64 {
        (self.bound - self.value) / self.bound
    }
}

/// Every bound of an SLO, judged on one run.
#[derive(Clone, Debug, PartialEq)]
pub struct Verdict {
    /// Each bound, in the SLO's order.
    pub judged: Vec<Judged>,
    /// Requests the run left unserved (a run that does not serve everything fails).
    pub unserved: u64,
}

impl Verdict {
    /// Whether the run meets every bound and serves every request.
    pub fn holds(&self) -> bool {
        self.unserved == 0 && self.judged.iter().all(Judged::holds)
    }

    /// The bound with the least margin: the binding constraint of a run that meets the
    /// SLO, the worst violation of one that does not (first in the SLO's order on ties).
    pub fn binding(&self) -> &Judged {
        self.judged
            .iter()
            .reduce(|a, b| if b.margin() < a.margin() { b } else { a })
            .expect("an SLO has at least one bound")
    }
}

impl Slo {
    /// Parses `METRIC=MS[,METRIC=MS...]`.
    pub fn parse(text: &str) -> Result<Self, SloError> {
        let known = || METRICS.join(", ");
        let mut bounds: Vec<(String, f64)> = Vec::new();
        for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (metric, value) = item.split_once('=').ok_or_else(|| SloError::Syntax {
                item: item.to_string(),
            })?;
            let metric = metric.trim();
            if !METRICS.contains(&metric) {
                return Err(SloError::UnknownMetric {
                    metric: metric.to_string(),
                    known: known(),
                });
            }
            let bound: f64 = value
                .trim()
                .parse()
                .ok()
                .filter(|b: &f64| b.is_finite() && *b > 0.0)
                .ok_or_else(|| SloError::BadBound {
                    metric: metric.to_string(),
                    value: value.to_string(),
                })?;
            if bounds.iter().any(|(m, _)| m == metric) {
                return Err(SloError::Duplicate {
                    metric: metric.to_string(),
                });
            }
            bounds.push((metric.to_string(), bound));
        }
        if bounds.is_empty() {
            return Err(SloError::Empty { known: known() });
        }
        Ok(Self { bounds })
    }

    /// The SLO judged on `summary`.
    pub fn judge(&self, summary: &RunSummary) -> Verdict {
        Verdict {
            judged: self
                .bounds
                .iter()
                .map(|(metric, bound)| Judged {
                    metric: metric.clone(),
                    bound: *bound,
                    value: summary.metric(metric).unwrap_or(f64::INFINITY),
                })
                .collect(),
            unserved: summary.unserved(),
        }
    }

    /// `ttft_p99_ms ≤ 2000, tpot_p99_ms ≤ 50`.
    pub fn describe(&self) -> String {
        self.bounds
            .iter()
            .map(|(m, b)| format!("{m} ≤ {b}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slos_parse_and_errors_name_the_metric() {
        let slo = Slo::parse("ttft_p99_ms=2000, tpot_p99_ms=50").unwrap();
        assert_eq!(
            slo.bounds,
            vec![("ttft_p99_ms".into(), 2000.0), ("tpot_p99_ms".into(), 50.0)]
        );
        let unknown = Slo::parse("ttft_p99_ms=1,itl_p99_ms=5").unwrap_err();
        assert!(
            matches!(&unknown, SloError::UnknownMetric { metric, .. } if metric == "itl_p99_ms")
        );
        assert!(unknown.to_string().contains("tpot_p99_ms"), "{unknown}");
        assert!(matches!(
            Slo::parse("ttft_p99_ms"),
            Err(SloError::Syntax { .. })
        ));
        assert!(matches!(
            Slo::parse("ttft_p99_ms=-1"),
            Err(SloError::BadBound { .. })
        ));
        assert!(matches!(
            Slo::parse("ttft_p99_ms=soon"),
            Err(SloError::BadBound { .. })
        ));
        assert!(matches!(Slo::parse(" , "), Err(SloError::Empty { .. })));
        assert!(matches!(
            Slo::parse("ttft_p99_ms=1,ttft_p99_ms=2"),
            Err(SloError::Duplicate { .. })
        ));
    }

    #[test]
    fn the_binding_constraint_has_the_least_margin() {
        let verdict = Verdict {
            judged: vec![
                Judged {
                    metric: "a".into(),
                    bound: 100.0,
                    value: 50.0,
                },
                Judged {
                    metric: "b".into(),
                    bound: 10.0,
                    value: 8.0,
                },
            ],
            unserved: 0,
        };
        assert!(verdict.holds());
        assert_eq!(verdict.binding().metric, "b");
        assert!((verdict.binding().margin() - 0.2).abs() < 1e-12);
        let over = Verdict {
            unserved: 1,
            ..verdict
        };
        assert!(!over.holds());
    }
}
