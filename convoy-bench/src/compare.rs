//! `compare OLD NEW`: how the convoy/baseline ratios changed between two
//! result files. Only ratios are compared, each convoy figure beside the
//! baseline of its own run: absolute figures of two runs differ with the
//! machine, its load and the server, and say little about convoy.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context as _, Result};

use crate::report::{Report, Row, format_ratio, render_table};

/// A ratio moving more than this share the wrong way is flagged.
pub const THRESHOLD: f64 = 0.10;

/// Which way a figure is better.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Better {
    /// Rates (`events/s`): a lower ratio is a slowdown.
    Higher,
    /// Costs and times (per event, ms, CPU, bytes, idle calls/s): a higher
    /// ratio is a regression.
    Lower,
}

impl Better {
    /// The direction of `metric`: higher for event rates, lower for the
    /// rest (what convoy costs, how long it takes).
    pub fn of(metric: &str) -> Self {
        if metric.ends_with("events/s") {
            Better::Higher
        } else {
            Better::Lower
        }
    }
}

/// One figure found in both files.
#[derive(Debug, Clone)]
pub struct Change {
    /// The scenario (`throughput`).
    pub scenario: String,
    /// The case's parameters (`K=64 E=1 mu=1`), without time-out remarks.
    pub case: String,
    /// The old file's row.
    pub old: Row,
    /// The new file's row.
    pub new: Row,
    /// New ratio / old ratio, when both files have a ratio.
    pub change: Option<f64>,
    /// The ratio moved more than [`THRESHOLD`] the wrong way.
    pub worse: bool,
}

/// A figure found in one file only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Missing {
    /// The scenario.
    pub scenario: String,
    /// The case's parameters.
    pub case: String,
    /// What is measured.
    pub metric: String,
}

/// Two result files side by side.
#[derive(Debug, Clone, Default)]
pub struct Comparison {
    /// The figures in both, in the old file's order.
    pub changes: Vec<Change>,
    /// The figures only the old file has.
    pub only_old: Vec<Missing>,
    /// The figures only the new file has.
    pub only_new: Vec<Missing>,
}

/// A case label without the ` (convoy timed out at 123/456)` remarks
/// [`case_label`](crate::report::case_label) appends: the case's
/// parameters, which match across files.
pub fn case_key(label: &str) -> &str {
    let mut key = label;
    while let Some(at) = key.rfind(" (") {
        let tail = &key[at..];
        if tail.ends_with(')') && tail.contains(" timed out at ") {
            key = &key[..at];
        } else {
            break;
        }
    }
    key
}

/// Every row of `report` with its scenario.
fn rows(report: &Report) -> Vec<(&str, &Row)> {
    report
        .sections
        .iter()
        .flat_map(|s| s.rows.iter().map(move |r| (s.scenario.as_str(), r)))
        .collect()
}

/// Matches the rows of `old` and `new` by scenario, case parameters and
/// metric, and computes each ratio's change.
pub fn compare(old: &Report, new: &Report) -> Comparison {
    let key = |(scenario, row): &(&str, &Row)| {
        (
            scenario.to_string(),
            case_key(&row.case).to_owned(),
            row.metric.clone(),
        )
    };
    let missing = |entry: &(&str, &Row)| {
        let (scenario, case, metric) = key(entry);
        Missing {
            scenario,
            case,
            metric,
        }
    };
    let mut unmatched: Vec<Option<(&str, &Row)>> = rows(new).into_iter().map(Some).collect();
    let mut out = Comparison::default();
    for o in rows(old) {
        let k = key(&o);
        let found = unmatched
            .iter_mut()
            .find(|n| n.as_ref().is_some_and(|n| key(n) == k))
            .and_then(Option::take);
        let Some((_, new_row)) = found else {
            out.only_old.push(missing(&o));
            continue;
        };
        let change = match (o.1.ratio, new_row.ratio) {
            (Some(a), Some(b)) if a.is_finite() && b.is_finite() && a > 0.0 => Some(b / a),
            _ => None,
        };
        let worse = change.is_some_and(|c| match Better::of(&k.2) {
            Better::Higher => c < 1.0 - THRESHOLD,
            Better::Lower => c > 1.0 + THRESHOLD,
        });
        out.changes.push(Change {
            scenario: k.0,
            case: k.1,
            old: o.1.clone(),
            new: new_row.clone(),
            change,
            worse,
        });
    }
    out.only_new = unmatched.iter().flatten().map(missing).collect();
    out
}

