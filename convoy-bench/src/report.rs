//! Results: what every scenario reports, printed as text tables or as
//! JSON, and read back from a result file (`compare`).

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

/// One value in a results row.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Cell {
    /// A measured number.
    Num(f64),
    /// A verdict or a note.
    Text(String),
    /// Nothing to compare with.
    Empty,
}

impl Cell {
    /// The number, if it is one.
    pub fn number(&self) -> Option<f64> {
        match self {
            Cell::Num(v) => Some(*v),
            _ => None,
        }
    }

    /// As printed in a table.
    pub fn render(&self) -> String {
        match self {
            Cell::Num(v) => format_num(*v),
            Cell::Text(t) => t.clone(),
            Cell::Empty => "-".to_owned(),
        }
    }
}

impl From<f64> for Cell {
    fn from(v: f64) -> Self {
        Cell::Num(v)
    }
}

impl From<&str> for Cell {
    fn from(v: &str) -> Self {
        Cell::Text(v.to_owned())
    }
}

impl From<String> for Cell {
    fn from(v: String) -> Self {
        Cell::Text(v)
    }
}

/// One measured figure, convoy beside the baseline.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Row {
    /// Which case of the scenario (`K=64 E=1`).
    pub case: String,
    /// What is measured (`events/s`).
    pub metric: String,
    /// convoy's figure.
    pub convoy: Cell,
    /// The plain consumer group's figure, measured in the same run.
    pub baseline: Cell,
    /// `convoy / baseline` when both are numbers.
    pub ratio: Option<f64>,
    /// The target for this figure, if it has one.
    pub target: Option<String>,
    /// Whether convoy met the target.
    pub met: Option<bool>,
}

impl Row {
    /// A row; the ratio is computed when both sides are numbers.
    pub fn new(
        case: impl Into<String>,
        metric: impl Into<String>,
        convoy: impl Into<Cell>,
        baseline: impl Into<Cell>,
    ) -> Self {
        let convoy = convoy.into();
        let baseline = baseline.into();
        let ratio = match (convoy.number(), baseline.number()) {
            (Some(c), Some(b)) if b != 0.0 => Some(c / b),
            _ => None,
        };
        Row {
            case: case.into(),
            metric: metric.into(),
            convoy,
            baseline,
            ratio,
            target: None,
            met: None,
        }
    }

    /// A row with no baseline figure.
    pub fn alone(
        case: impl Into<String>,
        metric: impl Into<String>,
        convoy: impl Into<Cell>,
    ) -> Self {
        Self::new(case, metric, convoy, Cell::Empty)
    }

    /// Adds the target and whether it was met.
    pub fn target(mut self, target: impl Into<String>, met: bool) -> Self {
        self.target = Some(target.into());
        self.met = Some(met);
        self
    }
}

/// A free-form table (timelines, command breakdowns).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Table {
    /// What it shows.
    pub title: String,
    /// Column names.
    pub header: Vec<String>,
    /// Rows of already formatted values.
    pub rows: Vec<Vec<String>>,
}

impl Table {
    /// A command breakdown: one row per case, `case` then the cells of
    /// [`CommandStats::top_per`](crate::stats::CommandStats::top_per),
    /// padded to the same width.
    pub fn breakdown(title: &str, first: &str, mut rows: Vec<Vec<String>>) -> Self {
        let width = rows.iter().map(Vec::len).max().unwrap_or(1);
        for r in &mut rows {
            r.resize(width, String::new());
        }
        let mut header = vec![first.to_owned()];
        header.extend((1..width).map(|i| format!("#{i}")));
        Table {
            title: title.to_owned(),
            header,
            rows,
        }
    }
}

/// One parameter of a scenario.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Param {
    /// What it is.
    pub name: String,
    /// Its value, as printed.
    pub value: String,
}

