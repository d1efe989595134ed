//! How the randomized fault-schedule tests (`fault_schedules.rs`,
//! `cluster_fault_schedules.rs`, `pg_fault_schedules.rs`) run their seeds
//! alike: the seeds from the environment, one line per schedule, the totals
//! of the fault kinds, a failed schedule's report and the final panic.
#![allow(dead_code, missing_docs, unreachable_pub)]

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::fs;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::schedule_dir::write_file;

/// What every schedule did alike.
pub struct Ran {
    pub seed: u64,
    /// The kind of each of its faults.
    pub fault_kinds: Vec<&'static str>,
    pub violations: Vec<String>,
    pub elapsed: Duration,
    /// Its log directory, if kept.
    pub dir: Option<PathBuf>,
}

impl Ran {
    /// A schedule of `seed` started at `started` ends: its log directory
    /// `dir` is kept if it failed or `keep_var` is set, removed otherwise.
    pub fn new(
        seed: u64,
        fault_kinds: Vec<&'static str>,
        violations: Vec<String>,
        started: Instant,
        dir: PathBuf,
        keep_var: &str,
    ) -> Self {
        let keep = !violations.is_empty() || std::env::var(keep_var).is_ok();
        Ran {
            seed,
            fault_kinds,
            violations,
            elapsed: started.elapsed(),
            dir: keep_dir(dir, keep),
        }
    }
}

/// What every schedule's outcome tells the run.
pub trait ScheduleOutcome {
    fn ran(&self) -> &Ran;
    /// The schedule's line.
    fn summary(&self) -> String;
    /// A failed schedule's full report.
    fn report(&self) -> String;

    fn failed(&self) -> bool {
        !self.ran().violations.is_empty()
    }
}

/// An environment variable as a number, if set and one.
pub fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

/// The seeds of a bounded run: `n` from `{prefix}_BASE` (default 1).
pub fn bounded_seeds(prefix: &str, n: u64) -> Range<u64> {
    let base = env_u64(&format!("{prefix}_BASE")).unwrap_or(1);
    base..base + n
}

/// The seeds of a long run, printed: `{prefix}_SCHEDULES` (default `n`)
/// from `{prefix}_BASE` (default: `offset` plus a number from the clock).
pub fn long_seeds(prefix: &str, n: u64, offset: u64, schedules: &str) -> Range<u64> {
    let n = env_u64(&format!("{prefix}_SCHEDULES")).unwrap_or(n);
    let base = env_u64(&format!("{prefix}_BASE")).unwrap_or_else(|| {
        offset
            + SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs() % 1_000_000 * 1000)
    });
    println!("[long] {n} {schedules} from seed {base} ({prefix}_BASE={base})");
    base..base + n
}

/// Runs `seeds` one after the other with `run`, printing each schedule's
/// line (and a failed one's report) as it ends.
pub async fn run_seeds<O, F>(
    what: &str,
    seeds: impl IntoIterator<Item = u64>,
    mut run: impl FnMut(u64) -> F,
) -> Vec<O>
where
    O: ScheduleOutcome,
    F: Future<Output = O>,
{
    let mut outcomes = Vec::new();
    for seed in seeds {
        let o = run(seed).await;
        println!("[{what}] {}", o.summary());
        if o.failed() {
            println!("{}", o.report());
        }
        outcomes.push(o);
    }
    outcomes
}

/// `kind n, kind n, …`: how often each kind of fault ran, by kind.
pub fn fault_kinds<O: ScheduleOutcome>(outcomes: &[O]) -> String {
    let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
    for kind in outcomes.iter().flat_map(|o| &o.ran().fault_kinds) {
        *kinds.entry(*kind).or_default() += 1;
    }
    let kinds: Vec<String> = kinds.iter().map(|(k, n)| format!("{k} {n}")).collect();
    kinds.join(", ")
}

/// The failed schedules.
pub fn failed<O: ScheduleOutcome>(outcomes: &[O]) -> Vec<&O> {
    outcomes.iter().filter(|o| o.failed()).collect()
}

/// `: seeds [..]` of the failed schedules, or nothing.
pub fn failed_seeds<O: ScheduleOutcome>(failed: &[&O]) -> String {
    if failed.is_empty() {
        String::new()
    } else {
        format!(
            ": seeds {:?}",
            failed.iter().map(|o| o.ran().seed).collect::<Vec<_>>()
        )
    }
}

/// Panics with one `line` per failed schedule, if any failed.
pub fn panic_if_failed<O: ScheduleOutcome>(
    what: &str,
    outcomes: &[O],
    line: impl Fn(&O) -> String,
) {
    let failed = failed(outcomes);
    if !failed.is_empty() {
        let lines: Vec<String> = failed.iter().map(|o| line(o)).collect();
        panic!(
            "{} of {} {what} failed (full reports above):\n{}",
            failed.len(),
            outcomes.len(),
            lines.join("\n")
        );
    }
}

/// The end of a failed schedule's report: the first 20 violations (and
/// `where_more` to find the others), the directory with `dir_holds`, and
/// the replay command.
pub fn report_tail(ran: &Ran, where_more: &str, dir_holds: &str, replay: &str) -> String {
    let mut s = String::new();
    for v in ran.violations.iter().take(20) {
        s.push_str(&format!("  {v}\n"));
    }
    if ran.violations.len() > 20 {
        s.push_str(&format!(
            "  … {} more ({where_more})\n",
            ran.violations.len() - 20
        ));
    }
    if let Some(dir) = &ran.dir {
        s.push_str(&format!("  {dir_holds}: {}\n", dir.display()));
    }
    s.push_str(&format!("  replay: {replay}\n"));
    s
}

/// Writes what a schedule runs with to `dir/schedule.txt`.
pub fn write_schedule(dir: &Path, settings: &impl Debug, faults: &str, replay: &str) {
    write_file(
        dir,
        "schedule.txt",
        &format!("{settings:#?}\nfaults: {faults}\nreplay: {replay}\n"),
    );
}

/// The log directory if it is to be kept; removed otherwise.
pub fn keep_dir(dir: PathBuf, keep: bool) -> Option<PathBuf> {
    if keep {
        Some(dir)
    } else {
        let _ = fs::remove_dir_all(&dir);
        None
    }
}
