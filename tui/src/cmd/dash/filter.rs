//! The worker filter language: space-separated terms, all of which must hold.
//!
//! A term is `field OP value` with OP one of `=`, `!=`, `>`, `<`, `>=`, `<=`. Fields:
//! `worker` (`id` or `id:rank`), `rank`, `tier` (`tier=host` scopes `blocks` to that
//! tier; alone it means the tier holds blocks), `blocks`, `device`, `host`, `disk`,
//! `remote` (blocks per tier), `events` (events/s), `age` (seconds since the last
//! event), `gaps`, `ooo`, `reconnects`, `mismatches`, `lost`, `restarts`, `queued`,
//! `running`, `status` (`up`, `stale`, `restarted`, `draining`, `down`, `removed`).
//! Example: `tier=host blocks>1000 gaps>0`.
//!
//! Owns: parsing ([`Filter::parse`], typed [`FilterError`]s naming the term and what was
//! expected) and matching a worker's [`Subject`].
//! Never: panic on any input (a proptest holds it to that), or look at the app's state
//! beyond the figures it is handed.

use super::model::{saturating_sum, WorkerKey, TIER_NAMES};

/// The fields a term may name, for error messages.
const FIELDS: &str = "worker, rank, tier, blocks, device, host, disk, remote, events, age, \
                      gaps, ooo, reconnects, mismatches, lost, restarts, queued, running, status";

/// A worker's status as the filter and the table see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Status {
    /// Publishing, with an event within the stale limit.
    Up,
    /// Up, but no event for longer than the stale limit.
    Stale,
    /// Serving what it has, routed nothing more.
    Draining,
    /// Crashed.
    Down,
    /// Left the cluster.
    Removed,
}

impl Status {
    /// The status's name, as typed in a filter and shown in the table.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Up => "up",
            Self::Stale => "stale",
            Self::Draining => "draining",
            Self::Down => "down",
            Self::Removed => "removed",
        }
    }
}

/// What a filter looks at: one worker's figures at the app's clock.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Subject {
    /// The worker rank.
    pub(crate) key: WorkerKey,
    /// Blocks per tier.
    pub(crate) blocks: [u64; 4],
    /// Events per second, recent.
    pub(crate) events_per_s: f64,
    /// Seconds since its events last grew; `None` if they never did here.
    pub(crate) age_s: Option<f64>,
    /// Event ids skipped.
    pub(crate) gaps: u64,
    /// Events out of order.
    pub(crate) out_of_order: u64,
    /// Stream reconnects.
    pub(crate) reconnects: u64,
    /// Block-size mismatches.
    pub(crate) mismatches: u64,
    /// Batches lost.
    pub(crate) lost: u64,
    /// Publisher restarts.
    pub(crate) restarts: u64,
    /// Requests waiting, where known.
    pub(crate) queued: Option<u64>,
    /// Requests running, where known.
    pub(crate) running: Option<u64>,
    /// Its status.
    pub(crate) status: Option<Status>,
}

/// Why a filter did not parse. Each names the offending term.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum FilterError {
    /// The term has no comparison.
    #[error("`{term}`: expected `field OP value`, OP one of = != > < >= <=")]
    NoOperator {
        /// The term.
        term: String,
    },
    /// The field is not one of [`FIELDS`].
    #[error("`{term}`: unknown field `{field}`; expected one of {FIELDS}")]
    UnknownField {
        /// The term.
        term: String,
        /// What was typed as the field.
        field: String,
    },
    /// Nothing after the operator.
    #[error("`{term}`: expected a value after `{op}`")]
    MissingValue {
        /// The term.
        term: String,
        /// The operator.
        op: &'static str,
    },
    /// A numeric field got something else.
    #[error("`{term}`: expected a number, got `{value}`")]
    NotANumber {
        /// The term.
        term: String,
        /// The value typed.
        value: String,
    },
    /// `worker` got something other than `id` or `id:rank`.
    #[error("`{term}`: expected a worker as `id` or `id:rank`, got `{value}`")]
    NotAWorker {
        /// The term.
        term: String,
        /// The value typed.
        value: String,
    },
    /// `tier` got something other than a tier name.
    #[error("`{term}`: expected a tier (device, host, disk or remote), got `{value}`")]
    NotATier {
        /// The term.
        term: String,
        /// The value typed.
        value: String,
    },
    /// `status` got something other than a status name.
    #[error(
        "`{term}`: expected a status (up, stale, restarted, draining, down or removed), got `{value}`"
    )]
    NotAStatus {
        /// The term.
        term: String,
        /// The value typed.
        value: String,
    },
    /// The field only compares for (in)equality.
    #[error("`{term}`: `{field}` takes only `=` or `!=`")]
    EqualityOnly {
        /// The term.
        term: String,
        /// The field.
        field: &'static str,
    },
    /// `tier` only scopes with `=`.
    #[error("`{term}`: `tier` takes only `=` (it scopes `blocks` to one tier)")]
    TierEqualsOnly {
        /// The term.
        term: String,
    },
    /// Two `tier` terms.
    #[error("`{term}`: only one `tier` term (it scopes `blocks` to one tier)")]
    TierTwice {
        /// The term.
        term: String,
    },
}

