//! The per-key order checker: pure functions over "published" and "seen".

use std::collections::{BTreeMap, HashMap};
use std::fmt;

/// Counts for one key, in an [`OrderReport`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KeyCounts {
    /// Events published for the key.
    pub published: usize,
    /// Handler runs seen for the key (re-runs included).
    pub handled: usize,
    /// Handler runs that repeated an event already handled.
    pub reruns: usize,
}

/// What [`check_order`] counted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OrderReport {
    /// Counts per key (every key published or seen).
    pub keys: BTreeMap<String, KeyCounts>,
    /// Re-runs over all keys.
    pub total_reruns: usize,
}

/// One way in which what the handlers saw breaks per-key ordering.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum OrderProblem {
    /// The same event id was published twice for one key, so its position
    /// is ambiguous (a bug in the test).
    DuplicatePublished {
        /// The key.
        key: String,
        /// The repeated event id.
        id: String,
    },
    /// Handlers saw event ids that were never published for the key.
    Unknown {
        /// The key.
        key: String,
        /// The ids, in the order they were seen.
        ids: Vec<String>,
    },
    /// Published events that no handler saw.
    Lost {
        /// The key.
        key: String,
        /// The ids, in publication order.
        ids: Vec<String>,
    },
    /// An event was handled while an event published before it had never
    /// been handled yet.
    HandledEarly {
        /// The key.
        key: String,
        /// The event that was handled too early.
        handled: String,
        /// The earlier event it overtook.
        pending: String,
        /// Position of `handled` in the key's seen list.
        position: usize,
    },
    /// A redelivered run (re-running events from `replay_from`) did not
    /// continue in publication order: `got` came where `expected` was due.
    ReplayGap {
        /// The key.
        key: String,
        /// The first event of the replay.
        replay_from: String,
        /// The event that had to be re-run next.
        expected: String,
        /// The event that was handled instead.
        got: String,
        /// Position of `got` in the key's seen list.
        position: usize,
    },
    /// The seen list ends inside a redelivered run: the later events were
    /// not re-run after the earlier ones were.
    ReplayIncomplete {
        /// The key.
        key: String,
        /// The first event of the replay.
        replay_from: String,
        /// Events that were due to be re-run but were not.
        missing: Vec<String>,
    },
    /// More re-runs over all keys than allowed.
    TooManyReruns {
        /// Re-runs counted.
        total: usize,
        /// The allowed maximum.
        max: usize,
    },
}

impl fmt::Display for OrderProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::DuplicatePublished { key, id } => write!(
                f,
                "key `{key}`: event `{id}` was published more than once; give each published event a unique id"
            ),
            Self::Unknown { key, ids } => write!(
                f,
                "key `{key}`: handlers saw events never published for this key: {}",
                list(ids)
            ),
            Self::Lost { key, ids } => write!(
                f,
                "key `{key}`: published events never handled (lost): {}",
                list(ids)
            ),
            Self::HandledEarly {
                key,
                handled,
                pending,
                position,
            } => write!(
                f,
                "key `{key}`: event `{handled}` was handled (run #{}) before event `{pending}`, which was published earlier and had not been handled yet",
                position + 1
            ),
            Self::ReplayGap {
                key,
                replay_from,
                expected,
                got,
                position,
            } => write!(
                f,
                "key `{key}`: a redelivery re-ran events from `{replay_from}`, then handled `{got}` (run #{}) instead of re-running `{expected}` next; a redelivery must repeat the events in publication order until it catches up",
                position + 1
            ),
            Self::ReplayIncomplete {
                key,
                replay_from,
                missing,
            } => write!(
                f,
                "key `{key}`: a redelivery re-ran events from `{replay_from}` but never re-ran the later {} after it, so they last ran before an earlier event",
                list(missing)
            ),
            Self::TooManyReruns { total, max } => write!(
                f,
                "{total} re-runs in total, more than the {max} allowed; events were redelivered more often than the faults in this test explain"
            ),
        }
    }
}

fn list(ids: &[String]) -> String {
    let quoted: Vec<String> = ids.iter().map(|id| format!("`{id}`")).collect();
    quoted.join(", ")
}