/// One scenario's results.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Section {
    /// The scenario (`throughput`).
    pub scenario: String,
    /// Its parameters, in order.
    pub params: Vec<Param>,
    /// convoy beside the baseline.
    pub rows: Vec<Row>,
    /// Further tables.
    pub tables: Vec<Table>,
    /// Remarks on how to read the figures.
    pub notes: Vec<String>,
    /// Wall time the scenario took, in seconds.
    pub seconds: f64,
}

impl Section {
    /// An empty section for `scenario`.
    pub fn new(scenario: &str) -> Self {
        Section {
            scenario: scenario.to_owned(),
            params: Vec::new(),
            rows: Vec::new(),
            tables: Vec::new(),
            notes: Vec::new(),
            seconds: 0.0,
        }
    }

    /// Adds a parameter.
    pub fn param(&mut self, name: &str, value: impl ToString) {
        self.params.push(Param {
            name: name.to_owned(),
            value: value.to_string(),
        });
    }

    /// Adds a note.
    pub fn note(&mut self, text: impl Into<String>) {
        self.notes.push(text.into());
    }
}

/// Everything one invocation measured, and where it comes from.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    /// The commit the benchmark was built from (`git rev-parse HEAD` at
    /// build time, `-dirty` when the build had uncommitted changes,
    /// `unknown` without git). Empty in a file
    /// written before results recorded it.
    #[serde(default)]
    pub commit: String,
    /// When the run started, UTC (`2026-12-01T09:30:00Z`).
    #[serde(default)]
    pub date: String,
    /// The command line that produced the result.
    #[serde(default)]
    pub command: String,
    /// The server and its version (`Redis 7.0.15`, `Valkey 9.1.2`); named
    /// `redis_version` in older files.
    #[serde(alias = "redis_version")]
    pub server: String,
    /// Where Redis ran (`own redis-server on port N` or the given URL).
    pub redis: String,
    /// CPUs this process may use.
    pub cpus: usize,
    /// `/proc/loadavg` before the first scenario (other work on the machine
    /// skews every figure).
    #[serde(default)]
    pub load_before: String,
    /// `/proc/loadavg` after the last scenario.
    #[serde(default)]
    pub load_after: String,
    /// One per scenario run.
    pub sections: Vec<Section>,
}

/// `case`, with ` (who timed out at handled/n)` for each side that timed
/// out: `sides` is (who, timed out, handled).
pub fn case_label(case: &str, sides: [(&str, bool, u64); 2], n: usize) -> String {
    let mut label = case.to_owned();
    for (who, timed_out, handled) in sides {
        if timed_out {
            label.push_str(&format!(" ({who} timed out at {handled}/{n})"));
        }
    }
    label
}

/// Formats a number for a table: thousands separated, fewer decimals as it
/// grows.
pub fn format_num(v: f64) -> String {
    if !v.is_finite() {
        return v.to_string();
    }
    let a = v.abs();
    if a >= 1000.0 {
        let rounded = v.round() as i64;
        let digits = rounded.unsigned_abs().to_string();
        let mut out = String::new();
        for (i, c) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i).is_multiple_of(3) {
                out.push(',');
            }
            out.push(c);
        }
        if rounded < 0 {
            out.insert(0, '-');
        }
        out
    } else if a >= 100.0 || v.fract() == 0.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 0.1 || a == 0.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

/// Formats a ratio (`0.45x`).
pub fn format_ratio(r: f64) -> String {
    if r >= 10.0 {
        format!("{r:.0}x")
    } else if r >= 0.01 {
        format!("{r:.2}x")
    } else {
        format!("{r:.4}x")
    }
}