/// A comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Eq,
    Ne,
    Gt,
    Lt,
    Ge,
    Le,
}

impl Op {
    /// The operators, longest first so `>=` is not read as `>`.
    const ALL: [(&'static str, Op); 7] = [
        (">=", Op::Ge),
        ("<=", Op::Le),
        ("!=", Op::Ne),
        ("==", Op::Eq),
        ("=", Op::Eq),
        (">", Op::Gt),
        ("<", Op::Lt),
    ];

    fn holds<T: PartialOrd>(self, left: T, right: T) -> bool {
        match self {
            Op::Eq => left == right,
            Op::Ne => left != right,
            Op::Gt => left > right,
            Op::Lt => left < right,
            Op::Ge => left >= right,
            Op::Le => left <= right,
        }
    }
}

/// A numeric field of a worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Number {
    Rank,
    /// `blocks`: the scoped tier's, or all tiers'.
    Blocks,
    Tier(usize),
    Events,
    Age,
    Gaps,
    Ooo,
    Reconnects,
    Mismatches,
    Lost,
    Restarts,
    Queued,
    Running,
}

/// One parsed term.
#[derive(Clone, Debug, PartialEq)]
enum Term {
    /// `worker OP id` or `worker OP id:rank`.
    Worker(Op, u64, Option<u32>),
    /// A numeric comparison.
    Number(Number, Op, f64),
    /// `status = name` or `!=`; `None` is `restarted`.
    Status(Op, Option<Status>),
}

/// A parsed filter: every term must hold.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Filter {
    /// The text it was parsed from, trimmed.
    text: String,
    terms: Vec<Term>,
    /// The tier `blocks` is scoped to.
    tier: Option<usize>,
}

impl Filter {
    /// Parses `text`; an empty text matches everything.
    pub(crate) fn parse(text: &str) -> Result<Self, FilterError> {
        let mut filter = Filter {
            text: text.split_whitespace().collect::<Vec<_>>().join(" "),
            ..Filter::default()
        };
        let mut tier_alone = true;
        for term in text.split_whitespace() {
            let (field, op, value) = split_term(term)?;
            let term_owned = || term.to_owned();
            let number = |value: &str| {
                value
                    .parse::<f64>()
                    .ok()
                    .filter(|v| v.is_finite())
                    .ok_or_else(|| FilterError::NotANumber {
                        term: term_owned(),
                        value: value.to_owned(),
                    })
            };
            let parsed = match field {
                "worker" => {
                    let (id, rank) = match value.split_once(':') {
                        Some((id, rank)) => (id, Some(rank)),
                        None => (value, None),
                    };
                    let bad = || FilterError::NotAWorker {
                        term: term_owned(),
                        value: value.to_owned(),
                    };
                    let id = id.parse::<u64>().map_err(|_| bad())?;
                    let rank = rank
                        .map(|r| r.parse::<u32>().map_err(|_| bad()))
                        .transpose()?;
                    Term::Worker(op, id, rank)
                }
                "tier" => {
                    if op != Op::Eq {
                        return Err(FilterError::TierEqualsOnly { term: term_owned() });
                    }
                    if filter.tier.is_some() {
                        return Err(FilterError::TierTwice { term: term_owned() });
                    }
                    let tier = TIER_NAMES.iter().position(|&t| t == value).ok_or_else(|| {
                        FilterError::NotATier {
                            term: term_owned(),
                            value: value.to_owned(),
                        }
                    })?;
                    filter.tier = Some(tier);
                    continue;
                }
                "status" => {
                    if !matches!(op, Op::Eq | Op::Ne) {
                        return Err(FilterError::EqualityOnly {
                            term: term_owned(),
                            field: "status",
                        });
                    }
                    let status = match value {
                        "up" => Some(Status::Up),
                        "stale" => Some(Status::Stale),
                        "draining" => Some(Status::Draining),
                        "down" => Some(Status::Down),
                        "removed" => Some(Status::Removed),
                        "restarted" => None,
                        _ => {
                            return Err(FilterError::NotAStatus {
                                term: term_owned(),
                                value: value.to_owned(),
                            })
                        }
                    };
                    Term::Status(op, status)
                }
                _ => {
                    let field = match field {
                        "rank" => Number::Rank,
                        "blocks" => {
                            tier_alone = false;
                            Number::Blocks
                        }
                        "events" => Number::Events,
                        "age" => Number::Age,
                        "gaps" => Number::Gaps,
                        "ooo" => Number::Ooo,
                        "reconnects" => Number::Reconnects,
                        "mismatches" => Number::Mismatches,
                        "lost" => Number::Lost,
                        "restarts" => Number::Restarts,
                        "queued" => Number::Queued,
                        "running" => Number::Running,
                        other => match TIER_NAMES.iter().position(|&t| t == other) {
                            Some(tier) => Number::Tier(tier),
                            None => {
                                return Err(FilterError::UnknownField {
                                    term: term_owned(),
                                    field: other.to_owned(),
                                })
                            }
                        },
                    };
                    Term::Number(field, op, number(value)?)
                }
            };
            filter.terms.push(parsed);
        }
        if let (Some(tier), true) = (filter.tier, tier_alone) {
            filter
                .terms
                .push(Term::Number(Number::Tier(tier), Op::Gt, 0.0));
        }
        Ok(filter)
    }