/// The order check failed; [`Display`](fmt::Display) explains every problem,
/// one per line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrderViolation {
    /// Every problem found (at most one ordering problem per key: later
    /// ones usually follow from the first).
    pub problems: Vec<OrderProblem>,
    /// The counts, as far as they could be made.
    pub report: OrderReport,
    /// The `max_reruns` given to [`check_order`].
    pub max_reruns: usize,
}

impl fmt::Display for OrderViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "per-key order check failed with {} problem(s):",
            self.problems.len()
        )?;
        for problem in &self.problems {
            writeln!(f, "  - {problem}")?;
        }
        write!(
            f,
            "expected: every published event handled, each key's events in publication order; at-least-once redelivery may only re-run a key's events again in order (at most {} re-runs in total)",
            self.max_reruns
        )
    }
}

impl std::error::Error for OrderViolation {}

/// Checks that handlers saw each key's events in publication order.
///
/// `published` maps each key to its event ids in publication order;
/// `seen` maps each key to the event ids its handlers ran, in the order
/// they ran (for example [`Recorder::seen_all`](super::Recorder::seen_all)).
///
/// For each key the seen ids are mapped to their publication index, and:
///
/// - an id never published for that key is a problem;
/// - a published id never seen is a problem (a loss);
/// - handling an event while an earlier one was never handled (the index
///   jumps past "highest so far + 1") is a problem;
/// - going back to an index already handled is a re-run (at-least-once
///   redelivery). A re-run must replay a suffix in order: after dropping
///   back to `j` the next ones must be `j+1`, `j+2`, … until the highest
///   index handled so far (a further drop back starts a new replay);
/// - more than `max_reruns` re-runs over all keys is a problem.
///
/// Every problem is returned, with at most one ordering problem per key.
pub fn check_order(
    published: &BTreeMap<String, Vec<String>>,
    seen: &BTreeMap<String, Vec<String>>,
    max_reruns: usize,
) -> Result<OrderReport, OrderViolation> {
    let empty = Vec::new();
    let mut report = OrderReport::default();
    let mut problems = Vec::new();
    let mut keys: Vec<&String> = published.keys().chain(seen.keys()).collect();
    keys.sort();
    keys.dedup();
    for key in keys {
        let counts = check_key(
            key,
            published.get(key).unwrap_or(&empty),
            seen.get(key).unwrap_or(&empty),
            &mut problems,
        );
        report.total_reruns += counts.reruns;
        report.keys.insert(key.clone(), counts);
    }
    if report.total_reruns > max_reruns {
        problems.push(OrderProblem::TooManyReruns {
            total: report.total_reruns,
            max: max_reruns,
        });
    }
    if problems.is_empty() {
        Ok(report)
    } else {
        Err(OrderViolation {
            problems,
            report,
            max_reruns,
        })
    }
}

/// A redelivered run in progress: it started at `from` and must re-run
/// `next` next.
#[derive(Clone, Copy)]
struct Replay {
    from: usize,
    next: usize,
}

