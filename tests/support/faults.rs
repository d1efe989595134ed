//! The pure parts of the randomized fault-schedule test
//! (`tests/fault_schedules.rs`): a tiny seeded PRNG, the choice of faults
//! for a seed, the timeline of signals and commands they expand into, and
//! the per-key checks over what the record server holds.
//!
//! Nothing here touches a process or a server, so every check has unit
//! tests that make it fail on purpose.
#![allow(dead_code, missing_docs, unreachable_pub)]

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::time::Duration;

use convoy_runtime::testing::{Window, check_order};

/// splitmix64: a small, good-enough, dependency-free generator. The whole
/// choice of faults of a schedule follows from its seed.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x5eed_c0de_f00d_0001)
    }

    /// A generator for a sub-purpose (engine work, publisher), so adding a
    /// draw in one place does not shift the others.
    pub fn fork(&self, purpose: u64) -> Self {
        let mut r = Rng(self.0 ^ purpose.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        r.next_u64();
        r
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (0 when `n == 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_u64() % n }
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi.saturating_sub(lo) + 1)
    }

    pub fn ms(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(self.range(lo, hi))
    }

    /// True with probability `percent` / 100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

/// What a delayed or dropped reply is matched on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// One of convoy's Lua scripts, by the name `script_sha` knows.
    Script(&'static str),
    /// A plain command (its first word).
    Command(&'static str),
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Script(s) => write!(f, "script:{s}"),
            Target::Command(c) => write!(f, "cmd:{c}"),
        }
    }
}

/// The scripts a reply fault may hit (`verify`: the check behind a native
/// read of new entries, which ends its pipeline).
pub const SCRIPTS: &[&str] = &[
    "read", "verify", "ack", "claim", "fail", "acquire", "release", "reap", "publish",
];
/// The plain commands a reply fault may hit (heartbeat pipeline, wake-up
/// reads, native reads of new entries, discovery: `SSCAN` of the shards'
/// partition indexes).
pub const COMMANDS: &[&str] = &["SET", "XREAD", "XREADGROUP", "SSCAN"];

/// One fault of a schedule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// `kill -9` of the engine in `slot`; `down` later it is started again,
    /// under the same instance id or a new one.
    Kill {
        slot: usize,
        down: Duration,
        same_id: bool,
    },
    /// `SIGSTOP` of the engine in `slot`, `SIGCONT` after `stopped` (past
    /// the lease unless `stopped` is shorter than the TTL).
    Stall { slot: usize, stopped: Duration },
    /// The system-under-test Redis stopped (`SIGTERM`) or killed
    /// (`SIGKILL`), started again on the same port after `down`.
    RedisRestart { graceful: bool, down: Duration },
    /// The Redis process frozen (`SIGSTOP`) for `frozen`.
    RedisFreeze { frozen: Duration },
    /// `CLIENT PAUSE` for `paused`.
    ClientPause { paused: Duration },
    /// The proxy closes every connection.
    ProxyCut,
    /// The proxy stops forwarding for `paused`.
    ProxyPause { paused: Duration },
    /// The next `times` replies of `target` arrive `delay` late (past the
    /// engines' response timeout).
    DelayReply {
        target: Target,
        delay: Duration,
        times: usize,
    },
    /// The next `times` replies of `target` are discarded after Redis ran
    /// the command, and their connection closed.
    DropReply { target: Target, times: usize },
}

/// What a fault keeps busy: two faults on one resource never overlap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Resource {
    Engine(usize),
    Redis,
    Proxy,
}

impl Fault {
    /// The kind, for the per-run counts.
    pub fn kind(&self) -> &'static str {
        match self {
            Fault::Kill { same_id: true, .. } => "kill-9 (same id)",
            Fault::Kill { .. } => "kill-9 (new id)",
            Fault::Stall { .. } => "sigstop",
            Fault::RedisRestart { graceful: true, .. } => "redis stop+restart",
            Fault::RedisRestart { .. } => "redis kill+restart",
            Fault::RedisFreeze { .. } => "redis freeze",
            Fault::ClientPause { .. } => "client pause",
            Fault::ProxyCut => "proxy cut",
            Fault::ProxyPause { .. } => "proxy pause",
            Fault::DelayReply { .. } => "delay reply",
            Fault::DropReply { .. } => "drop reply",
        }
    }

    pub fn resource(&self) -> Resource {
        match self {
            Fault::Kill { slot, .. } | Fault::Stall { slot, .. } => Resource::Engine(*slot),
            Fault::RedisRestart { .. } | Fault::RedisFreeze { .. } | Fault::ClientPause { .. } => {
                Resource::Redis
            }
            Fault::ProxyCut
            | Fault::ProxyPause { .. }
            | Fault::DelayReply { .. }
            | Fault::DropReply { .. } => Resource::Proxy,
        }
    }

    /// How long the fault lasts, from its start to its healing action.
    pub fn span(&self) -> Duration {
        match self {
            Fault::Kill { down, .. } => *down,
            Fault::Stall { stopped, .. } => *stopped,
            Fault::RedisRestart { down, .. } => *down,
            Fault::RedisFreeze { frozen } => *frozen,
            Fault::ClientPause { paused } | Fault::ProxyPause { paused } => *paused,
            Fault::ProxyCut => Duration::ZERO,
            // Reply rules are cleared a while later if they never fired.
            Fault::DelayReply { delay, .. } => *delay + Duration::from_millis(1500),
            Fault::DropReply { .. } => Duration::from_millis(1500),
        }
    }

    /// How many separate interruptions the fault may cause (each may make
    /// every key re-run its unacknowledged events once).
    pub fn incidents(&self) -> usize {
        match self {
            Fault::DelayReply { times, .. } | Fault::DropReply { times, .. } => *times,
            _ => 1,
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = |d: &Duration| d.as_millis();
        match self {
            Fault::Kill {
                slot,
                down,
                same_id,
            } => write!(
                f,
                "kill -9 slot {slot}, back after {} ms {}",
                ms(down),
                if *same_id { "(same id)" } else { "(new id)" }
            ),
            Fault::Stall { slot, stopped } => {
                write!(f, "SIGSTOP slot {slot} for {} ms", ms(stopped))
            }
            Fault::RedisRestart { graceful, down } => write!(
                f,
                "redis {} , restart after {} ms",
                if *graceful { "stop" } else { "kill -9" },
                ms(down)
            ),
            Fault::RedisFreeze { frozen } => write!(f, "redis SIGSTOP for {} ms", ms(frozen)),
            Fault::ClientPause { paused } => write!(f, "CLIENT PAUSE {}", ms(paused)),
            Fault::ProxyCut => write!(f, "proxy cut_all"),
            Fault::ProxyPause { paused } => write!(f, "proxy pause for {} ms", ms(paused)),
            Fault::DelayReply {
                target,
                delay,
                times,
            } => write!(f, "delay {times} {target} replies by {} ms", ms(delay)),
            Fault::DropReply { target, times } => write!(f, "drop {times} {target} replies"),
        }
    }
}

/// A fault and when it starts, from the start of the fault phase.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Planned {
    pub at: Duration,
    pub fault: Fault,
}

/// What the choice of faults depends on besides the seed.
#[derive(Debug, Clone, Copy)]
pub struct PlanParams {
    /// Faults start within this time.
    pub phase: Duration,
    pub engines: usize,
    pub lease_ttl: Duration,
    pub response_timeout: Duration,
    /// Whether proxy faults can be chosen.
    pub proxy: bool,
}

/// The faults of one schedule, in start order: chosen from `rng` only, so
/// one seed always gives the same list.
pub fn plan(rng: &mut Rng, p: &PlanParams) -> Vec<Planned> {
    let count = rng.range(3, 6) as usize;
    let phase_ms = p.phase.as_millis() as u64;
    let ttl_ms = p.lease_ttl.as_millis() as u64;
    let timeout_ms = p.response_timeout.as_millis() as u64;
    let mut busy: HashMap<Resource, Duration> = HashMap::new();
    let mut out = Vec::new();
    for _ in 0..count {
        let roll = rng.below(if p.proxy { 100 } else { 55 });
        let fault = match roll {
            0..=14 => Fault::Kill {
                slot: rng.below(p.engines as u64) as usize,
                down: if rng.chance(25) {
                    Duration::ZERO
                } else {
                    rng.ms(50, 1000)
                },
                same_id: rng.chance(50),
            },
            15..=29 => Fault::Stall {
                slot: rng.below(p.engines as u64) as usize,
                // Mostly past the lease; sometimes a stall the lease rides out.
                stopped: if rng.chance(80) {
                    rng.ms(ttl_ms + 200, ttl_ms * 2)
                } else {
                    rng.ms(100, ttl_ms / 2)
                },
            },
            30..=39 => Fault::RedisRestart {
                graceful: rng.chance(50),
                down: rng.ms(0, 1200),
            },
            40..=47 => Fault::RedisFreeze {
                frozen: rng.ms(100, 700),
            },
            48..=54 => Fault::ClientPause {
                paused: rng.ms(100, 700),
            },
            55..=60 => Fault::ProxyCut,
            61..=67 => Fault::ProxyPause {
                paused: rng.ms(100, 1500),
            },
            68..=83 => Fault::DelayReply {
                target: target(rng),
                delay: rng.ms(timeout_ms + 100, timeout_ms + 1000),
                times: rng.range(1, 3) as usize,
            },
            _ => Fault::DropReply {
                target: target(rng),
                times: rng.range(1, 3) as usize,
            },
        };
        let mut at = rng.ms(0, phase_ms);
        // Often put a Redis fault inside an engine stall: the stalled owner
        // then comes back to a Redis that was restarted or paused meanwhile.
        if fault.resource() == Resource::Redis && rng.chance(50) {
            let stalls: Vec<(Duration, Duration)> = out
                .iter()
                .filter_map(|p: &Planned| match p.fault {
                    Fault::Stall { stopped, .. } => Some((p.at, stopped)),
                    _ => None,
                })
                .collect();
            if !stalls.is_empty() {
                let (start, stopped) = *rng.pick(&stalls);
                at = start + rng.ms(0, stopped.as_millis() as u64 / 2);
            }
        }
        let free = busy.get(&fault.resource()).copied().unwrap_or_default();
        if at < free {
            at = free + Duration::from_millis(50);
        }
        if at > p.phase + Duration::from_millis(1000) {
            continue;
        }
        busy.insert(
            fault.resource(),
            at + fault.span() + Duration::from_millis(100),
        );
        out.push(Planned { at, fault });
    }
    out.sort_by_key(|p| p.at);
    out
}

fn target(rng: &mut Rng) -> Target {
    if rng.chance(80) {
        Target::Script(rng.pick::<&'static str>(SCRIPTS))
    } else {
        Target::Command(rng.pick::<&'static str>(COMMANDS))
    }
}

/// One step of a schedule's timeline: what the fault thread does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Kill(usize),
    Respawn {
        slot: usize,
        same_id: bool,
    },
    Stop(usize),
    Cont(usize),
    RedisDown {
        graceful: bool,
    },
    RedisUp,
    Freeze,
    Thaw,
    ClientPause(Duration),
    ProxyCut,
    ProxyPause,
    ProxyResume,
    Delay {
        target: Target,
        delay: Duration,
        times: usize,
    },
    Drop {
        target: Target,
        times: usize,
    },
    ProxyClear,
}

/// The faults expanded into actions at their times (each fault's healing
/// action at its end), in time order.
pub fn timeline(plan: &[Planned]) -> Vec<(Duration, Action)> {
    let mut out = Vec::new();
    for p in plan {
        let end = p.at + p.fault.span();
        let (start, heal) = match &p.fault {
            Fault::Kill {
                slot,
                same_id,
                down: _,
            } => (
                Action::Kill(*slot),
                Some(Action::Respawn {
                    slot: *slot,
                    same_id: *same_id,
                }),
            ),
            Fault::Stall { slot, .. } => (Action::Stop(*slot), Some(Action::Cont(*slot))),
            Fault::RedisRestart { graceful, .. } => (
                Action::RedisDown {
                    graceful: *graceful,
                },
                Some(Action::RedisUp),
            ),
            Fault::RedisFreeze { .. } => (Action::Freeze, Some(Action::Thaw)),
            Fault::ClientPause { paused } => (Action::ClientPause(*paused), None),
            Fault::ProxyCut => (Action::ProxyCut, None),
            Fault::ProxyPause { .. } => (Action::ProxyPause, Some(Action::ProxyResume)),
            Fault::DelayReply {
                target,
                delay,
                times,
            } => (
                Action::Delay {
                    target: target.clone(),
                    delay: *delay,
                    times: *times,
                },
                Some(Action::ProxyClear),
            ),
            Fault::DropReply { target, times } => (
                Action::Drop {
                    target: target.clone(),
                    times: *times,
                },
                Some(Action::ProxyClear),
            ),
        };
        out.push((p.at, start));
        if let Some(heal) = heal {
            out.push((end, heal));
        }
    }
    // Stable: a fault's start stays before its heal at the same time.
    out.sort_by_key(|(at, _)| *at);
    out
}

/// An engine process was stopped from `from_us` (taken just before the
/// `SIGSTOP`) to `to_us` (just after the `SIGCONT`), in µs of the record
/// server's clock (the clock of the recorder's windows).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StallRecord {
    pub proc: usize,
    pub from_us: u64,
    pub to_us: u64,
}

/// The process number in a recorder label `"{instance}/p{proc}@{generation}"`.
pub fn label_proc(label: &str) -> Option<usize> {
    let (_, rest) = label.split_once("/p")?;
    let (proc, _) = rest.split_once('@')?;
    proc.parse().ok()
}

/// The fence generation in a recorder label.
pub fn label_generation(label: &str) -> Option<u64> {
    label.rsplit_once('@')?.1.parse().ok()
}

pub fn label(instance: &str, proc: usize, generation: u64) -> String {
    format!("{instance}/p{proc}@{generation}")
}

/// What the checks of one schedule found.
#[derive(Debug, Clone, Default)]
pub struct Verdict {
    /// One line per problem, prefixed with the check that failed.
    pub violations: Vec<String>,
    /// Keys the problems are about (for the evidence dump).
    pub keys: Vec<String>,
    pub handled: usize,
    pub reruns: usize,
}

/// What a schedule's run left for the checks.
#[derive(Debug, Clone)]
pub struct Observed<'a> {
    /// Every committed event id per key, in publish order.
    pub committed: &'a BTreeMap<String, Vec<String>>,
    /// Every processing window per key, in start order (dispatch time).
    pub windows: &'a BTreeMap<String, Vec<Window>>,
    pub stalls: &'a [StallRecord],
    /// When each killed process was gone (µs, record clock).
    pub kills: &'a HashMap<usize, u64>,
    pub max_unacked: usize,
    /// Interruptions the schedule's faults may cause (see
    /// [`Fault::incidents`]).
    pub incidents: usize,
}

/// The three checks of a schedule, per key:
///
/// 1. no committed event missing: each was handled to completion (a window
///    with an exit) at least once;
/// 2. order: [`check_order`] on the start order (nothing skipped, re-runs
///    only as in-order replays of a suffix), and each replay no longer than
///    `max_unacked` (after an interruption only the unacknowledged events,
///    at most `max_unacked` of them, may run again);
/// 3. no two windows of different events of one key overlap in time, except
///    when one of them is a stalled owner finishing the event it had in
///    flight (see [`overlap_allowed`]);
/// 4. fence tokens: a generation of a key is only ever seen by one process,
///    and no window starts at a generation older than that of a window
///    started before it (a stale owner never starts an event after a newer
///    owner did).
pub fn check(o: &Observed<'_>) -> Verdict {
    let mut v = Verdict::default();
    let mut bad_keys = std::collections::BTreeSet::new();

    // (1) completeness.
    for (key, ids) in o.committed {
        let windows = o.windows.get(key).map(Vec::as_slice).unwrap_or_default();
        let missing: Vec<&String> = ids
            .iter()
            .filter(|id| {
                !windows
                    .iter()
                    .any(|w| &w.event == *id && w.end_us != u64::MAX)
            })
            .collect();
        if !missing.is_empty() {
            let entered: Vec<&&String> = missing
                .iter()
                .filter(|id| windows.iter().any(|w| &w.event == **id))
                .collect();
            v.violations.push(format!(
                "(1) key {key}: {} committed event(s) never handled to completion: {} (of them entered but never exited: {})",
                missing.len(),
                short_list(&missing),
                short_list(&entered)
            ));
            bad_keys.insert(key.clone());
        }
    }

    // (2) order and the re-run bound.
    let seen: BTreeMap<String, Vec<String>> = o
        .windows
        .iter()
        .map(|(k, ws)| (k.clone(), ws.iter().map(|w| w.event.clone()).collect()))
        .collect();
    let keys = o.committed.len().max(seen.len()).max(1);
    let max_total = o.max_unacked * keys * o.incidents.max(1);
    match check_order(o.committed, &seen, max_total) {
        Ok(report) => v.reruns = report.total_reruns,
        Err(violation) => {
            v.reruns = violation.report.total_reruns;
            for p in &violation.problems {
                v.violations.push(format!("(2) {p}"));
            }
            for (k, _) in violation.report.keys.iter().filter(|(k, _)| {
                violation
                    .problems
                    .iter()
                    .any(|p| p.to_string().contains(&format!("key `{k}`")))
            }) {
                bad_keys.insert(k.clone());
            }
        }
    }
    v.handled = seen.values().map(Vec::len).sum();
    for (key, ids) in &seen {
        let published = o.committed.get(key).map(Vec::as_slice).unwrap_or_default();
        for r in replays(published, ids) {
            if r.len > o.max_unacked {
                v.violations.push(format!(
                    "(2) key {key}: one redelivery re-ran {} events in a row ({} .. {}), more than max_unacked = {} allows (an event re-ran after its acknowledgement was confirmed)",
                    r.len,
                    published[r.from],
                    published[r.from + r.len - 1],
                    o.max_unacked
                ));
                bad_keys.insert(key.clone());
            }
        }
    }

    // (3) no overlap of different events of one key.
    for (key, windows) in o.windows {
        for (i, a) in windows.iter().enumerate() {
            for b in &windows[i + 1..] {
                if a.event == b.event {
                    continue;
                }
                let (a_end, b_end) = (end_of(a, o.kills), end_of(b, o.kills));
                if !(a.start_us < b_end && b.start_us < a_end) {
                    continue;
                }
                if overlap_allowed(a, b, o.stalls) || overlap_allowed(b, a, o.stalls) {
                    continue;
                }
                v.violations.push(format!(
                    "(3) key {key}: {} was in {} [{} .. {}] while {} was in {} [{} .. {}] (µs of the record clock; no stall explains it)",
                    a.instance,
                    a.event,
                    a.start_us,
                    show_end(a_end),
                    b.instance,
                    b.event,
                    b.start_us,
                    show_end(b_end)
                ));
                bad_keys.insert(key.clone());
            }
        }
    }
    // (4) fence generations.
    for (key, windows) in o.windows {
        let mut by_start: Vec<&Window> = windows.iter().collect();
        by_start.sort_by_key(|w| w.start_us);
        let mut holder: HashMap<u64, (usize, &Window)> = HashMap::new();
        let mut newest: Option<(u64, &Window)> = None;
        let mut found = 0;
        for w in by_start {
            let (Some(proc), Some(generation)) =
                (label_proc(&w.instance), label_generation(&w.instance))
            else {
                v.violations.push(format!(
                    "(4) key {key}: window label `{}` has no process or generation",
                    w.instance
                ));
                continue;
            };
            let mut problem = None;
            match holder.get(&generation) {
                Some((p, first)) if *p != proc => {
                    problem = Some(format!(
                        "(4) key {key}: generation {generation} was used by two processes: {} in {} and {} in {}",
                        first.instance, first.event, w.instance, w.event
                    ));
                }
                Some(_) => {}
                None => {
                    holder.insert(generation, (proc, w));
                }
            }
            match newest {
                Some((g, n)) if generation < g => {
                    problem = problem.or(Some(format!(
                        "(4) key {key}: {} started {} at generation {generation} after {} had started {} at the newer generation {g}",
                        w.instance, w.event, n.instance, n.event
                    )));
                }
                Some((g, _)) if generation == g => {}
                _ => newest = Some((generation, w)),
            }
            if let Some(p) = problem {
                found += 1;
                // The first few say it; the rest follow from them.
                if found <= 3 {
                    v.violations.push(p);
                }
                bad_keys.insert(key.clone());
            }
        }
    }
    v.keys = bad_keys.into_iter().collect();
    v
}

/// The overlap of `stalled` and `other` (windows of different events of one
/// key) is the one the promise allows: `stalled`'s process was stopped
/// (`SIGSTOP`) while `stalled` was open (it had entered before it was
/// resumed and exited after it was stopped), and `other` entered after that
/// stop. That is a stalled owner finishing the one event it already had in
/// flight while the new owner, which took the lease after it lapsed, goes
/// on; convoy cannot prevent it (only fencing the handler's own writes
/// makes it harmless, design §10). Any other overlap is a violation,
/// including one where the stalled owner *starts* an event after it was
/// resumed, and any overlap of two windows of one process.
pub fn overlap_allowed(stalled: &Window, other: &Window, stalls: &[StallRecord]) -> bool {
    let Some(proc) = label_proc(&stalled.instance) else {
        return false;
    };
    if label_proc(&other.instance) == Some(proc) {
        return false;
    }
    stalls.iter().any(|s| {
        s.proc == proc
            && stalled.start_us < s.to_us
            && stalled.end_us > s.from_us
            && other.start_us > s.from_us
    })
}

/// A window's end; a window left open by a killed process ends when the
/// process was gone.
fn end_of(w: &Window, kills: &HashMap<usize, u64>) -> u64 {
    if w.end_us != u64::MAX {
        return w.end_us;
    }
    label_proc(&w.instance)
        .and_then(|p| kills.get(&p).copied())
        .unwrap_or(u64::MAX)
}

fn show_end(end: u64) -> String {
    if end == u64::MAX {
        "never exited".to_owned()
    } else {
        end.to_string()
    }
}

fn short_list<T: fmt::Display>(items: &[T]) -> String {
    if items.is_empty() {
        return "none".to_owned();
    }
    let mut s: Vec<String> = items.iter().take(8).map(ToString::to_string).collect();
    if items.len() > 8 {
        s.push(format!("… ({} more)", items.len() - 8));
    }
    s.join(", ")
}

/// A redelivered run: re-ran `len` events from publication index `from`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Replay {
    pub from: usize,
    pub len: usize,
}

/// The redelivered runs in a key's enter order (`seen`), as [`check_order`]
/// counts re-runs: going back to an event already handled starts a replay,
/// re-running the next one continues it. Ids not published are ignored
/// (check_order reports them).
pub fn replays(published: &[String], seen: &[String]) -> Vec<Replay> {
    let index: HashMap<&str, usize> = published
        .iter()
        .enumerate()
        .map(|(i, id)| (id.as_str(), i))
        .collect();
    let mut out: Vec<Replay> = Vec::new();
    let mut next_new = 0;
    // The index the current replay must re-run next.
    let mut cont: Option<usize> = None;
    for id in seen {
        let Some(&i) = index.get(id.as_str()) else {
            continue;
        };
        if i < next_new {
            match (cont, out.last_mut()) {
                (Some(n), Some(r)) if n == i => r.len += 1,
                _ => out.push(Replay { from: i, len: 1 }),
            }
            cont = (i + 1 < next_new).then_some(i + 1);
        } else {
            cont = None;
            next_new = next_new.max(i + 1);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(start: u64, end: u64, event: &str, instance: &str) -> Window {
        Window {
            start_us: start,
            end_us: end,
            event: event.to_owned(),
            instance: instance.to_owned(),
        }
    }

    fn ids(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    fn committed() -> BTreeMap<String, Vec<String>> {
        BTreeMap::from([("k".to_owned(), ids(&["a", "b", "c"]))])
    }

    fn run(
        windows: Vec<Window>,
        stalls: &[StallRecord],
        kills: &HashMap<usize, u64>,
        max_unacked: usize,
    ) -> Verdict {
        let committed = committed();
        let windows = BTreeMap::from([("k".to_owned(), windows)]);
        check(&Observed {
            committed: &committed,
            windows: &windows,
            stalls,
            kills,
            max_unacked,
            incidents: 3,
        })
    }

    /// Asserts the verdict found no violation.
    #[track_caller]
    fn assert_passes(v: &Verdict) {
        assert!(v.violations.is_empty(), "{:?}", v.violations);
    }

    /// Asserts a violation starts with `prefix`.
    #[track_caller]
    fn assert_flags(v: &Verdict, prefix: &str) {
        assert!(
            v.violations.iter().any(|l| l.starts_with(prefix)),
            "{:?}",
            v.violations
        );
    }

    fn clean() -> Vec<Window> {
        vec![
            w(10, 20, "a", "e0/p0@1"),
            w(30, 40, "b", "e0/p0@1"),
            w(50, 60, "c", "e0/p0@1"),
        ]
    }

    #[test]
    fn rng_is_deterministic() {
        let a: Vec<u64> = {
            let mut r = Rng::new(7);
            (0..5).map(|_| r.next_u64()).collect()
        };
        let mut r = Rng::new(7);
        assert_eq!(a, (0..5).map(|_| r.next_u64()).collect::<Vec<_>>());
        assert_ne!(Rng::new(8).next_u64(), a[0]);
        let p = PlanParams {
            phase: Duration::from_secs(4),
            engines: 3,
            lease_ttl: Duration::from_millis(1200),
            response_timeout: Duration::from_millis(600),
            proxy: true,
        };
        assert_eq!(plan(&mut Rng::new(3), &p), plan(&mut Rng::new(3), &p));
    }

    #[test]
    fn plan_keeps_one_fault_per_resource_at_a_time() {
        let p = PlanParams {
            phase: Duration::from_secs(4),
            engines: 3,
            lease_ttl: Duration::from_millis(1200),
            response_timeout: Duration::from_millis(600),
            proxy: true,
        };
        for seed in 0..200 {
            let faults = plan(&mut Rng::new(seed), &p);
            assert!(!faults.is_empty(), "seed {seed}");
            for (i, a) in faults.iter().enumerate() {
                for b in &faults[i + 1..] {
                    if a.fault.resource() == b.fault.resource() {
                        assert!(b.at >= a.at + a.fault.span(), "seed {seed}: {a:?} / {b:?}");
                    }
                }
            }
            let t = timeline(&faults);
            assert!(t.windows(2).all(|p| p[0].0 <= p[1].0));
        }
    }

    #[test]
    fn a_clean_run_passes() {
        let v = run(clean(), &[], &HashMap::new(), 1);
        assert_passes(&v);
        assert_eq!((v.handled, v.reruns), (3, 0));
    }

    #[test]
    fn check_1_fails_on_a_dropped_record() {
        let mut windows = clean();
        windows.remove(1);
        let v = run(windows, &[], &HashMap::new(), 1);
        assert_flags(&v, "(1) key k");
        assert_eq!(v.keys, vec!["k".to_owned()]);
    }

    #[test]
    fn check_1_needs_an_exit_not_only_an_enter() {
        let mut windows = clean();
        windows[2].end_us = u64::MAX;
        let kills = HashMap::from([(0, 55)]);
        let v = run(windows, &[], &kills, 1);
        assert!(
            v.violations
                .iter()
                .any(|l| l.starts_with("(1)") && l.contains("entered but never exited: c")),
            "{:?}",
            v.violations
        );
    }

    #[test]
    fn check_2_fails_on_order_and_on_long_redeliveries() {
        let mut swapped = clean();
        swapped[1].event = "c".into();
        swapped[2].event = "b".into();
        let v = run(swapped, &[], &HashMap::new(), 1);
        assert_flags(&v, "(2)");

        // a b c, then b c again: a replay of 2 is fine with max_unacked 5,
        // not with 1.
        let mut replayed = clean();
        replayed.push(w(70, 80, "b", "e1/p1@2"));
        replayed.push(w(90, 100, "c", "e1/p1@2"));
        assert!(
            run(replayed.clone(), &[], &HashMap::new(), 5)
                .violations
                .is_empty()
        );
        let v = run(replayed, &[], &HashMap::new(), 1);
        assert_flags(&v, "(2) key k: one redelivery re-ran 2");
    }

    #[test]
    fn redelivered_runs_are_counted_like_check_order() {
        let p = ids(&["a", "b", "c", "d"]);
        assert_eq!(replays(&p, &ids(&["a", "b", "c", "d"])), vec![]);
        assert_eq!(
            replays(&p, &ids(&["a", "b", "c", "b", "c", "d"])),
            vec![Replay { from: 1, len: 2 }]
        );
        assert_eq!(
            replays(&p, &ids(&["a", "b", "c", "b", "b", "c", "d"])),
            vec![Replay { from: 1, len: 1 }, Replay { from: 1, len: 2 }]
        );
        assert_eq!(
            replays(&p, &ids(&["a", "a", "b", "c", "c", "d"])),
            vec![Replay { from: 0, len: 1 }, Replay { from: 2, len: 1 }]
        );
    }

    #[test]
    fn check_3_fails_on_overlap() {
        let mut windows = clean();
        // e1 entered b while e0 was still in a.
        windows[1] = w(15, 40, "b", "e1/p1@2");
        let v = run(windows, &[], &HashMap::new(), 1);
        assert_flags(&v, "(3) key k");
    }

    #[test]
    fn check_3_allows_only_a_stalled_owner_finishing_its_event() {
        // e0 (process 0) was in a when stopped at 12; e1 took over and
        // handled a again, then b, while e0 was stopped; e0 resumed and
        // left a at 45.
        let windows = vec![
            w(10, 45, "a", "e0/p0@1"),
            w(20, 25, "a", "e1/p1@2"),
            w(30, 40, "b", "e1/p1@2"),
            w(50, 60, "c", "e1/p1@2"),
        ];
        let stall = StallRecord {
            proc: 0,
            from_us: 12,
            to_us: 42,
        };
        let v = run(windows.clone(), &[stall], &HashMap::new(), 1);
        assert_passes(&v);
        // Without the stall the same windows are a violation.
        let v = run(windows.clone(), &[], &HashMap::new(), 1);
        assert_flags(&v, "(3)");
        // A stall of another process does not excuse it.
        let other = StallRecord { proc: 1, ..stall };
        assert!(
            !run(windows.clone(), &[other], &HashMap::new(), 1)
                .violations
                .is_empty()
        );
        // The stalled owner starting an event after it was resumed is not
        // excused.
        let mut late = windows;
        late.push(w(43, 44, "b", "e0/p0@1"));
        let v = run(late, &[stall], &HashMap::new(), 1);
        assert_flags(&v, "(3)");
    }

    #[test]
    fn check_3_ends_a_killed_window_at_the_kill() {
        let windows = vec![
            w(10, u64::MAX, "a", "e0/p0@1"),
            w(30, 40, "a", "e1/p1@2"),
            w(50, 60, "b", "e1/p1@2"),
            w(70, 80, "c", "e1/p1@2"),
        ];
        let kills = HashMap::from([(0, 25)]);
        let v = run(windows.clone(), &[], &kills, 1);
        assert_passes(&v);
        // Killed only after e1 entered b: an overlap.
        let kills = HashMap::from([(0, 55)]);
        let v = run(windows, &[], &kills, 1);
        assert_flags(&v, "(3)");
    }

    #[test]
    fn check_4_fails_on_a_repeated_or_older_generation() {
        let v = run(clean(), &[], &HashMap::new(), 1);
        assert_passes(&v);
        // Another process at generation 1.
        let mut repeated = clean();
        repeated[2] = w(50, 60, "c", "e1/p1@1");
        let v = run(repeated, &[], &HashMap::new(), 1);
        assert_flags(&v, "(4) key k: generation 1 was used by two processes");
        // An older generation starting after a newer one.
        let mut older = clean();
        older[1] = w(30, 40, "b", "e1/p1@2");
        older[2] = w(50, 60, "c", "e0/p0@1");
        let v = run(older, &[], &HashMap::new(), 1);
        assert_flags(&v, "(4) key k: e0/p0@1 started c at generation 1 after");
    }

    #[test]
    fn labels_parse() {
        assert_eq!(label_proc(&label("e0", 12, 7)), Some(12));
        assert_eq!(label_generation(&label("e0", 12, 7)), Some(7));
        assert_eq!(label_proc("e0@7"), None);
    }
}