    /// The text it was parsed from (whitespace normalised).
    pub(crate) fn text(&self) -> &str {
        &self.text
    }

    /// Whether it matches everything.
    pub(crate) fn is_empty(&self) -> bool {
        self.terms.is_empty()
    }

    /// The tier `blocks` is scoped to, if any.
    pub(crate) fn tier(&self) -> Option<usize> {
        self.tier
    }

    /// Whether every term holds for `subject`. A figure the source does not know
    /// (`queued` from a router, `age` before any event) fails every comparison.
    pub(crate) fn matches(&self, subject: &Subject) -> bool {
        self.terms.iter().all(|term| match *term {
            Term::Worker(op, id, None) => op.holds(subject.key.worker, id),
            Term::Worker(op, id, Some(rank)) => {
                op.holds((subject.key.worker, subject.key.dp_rank), (id, rank))
            }
            Term::Status(op, wanted) => {
                let is = match wanted {
                    Some(status) => subject.status == Some(status),
                    None => subject.restarts > 0,
                };
                if op == Op::Eq {
                    is
                } else {
                    !is
                }
            }
            Term::Number(field, op, value) => self
                .figure(subject, field)
                .is_some_and(|figure| op.holds(figure, value)),
        })
    }

    fn figure(&self, s: &Subject, field: Number) -> Option<f64> {
        let n = |v: u64| Some(v as f64);
        match field {
            Number::Rank => n(u64::from(s.key.dp_rank)),
            Number::Blocks => match self.tier {
                Some(tier) => n(s.blocks[tier]),
                None => n(saturating_sum(s.blocks)),
            },
            Number::Tier(tier) => n(s.blocks[tier]),
            Number::Events => Some(s.events_per_s),
            Number::Age => s.age_s,
            Number::Gaps => n(s.gaps),
            Number::Ooo => n(s.out_of_order),
            Number::Reconnects => n(s.reconnects),
            Number::Mismatches => n(s.mismatches),
            Number::Lost => n(s.lost),
            Number::Restarts => n(s.restarts),
            Number::Queued => s.queued.map(|v| v as f64),
            Number::Running => s.running.map(|v| v as f64),
        }
    }
}