fn check_key(
    key: &str,
    published: &[String],
    seen: &[String],
    problems: &mut Vec<OrderProblem>,
) -> KeyCounts {
    let mut index: HashMap<&str, usize> = HashMap::new();
    for (i, id) in published.iter().enumerate() {
        if index.insert(id.as_str(), i).is_some() {
            problems.push(OrderProblem::DuplicatePublished {
                key: key.to_string(),
                id: id.clone(),
            });
        }
    }
    // Keep the first position of duplicates.
    for (i, id) in published.iter().enumerate().rev() {
        index.insert(id.as_str(), i);
    }

    let mut counts = KeyCounts {
        published: published.len(),
        handled: seen.len(),
        reruns: 0,
    };
    let mut handled = vec![false; published.len()];
    let mut unknown = Vec::new();
    // Highest index handled so far, plus one (0: nothing handled yet).
    let mut next_new = 0;
    let mut replay: Option<Replay> = None;
    let mut broken = false;

    for (position, id) in seen.iter().enumerate() {
        let Some(&i) = index.get(id.as_str()) else {
            unknown.push(id.clone());
            continue;
        };
        handled[i] = true;
        if broken {
            continue;
        }
        // Start or continue a replay: `i` was handled before.
        let continues = replay.is_some_and(|r| i == r.next);
        let drops_back = i < replay.map_or(next_new, |r| r.next);
        if continues || drops_back {
            counts.reruns += 1;
            let from = match replay {
                Some(r) if continues => r.from,
                _ => i,
            };
            replay = (i + 1 < next_new).then_some(Replay { from, next: i + 1 });
            continue;
        }
        if let Some(r) = replay {
            problems.push(OrderProblem::ReplayGap {
                key: key.to_string(),
                replay_from: published[r.from].clone(),
                expected: published[r.next].clone(),
                got: id.clone(),
                position,
            });
            broken = true;
        } else if i == next_new {
            next_new = i + 1;
        } else {
            problems.push(OrderProblem::HandledEarly {
                key: key.to_string(),
                handled: id.clone(),
                pending: published[next_new].clone(),
                position,
            });
            broken = true;
        }
    }

    if let (false, Some(r)) = (broken, replay) {
        problems.push(OrderProblem::ReplayIncomplete {
            key: key.to_string(),
            replay_from: published[r.from].clone(),
            missing: published[r.next..next_new].to_vec(),
        });
    }
    if !unknown.is_empty() {
        problems.push(OrderProblem::Unknown {
            key: key.to_string(),
            ids: unknown,
        });
    }
    let lost: Vec<String> = published
        .iter()
        .enumerate()
        .filter(|&(i, id)| !handled[i] && index.get(id.as_str()) == Some(&i))
        .map(|(_, id)| id.clone())
        .collect();
    if !lost.is_empty() {
        problems.push(OrderProblem::Lost {
            key: key.to_string(),
            ids: lost,
        });
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(entries: &[(&str, &[&str])]) -> BTreeMap<String, Vec<String>> {
        entries
            .iter()
            .map(|(key, ids)| {
                (
                    key.to_string(),
                    ids.iter().map(|id| id.to_string()).collect(),
                )
            })
            .collect()
    }

    fn check(published: &[&str], seen: &[&str], max: usize) -> Result<OrderReport, OrderViolation> {
        check_order(&map(&[("k", published)]), &map(&[("k", seen)]), max)
    }

    fn problems(published: &[&str], seen: &[&str], max: usize) -> Vec<OrderProblem> {
        check(published, seen, max).unwrap_err().problems
    }

    const P: &[&str] = &["a", "b", "c", "d"];

    #[test]
    fn exact_order_passes() {
        let report = check(P, P, 0).unwrap();
        assert_eq!(report.total_reruns, 0);
        assert_eq!(
            report.keys["k"],
            KeyCounts {
                published: 4,
                handled: 4,
                reruns: 0
            }
        );
    }

    #[test]
    fn at_least_once_replays_pass() {
        // The last event re-run (ack lost).
        assert_eq!(
            check(P, &["a", "b", "c", "d", "d"], 1)
                .unwrap()
                .total_reruns,
            1
        );
        // A suffix replayed in order, then the rest.
        assert_eq!(
            check(P, &["a", "b", "c", "b", "c", "d"], 2)
                .unwrap()
                .total_reruns,
            2
        );
        // A replay cut short by a second crash, replayed again.
        assert_eq!(
            check(P, &["a", "b", "c", "b", "b", "c", "d"], 3)
                .unwrap()
                .total_reruns,
            3
        );
        // Two separate replays.
        assert_eq!(
            check(P, &["a", "a", "b", "c", "c", "d"], 2)
                .unwrap()
                .total_reruns,
            2
        );
    }

    #[test]
    fn keys_are_independent() {
        let published = map(&[("x", &["1", "2"]), ("y", &["3", "4"])]);
        let seen = map(&[("y", &["3", "4"]), ("x", &["1", "2"])]);
        let report = check_order(&published, &seen, 0).unwrap();
        assert_eq!(report.keys.len(), 2);
    }

    #[test]
    fn unknown_event_is_named() {
        assert_eq!(
            problems(&["a"], &["a", "z"], 0),
            vec![OrderProblem::Unknown {
                key: "k".into(),
                ids: vec!["z".into()]
            }]
        );
        // An event of another key counts as unknown for this one.
        let published = map(&[("x", &["1"]), ("y", &["2"])]);
        let seen = map(&[("x", &["1", "2"]), ("y", &["2"])]);
        let violation = check_order(&published, &seen, 0).unwrap_err();
        assert_eq!(
            violation.problems,
            vec![OrderProblem::Unknown {
                key: "x".into(),
                ids: vec!["2".into()]
            }]
        );
    }

    #[test]
    fn loss_is_named() {
        assert_eq!(
            problems(P, &["a", "b"], 0),
            vec![OrderProblem::Lost {
                key: "k".into(),
                ids: vec!["c".into(), "d".into()]
            }]
        );
        // A key with nothing seen at all.
        let violation = check_order(&map(&[("k", &["a"])]), &BTreeMap::new(), 0).unwrap_err();
        assert_eq!(
            violation.problems,
            vec![OrderProblem::Lost {
                key: "k".into(),
                ids: vec!["a".into()]
            }]
        );
    }

    #[test]
    fn skipping_ahead_names_both_events() {
        assert_eq!(
            problems(P, &["a", "c", "b", "d"], 5),
            vec![OrderProblem::HandledEarly {
                key: "k".into(),
                handled: "c".into(),
                pending: "b".into(),
                position: 1
            }]
        );
    }

    #[test]
    fn replay_must_continue_in_order() {
        // Re-ran `b`, then jumped to `d` without re-running `c`.
        assert_eq!(
            problems(P, &["a", "b", "c", "b", "d"], 5),
            vec![OrderProblem::ReplayGap {
                key: "k".into(),
                replay_from: "b".into(),
                expected: "c".into(),
                got: "d".into(),
                position: 4
            }]
        );
        // Re-ran `a`, skipped `b`, re-ran `c`.
        assert_eq!(
            problems(P, &["a", "b", "c", "d", "a", "c", "d"], 5),
            vec![OrderProblem::ReplayGap {
                key: "k".into(),
                replay_from: "a".into(),
                expected: "b".into(),
                got: "c".into(),
                position: 5
            }]
        );
    }

    #[test]
    fn replay_must_catch_up() {
        assert_eq!(
            problems(P, &["a", "b", "c", "d", "b", "c"], 5),
            vec![OrderProblem::ReplayIncomplete {
                key: "k".into(),
                replay_from: "b".into(),
                missing: vec!["d".into()]
            }]
        );
    }

    #[test]
    fn too_many_reruns() {
        let violation = check(P, &["a", "a", "b", "b", "c", "d"], 1).unwrap_err();
        assert_eq!(
            violation.problems,
            vec![OrderProblem::TooManyReruns { total: 2, max: 1 }]
        );
        assert_eq!(violation.report.total_reruns, 2);
    }

    #[test]
    fn duplicate_published_id() {
        assert_eq!(
            problems(&["a", "a"], &["a"], 0),
            vec![OrderProblem::DuplicatePublished {
                key: "k".into(),
                id: "a".into()
            }]
        );
    }

    #[test]
    fn all_problems_are_reported_and_explained() {
        let published = map(&[("x", &["1", "2", "3"]), ("y", &["4"])]);
        let seen = map(&[("x", &["2", "1", "9"]), ("y", &["4", "4", "4"])]);
        let violation = check_order(&published, &seen, 0).unwrap_err();
        assert_eq!(violation.problems.len(), 4, "{violation}");
        let text = violation.to_string();
        assert!(text.starts_with("per-key order check failed with 4 problem(s):\n"));
        assert!(text.contains(
            "key `x`: event `2` was handled (run #1) before event `1`, which was published earlier"
        ));
        assert!(text.contains("key `x`: handlers saw events never published for this key: `9`"));
        assert!(text.contains("key `x`: published events never handled (lost): `3`"));
        assert!(text.contains("2 re-runs in total, more than the 0 allowed"));
        assert_eq!(text.lines().count(), 6, "{text}");
    }
}