/// Renders `rows` under `header` with aligned columns (numbers right
/// aligned).
pub fn render_table(header: &[String], rows: &[Vec<String>]) -> String {
    let cols = header.len();
    let mut width: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate().take(cols) {
            width[i] = width[i].max(c.chars().count());
        }
    }
    let numeric = |s: &str| {
        s.chars()
            .next()
            .is_some_and(|c| c.is_ascii_digit() || c == '-')
            && s.chars().all(|c| c.is_ascii_digit() || ",.-x%".contains(c))
    };
    let mut out = String::new();
    let line = |cells: &[String], out: &mut String| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate().take(cols) {
            let pad = width[i] - c.chars().count();
            if i > 0 {
                s.push_str("  ");
            }
            if numeric(c) && i > 0 {
                s.push_str(&" ".repeat(pad));
                s.push_str(c);
            } else {
                s.push_str(c);
                s.push_str(&" ".repeat(pad));
            }
        }
        let _ = writeln!(out, "{}", s.trim_end());
    };
    line(header, &mut out);
    let rule: Vec<String> = width.iter().map(|w| "-".repeat(*w)).collect();
    line(&rule, &mut out);
    for r in rows {
        line(r, &mut out);
    }
    out
}

impl Report {
    /// The report as text tables.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "convoy-bench: {} ({}), {} CPUs",
            self.server, self.redis, self.cpus
        );
        let _ = writeln!(out, "commit: {}; date: {}", self.commit, self.date);
        let _ = writeln!(out, "command: {}", self.command);
        let _ = writeln!(
            out,
            "load average before: {}; after: {}",
            self.load_before, self.load_after
        );
        for s in &self.sections {
            let _ = writeln!(out);
            let _ = writeln!(out, "== {} ({:.0} s) ==", s.scenario, s.seconds);
            for p in &s.params {
                let _ = writeln!(out, "  {}: {}", p.name, p.value);
            }
            let _ = writeln!(out);
            let header: Vec<String> = [
                "case",
                "metric",
                "convoy",
                "baseline",
                "convoy/baseline",
                "target",
                "",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            let rows: Vec<Vec<String>> = s
                .rows
                .iter()
                .map(|r| {
                    vec![
                        r.case.clone(),
                        r.metric.clone(),
                        r.convoy.render(),
                        r.baseline.render(),
                        r.ratio.map(format_ratio).unwrap_or_else(|| "-".into()),
                        r.target.clone().unwrap_or_default(),
                        match r.met {
                            Some(true) => "met".into(),
                            Some(false) => "MISSED".into(),
                            None => String::new(),
                        },
                    ]
                })
                .collect();
            out.push_str(&render_table(&header, &rows));
            for t in &s.tables {
                let _ = writeln!(out);
                let _ = writeln!(out, "  {}", t.title);
                out.push_str(&render_table(&t.header, &t.rows));
            }
            if !s.notes.is_empty() {
                let _ = writeln!(out);
                for n in &s.notes {
                    let _ = writeln!(out, "  * {n}");
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_are_formatted_for_reading() {
        assert_eq!(format_num(240_123.4), "240,123");
        assert_eq!(format_num(-1234.0), "-1,234");
        assert_eq!(format_num(123.4), "123");
        assert_eq!(format_num(12.34), "12.3");
        assert_eq!(format_num(1.234), "1.23");
        assert_eq!(format_num(0.0123), "0.012");
        assert_eq!(format_num(0.0), "0");
        assert_eq!(format_num(94.0), "94");
    }

    #[test]
    fn ratio_only_between_numbers() {
        let r = Row::new("c", "m", 50.0, 100.0);
        assert_eq!(r.ratio, Some(0.5));
        let r = Row::new("c", "m", "ok", 100.0);
        assert_eq!(r.ratio, None);
        let r = Row::alone("c", "m", 1.0).target("<= 2", true);
        assert_eq!(r.met, Some(true));
    }

    #[test]
    fn tables_align() {
        let t = render_table(
            &["a".into(), "b".into()],
            &[
                vec!["x".into(), "1,000".into()],
                vec!["yy".into(), "5".into()],
            ],
        );
        assert_eq!(t, "a   b\n--  -----\nx   1,000\nyy      5\n");
    }
}