/// Splits `field OP value` at the first operator character.
fn split_term(term: &str) -> Result<(&str, Op, &str), FilterError> {
    let no_op = || FilterError::NoOperator {
        term: term.to_owned(),
    };
    // The operator characters are ASCII, so this index is a char boundary.
    let at = term.find(['=', '!', '<', '>']).ok_or_else(no_op)?;
    let (field, rest) = term.split_at(at);
    let (symbol, op) = Op::ALL
        .iter()
        .find(|(symbol, _)| rest.starts_with(symbol))
        .ok_or_else(no_op)?;
    let value = &rest[symbol.len()..];
    if field.is_empty() {
        return Err(no_op());
    }
    if value.is_empty() {
        return Err(FilterError::MissingValue {
            term: term.to_owned(),
            op: symbol,
        });
    }
    Ok((field, *op, value))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn subject(worker: u64, rank: u32, blocks: [u64; 4], gaps: u64) -> Subject {
        Subject {
            key: WorkerKey {
                worker,
                dp_rank: rank,
            },
            blocks,
            events_per_s: 12.5,
            age_s: Some(3.0),
            gaps,
            status: Some(Status::Up),
            ..Subject::default()
        }
    }

    #[test]
    fn empty_filter_matches_everything() {
        let f = Filter::parse("   ").unwrap();
        assert!(f.is_empty());
        assert!(f.matches(&subject(1, 0, [0; 4], 0)));
    }

    #[test]
    fn terms_are_anded_and_tier_scopes_blocks() {
        let f = Filter::parse("tier=host blocks>1000 gaps>0").unwrap();
        assert!(f.matches(&subject(1, 0, [0, 1500, 0, 0], 2)));
        assert!(
            !f.matches(&subject(1, 0, [5000, 500, 0, 0], 2)),
            "device blocks do not count"
        );
        assert!(
            !f.matches(&subject(1, 0, [0, 1500, 0, 0], 0)),
            "gaps>0 fails"
        );
        assert_eq!(f.tier(), Some(1));
    }

    #[test]
    fn tier_alone_means_the_tier_holds_blocks() {
        let f = Filter::parse("tier=disk").unwrap();
        assert!(f.matches(&subject(1, 0, [0, 0, 1, 0], 0)));
        assert!(!f.matches(&subject(1, 0, [9, 9, 0, 9], 0)));
    }

    #[test]
    fn worker_matches_id_or_id_and_rank() {
        let any_rank = Filter::parse("worker=3").unwrap();
        assert!(any_rank.matches(&subject(3, 1, [0; 4], 0)));
        let exact = Filter::parse("worker=3:1").unwrap();
        assert!(exact.matches(&subject(3, 1, [0; 4], 0)));
        assert!(!exact.matches(&subject(3, 0, [0; 4], 0)));
        assert!(Filter::parse("worker>=2")
            .unwrap()
            .matches(&subject(3, 0, [0; 4], 0)));
        assert!(Filter::parse("rank!=0")
            .unwrap()
            .matches(&subject(3, 1, [0; 4], 0)));
    }

    #[test]
    fn status_restarted_and_unknown_figures() {
        let mut s = subject(1, 0, [0; 4], 0);
        assert!(Filter::parse("status=up status!=restarted")
            .unwrap()
            .matches(&s));
        s.restarts = 2;
        assert!(Filter::parse("status=restarted").unwrap().matches(&s));
        assert!(
            !Filter::parse("queued>=0").unwrap().matches(&s),
            "queued is unknown"
        );
        assert!(Filter::parse("events>10 age<=3 host=0")
            .unwrap()
            .matches(&s));
    }

    #[test]
    fn errors_name_the_term_and_what_was_expected() {
        let err = |text: &str| Filter::parse(text).unwrap_err();
        assert_eq!(
            err("gaps>0 blocks"),
            FilterError::NoOperator {
                term: "blocks".into()
            }
        );
        assert_eq!(
            err("colour=red"),
            FilterError::UnknownField {
                term: "colour=red".into(),
                field: "colour".into()
            }
        );
        assert_eq!(
            err("gaps>"),
            FilterError::MissingValue {
                term: "gaps>".into(),
                op: ">"
            }
        );
        assert_eq!(
            err("gaps>lots"),
            FilterError::NotANumber {
                term: "gaps>lots".into(),
                value: "lots".into()
            }
        );
        assert!(matches!(err("worker=a:b"), FilterError::NotAWorker { .. }));
        assert!(matches!(err("tier=gpu"), FilterError::NotATier { .. }));
        assert!(matches!(
            err("tier>host"),
            FilterError::TierEqualsOnly { .. }
        ));
        assert!(matches!(
            err("tier=host tier=disk"),
            FilterError::TierTwice { .. }
        ));
        assert!(matches!(err("status>up"), FilterError::EqualityOnly { .. }));
        assert!(matches!(err("status=sad"), FilterError::NotAStatus { .. }));
        assert!(matches!(err("=3"), FilterError::NoOperator { .. }));
        assert!(matches!(err("gaps>nan"), FilterError::NotANumber { .. }));
        let shown = err("gaps>lots").to_string();
        assert_eq!(shown, "`gaps>lots`: expected a number, got `lots`");
    }

    proptest! {
        #[test]
        fn arbitrary_text_never_panics(text in "\\PC{0,40}", ops in "[a-z=!<>:0-9 .]{0,40}") {
            let s = subject(1, 2, [1, 2, 3, 4], 5);
            for t in [text, ops] {
                if let Ok(f) = Filter::parse(&t) {
                    let _ = f.matches(&s);
                }
            }
        }
    }
}