/// Reads a result file written by `--out` (or saved from `--json`).
pub fn read_report(path: &Path) -> Result<Report> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    parse_report(&text).with_context(|| {
        format!(
            "{} is not a convoy-bench result (the JSON of --out or --json)",
            path.display()
        )
    })
}

/// A result file's text as a report.
pub fn parse_report(text: &str) -> Result<Report> {
    Ok(serde_json::from_str(text)?)
}

/// Reads both files and renders their comparison.
pub fn compare_files(old: &Path, new: &Path) -> Result<String> {
    let o = read_report(old)?;
    let n = read_report(new)?;
    Ok(render(
        (&old.display().to_string(), &o),
        (&new.display().to_string(), &n),
    ))
}

/// `value`, or `not recorded` for a field an older file lacks.
fn or_unrecorded(value: &str) -> &str {
    if value.is_empty() {
        "not recorded"
    } else {
        value
    }
}

/// The change as a signed percentage (`+4.2%`, `-12.0%`).
fn format_change(c: f64) -> String {
    format!("{:+.1}%", (c - 1.0) * 100.0)
}

/// The comparison as text: both files' provenance, one table per
/// scenario, the figures found in one file only.
pub fn render(old: (&str, &Report), new: (&str, &Report)) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "convoy-bench compare: convoy/baseline ratios, each convoy figure beside the baseline of its own run; absolute figures of two runs are not compared (the machine, its load and the server differ between runs)"
    );
    for (which, (path, r)) in [("old", old), ("new", new)] {
        let _ = writeln!(out, "{which}: {path}");
        let _ = writeln!(
            out,
            "  commit {}, {}, {}, {} CPUs, load before {}",
            or_unrecorded(&r.commit),
            or_unrecorded(&r.date),
            r.server,
            r.cpus,
            or_unrecorded(&r.load_before)
        );
        let _ = writeln!(out, "  command: {}", or_unrecorded(&r.command));
    }
    if old.1.server != new.1.server || old.1.cpus != new.1.cpus {
        let _ = writeln!(
            out,
            "note: the runs differ in server or CPUs ({}, {} CPUs / {}, {} CPUs): even the ratios may move with them",
            old.1.server, old.1.cpus, new.1.server, new.1.cpus
        );
    }
    let _ = writeln!(
        out,
        "change: new ratio / old ratio - 1; WORSE: more than {:.0}% the wrong way (down for events/s, up for costs and times)",
        THRESHOLD * 100.0
    );
    let cmp = compare(old.1, new.1);
    let header: Vec<String> = [
        "case",
        "metric",
        "old convoy",
        "old baseline",
        "old ratio",
        "new convoy",
        "new baseline",
        "new ratio",
        "change",
        "",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let ratio = |r: &Row| r.ratio.map_or_else(|| "-".to_owned(), format_ratio);
    let mut scenarios: Vec<&str> = Vec::new();
    for c in &cmp.changes {
        if !scenarios.contains(&c.scenario.as_str()) {
            scenarios.push(&c.scenario);
        }
    }
    for scenario in scenarios {
        let rows: Vec<Vec<String>> = cmp
            .changes
            .iter()
            .filter(|c| c.scenario == scenario)
            .map(|c| {
                let mut flag = Vec::new();
                if c.worse {
                    flag.push("WORSE");
                }
                if c.old.case != c.case {
                    flag.push("old timed out");
                }
                if c.new.case != c.case {
                    flag.push("new timed out");
                }
                vec![
                    c.case.clone(),
                    c.old.metric.clone(),
                    c.old.convoy.render(),
                    c.old.baseline.render(),
                    ratio(&c.old),
                    c.new.convoy.render(),
                    c.new.baseline.render(),
                    ratio(&c.new),
                    c.change.map_or_else(|| "-".to_owned(), format_change),
                    flag.join(", "),
                ]
            })
            .collect();
        let _ = writeln!(out);
        let _ = writeln!(out, "== {scenario} ==");
        out.push_str(&render_table(&header, &rows));
    }
    for (which, missing) in [("old", &cmp.only_old), ("new", &cmp.only_new)] {
        if missing.is_empty() {
            continue;
        }
        let _ = writeln!(out);
        let _ = writeln!(out, "only in {which}:");
        // One line per case: its figures, or "every figure" when the other
        // file has none of the case.
        let mut cases: Vec<(&str, &str, Vec<&str>)> = Vec::new();
        for m in missing.iter() {
            match cases
                .iter_mut()
                .find(|(s, c, _)| *s == m.scenario && *c == m.case)
            {
                Some((_, _, metrics)) => metrics.push(&m.metric),
                None => cases.push((&m.scenario, &m.case, vec![&m.metric])),
            }
        }
        for (scenario, case, metrics) in cases {
            let in_other = cmp
                .changes
                .iter()
                .any(|c| c.scenario == scenario && c.case == case);
            let what = if in_other {
                metrics.join(", ")
            } else {
                let n = metrics.len();
                format!(
                    "the whole case ({n} figure{})",
                    if n == 1 { "" } else { "s" }
                )
            };
            let _ = writeln!(out, "  {scenario} {case}: {what}");
        }
    }
    let compared = cmp.changes.iter().filter(|c| c.change.is_some()).count();
    let worse = cmp.changes.iter().filter(|c| c.worse).count();
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "{compared} ratios compared, {worse} worse by more than {:.0}%; figures only in old: {}, only in new: {}",
        THRESHOLD * 100.0,
        cmp.only_old.len(),
        cmp.only_new.len()
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{Cell, Section};

    fn report(commit: &str, rows: Vec<Row>) -> Report {
        let mut section = Section::new("throughput");
        section.rows = rows;
        Report {
            commit: commit.to_owned(),
            date: "2026-12-01T09:30:00Z".to_owned(),
            command: "convoy-bench throughput --keys 64 --instances 1".to_owned(),
            server: "Redis 7.0.15".to_owned(),
            redis: "own redis-server on 127.0.0.1:6379".to_owned(),
            cpus: 2,
            load_before: "0.50 0.40 0.30".to_owned(),
            load_after: "0.60 0.40 0.30".to_owned(),
            sections: vec![section],
        }
    }

    #[test]
    fn time_out_remarks_are_not_part_of_the_case() {
        assert_eq!(case_key("K=64 E=1 mu=1"), "K=64 E=1 mu=1");
        assert_eq!(
            case_key("K=1 E=2 mu=1 (convoy timed out at 5/10) (baseline timed out at 7/10)"),
            "K=1 E=2 mu=1"
        );
        assert_eq!(
            case_key("round 1 (32 keys killed)"),
            "round 1 (32 keys killed)"
        );
    }

    #[test]
    fn cases_match_by_parameters_and_ratios_change() {
        let old = report(
            "aaaa",
            vec![
                Row::new("K=64 E=1 mu=1", "events/s", 40_000.0, 100_000.0),
                Row::new("K=64 E=1 mu=1", "Redis calls/event", 3.0, 0.02),
                Row::new("K=64 E=1 mu=100", "events/s", 80_000.0, 100_000.0),
                Row::new("K=1 E=1 mu=1", "events/s", 10_000.0, 100_000.0),
                Row::new("K=64 E=1 mu=1", "per-key order", "ok", "ok"),
            ],
        );
        let new = report(
            "bbbb-dirty",
            vec![
                // Absolute figures halved, the ratio the same: no change.
                Row::new("K=64 E=1 mu=1", "events/s", 20_000.0, 50_000.0),
                // Costs up 50% against the baseline: worse.
                Row::new("K=64 E=1 mu=1", "Redis calls/event", 4.5, 0.02),
                // A timed-out case still matches; 0.8x -> 0.6x: worse.
                Row::new(
                    "K=64 E=1 mu=100 (convoy timed out at 5/10)",
                    "events/s",
                    60_000.0,
                    100_000.0,
                ),
                Row::new("K=1024 E=1 mu=1", "events/s", 50_000.0, 100_000.0),
                Row::new("K=64 E=1 mu=1", "per-key order", "ok", "ok"),
            ],
        );
        let cmp = compare(&old, &new);
        let found: Vec<(&str, &str, Option<f64>, bool)> = cmp
            .changes
            .iter()
            .map(|c| {
                (
                    c.case.as_str(),
                    c.old.metric.as_str(),
                    c.change.map(|v| (v * 1000.0).round() / 1000.0),
                    c.worse,
                )
            })
            .collect();
        assert_eq!(
            found,
            vec![
                ("K=64 E=1 mu=1", "events/s", Some(1.0), false),
                ("K=64 E=1 mu=1", "Redis calls/event", Some(1.5), true),
                ("K=64 E=1 mu=100", "events/s", Some(0.75), true),
                ("K=64 E=1 mu=1", "per-key order", None, false),
            ]
        );
        let missing = |scenario: &str, case: &str, metric: &str| Missing {
            scenario: scenario.to_owned(),
            case: case.to_owned(),
            metric: metric.to_owned(),
        };
        assert_eq!(
            cmp.only_old,
            vec![missing("throughput", "K=1 E=1 mu=1", "events/s")]
        );
        assert_eq!(
            cmp.only_new,
            vec![missing("throughput", "K=1024 E=1 mu=1", "events/s")]
        );

        let text = render(("old.json", &old), ("new.json", &new));
        assert!(text.contains("absolute figures of two runs are not compared"));
        assert!(text.contains("commit aaaa,"), "{text}");
        assert!(text.contains("commit bbbb-dirty,"), "{text}");
        assert!(text.contains("-25.0%  WORSE, new timed out"), "{text}");
        assert!(text.contains("+50.0%  WORSE"), "{text}");
        assert!(
            text.contains("only in old:\n  throughput K=1 E=1 mu=1: the whole case (1 figure)")
        );
        assert!(
            text.contains("3 ratios compared, 2 worse by more than 10%"),
            "{text}"
        );
    }

    #[test]
    fn a_ratio_drop_of_a_rate_is_worse_a_drop_of_a_cost_is_not() {
        let rows = |rate: f64, cost: f64| {
            vec![
                Row::new("c", "events/s", rate, 1.0),
                Row::new("c", "p99 ms", cost, 1.0),
            ]
        };
        let cmp = compare(&report("a", rows(1.0, 1.0)), &report("b", rows(0.89, 0.5)));
        assert_eq!(
            cmp.changes.iter().map(|c| c.worse).collect::<Vec<_>>(),
            [true, false]
        );
        let cmp = compare(&report("a", rows(1.0, 1.0)), &report("b", rows(0.91, 1.09)));
        assert_eq!(
            cmp.changes.iter().map(|c| c.worse).collect::<Vec<_>>(),
            [false, false]
        );
    }

    #[test]
    fn a_result_file_reads_back_older_files_too() {
        let r = report("abc", vec![Row::new("c", "events/s", 1.0, Cell::Empty)]);
        let text = serde_json::to_string_pretty(&r).expect("encode");
        let back = parse_report(&text).expect("decode");
        assert_eq!(back.commit, "abc");
        assert_eq!(back.sections[0].rows[0].case, "c");
        assert!(matches!(back.sections[0].rows[0].baseline, Cell::Empty));
        // A file written before results recorded their provenance.
        let older = text
            .replace("\"server\"", "\"redis_version\"")
            .replace("\"commit\": \"abc\",", "")
            .replace("\"date\": \"2026-12-01T09:30:00Z\",", "")
            .replace(
                "\"command\": \"convoy-bench throughput --keys 64 --instances 1\",",
                "",
            );
        assert!(!older.contains("commit"), "{older}");
        let back = parse_report(&older).expect("decode an older file");
        assert_eq!(back.commit, "");
        assert_eq!(back.server, "Redis 7.0.15");
    }

    #[test]
    fn a_malformed_or_foreign_file_is_an_error_naming_it() {
        let dir = std::env::temp_dir().join(format!("convoy-bench-compare-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("scratch directory");
        let good = dir.join("good.json");
        let text = serde_json::to_string(&report("a", vec![Row::new("c", "events/s", 1.0, 2.0)]))
            .expect("encode");
        std::fs::write(&good, text).expect("write good.json");
        let cases = [
            ("truncated.json", "{\"commit\": \"a\", \"sections\": ["),
            ("foreign.json", "{\"name\": \"criterion\", \"mean\": 1.5}"),
            (
                "table.txt",
                "convoy-bench: Redis 7.0.15 (own redis-server), 2 CPUs\n",
            ),
        ];
        for (name, content) in cases {
            let bad = dir.join(name);
            std::fs::write(&bad, content).expect("write a bad file");
            let err = compare_files(&good, &bad).expect_err(name);
            let message = format!("{err:#}");
            assert!(message.contains(name), "{message}");
            assert!(
                message.contains("is not a convoy-bench result"),
                "{message}"
            );
            let err = compare_files(&bad, &good).expect_err(name);
            assert!(format!("{err:#}").contains(name));
        }
        let absent = dir.join("absent.json");
        let err = compare_files(&good, &absent).expect_err("absent");
        assert!(format!("{err:#}").contains("absent.json"));
        assert!(compare_files(&good, &good).is_ok());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
