//! Throughput: N pre-published events over K keys, a trivial handler, E
//! engine instances; events/s, Redis commands per event, per-key order.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use super::{Env, progress};
use crate::baseline;
use crate::harness::{self, Tuning};
use crate::model::{self, ProbeState, key_name};
use crate::report::{Cell, Row, Section, Table, case_label};
use crate::stats::{CommandStats, CpuMark, CpuUse};

/// Options of the throughput scenario.
#[derive(clap::Args, Debug, Clone)]
pub struct ThroughputArgs {
    /// Events per case, pre-published before the consumers start.
    #[arg(long, default_value_t = 100_000)]
    pub events: usize,
    /// Key counts K to run (comma separated).
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 64, 1024])]
    pub keys: Vec<usize>,
    /// Engine instance counts E to run (comma separated); the baseline runs
    /// as many consumers.
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 2])]
    pub instances: Vec<usize>,
    /// `max_unacked` values convoy runs with (comma separated): 1 is
    /// convoy's default (ack after each event), larger values acknowledge
    /// that many handled events per fenced call.
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 100])]
    pub max_unacked: Vec<usize>,
    /// Longest one side of one case may run; a side still running then is
    /// stopped and its rate taken from what it handled.
    #[arg(long, default_value_t = 60)]
    pub case_timeout_secs: u64,
    /// Rounds per case: each round runs the baseline and then convoy, and
    /// the case reports the round whose events/s ratio is the median (on a
    /// machine whose speed drifts, a ratio of two runs minutes apart says
    /// little). 1 measures the baseline once for all `max_unacked` values.
    #[arg(long = "throughput-rounds", default_value_t = 1)]
    pub throughput_rounds: usize,
}

/// What one side of one case measured.
#[derive(Debug, Clone, Serialize)]
struct Side {
    handled: u64,
    seconds: f64,
    timed_out: bool,
    publish_seconds: f64,
    publish_calls: u64,
    /// CPU while publishing (the publisher: convoy's outbox processor, or
    /// the baseline's pipelined `XADD`s).
    publish_cpu: CpuUse,
    stats: CommandStatsSummary,
    cpu: CpuUse,
    order: String,
    order_ok: bool,
    longest_pause_ms: f64,
}

#[derive(Debug, Clone, Serialize)]
struct CommandStatsSummary {
    calls: u64,
    scripts: u64,
    round_trips: u64,
    top: Vec<String>,
    top_usec: Vec<String>,
}

impl Side {
    fn rate(&self) -> f64 {
        self.handled as f64 / self.seconds.max(1e-9)
    }

    fn per_event(&self, n: u64) -> f64 {
        n as f64 / (self.handled.max(1) as f64)
    }

    /// CPU (share of a core over the run) as µs per handled event.
    fn cpu_us_per_event(&self, share: f64) -> f64 {
        share * self.seconds * 1e6 / self.handled.max(1) as f64
    }

    /// CPU while publishing (share of a core) as µs per published event.
    fn publish_cpu_us_per_event(&self, share: f64, n: usize) -> f64 {
        share * self.publish_seconds * 1e6 / n.max(1) as f64
    }
}

fn summary(stats: &CommandStats, events: u64) -> CommandStatsSummary {
    CommandStatsSummary {
        calls: stats.total_calls(),
        scripts: stats.script_calls(),
        round_trips: stats.round_trips(),
        top: stats.top_per(8, events.max(1) as f64),
        top_usec: stats.top_usec_per(6, events.max(1) as f64),
    }
}

/// Runs every (K, E) case: the baseline once, convoy once per
/// `max_unacked`.
pub async fn run(env: &mut Env, args: &ThroughputArgs) -> Result<Section> {
    if args.events == 0 || args.keys.contains(&0) || args.instances.contains(&0) {
        bail!("--events, --keys and --instances must be above 0");
    }
    if args.max_unacked.is_empty() || args.max_unacked.contains(&0) {
        bail!("--max-unacked needs values above 0");
    }
    let mut section = Section::new("throughput");
    let base = Tuning::defaults();
    section.param("events per case (N)", args.events);
    section.param("keys (K)", format!("{:?}", args.keys));
    section.param("engine instances (E)", format!("{:?}", args.instances));
    section.param("convoy max_unacked (mu)", format!("{:?}", args.max_unacked));
    section.param(
        "convoy",
        format!(
            "N events spread round robin over K keys, pre-published through the outbox into partition streams; E in-process engines, {}",
            base.describe_lease()
        ),
    );
    section.param(
        "baseline",
        format!(
            "the same envelopes XADDed to one stream; E consumers, XREADGROUP COUNT {} + one multi-id XACK per batch",
            baseline::BATCH
        ),
    );
    section.param(
        "handler",
        "trivial: decode, record the key's last seq, return",
    );
    section.param("case timeout", format!("{} s", args.case_timeout_secs));
    section.param("rounds per case", args.throughput_rounds.max(1));
    let timeout = Duration::from_secs(args.case_timeout_secs);
    let mut breakdown = Vec::new();
    let mut server_time = Vec::new();
    for &k in &args.keys {
        for &e in &args.instances {
            let case = format!("K={k} E={e}");
            // With one round the baseline is measured once for every
            // `max_unacked`; with more, once per round beside convoy.
            let shared = if args.throughput_rounds <= 1 {
                Some(measured_baseline(env, args, &case, k, e, timeout).await?)
            } else {
                None
            };
            for &mu in &args.max_unacked {
                let case = format!("{case} mu={mu}");
                let tuning = base.with_max_unacked(mu);
                let mut rounds = Vec::new();
                for round in 1..=args.throughput_rounds.max(1) {
                    let b = match &shared {
                        Some(b) => b.clone(),
                        None => {
                            let label = format!("{case} round {round}");
                            measured_baseline(env, args, &label, k, e, timeout).await?
                        }
                    };
                    progress("throughput", format!("{case}: convoy"));
                    let c = convoy_side(env, args.events, k, e, tuning, timeout).await?;
                    progress(
                        "throughput",
                        format!("{case}: convoy {:.0} events/s", c.rate()),
                    );
                    rounds.push((c, b));
                }
                let ratios: Vec<f64> = rounds.iter().map(|(c, b)| c.rate() / b.rate()).collect();
                let (c, b) = &rounds[median_index(&ratios)];
                push_rows(
                    &mut section,
                    &case,
                    c,
                    b,
                    args.events,
                    Targets::of(k, e, mu),
                );
                if k == 1 && mu == 1 {
                    let floor = ping_floor(env).await?;
                    section.rows.push(Row::alone(
                        &case,
                        "Redis CPU µs per PING round trip",
                        floor.redis,
                    ));
                    section.rows.push(Row::alone(
                        &case,
                        "consumer CPU µs per PING round trip",
                        floor.process,
                    ));
                }
                if ratios.len() > 1 {
                    let listed: Vec<String> = ratios.iter().map(|r| format!("{r:.2}x")).collect();
                    section.rows.push(Row::alone(
                        &case,
                        "events/s ratio by round",
                        Cell::Text(format!("{} (the median's round above)", listed.join(", "))),
                    ));
                }
                let mut cells = vec![case.clone()];
                cells.extend(c.stats.top.iter().cloned());
                breakdown.push(cells);
                let mut cells = vec![case.clone()];
                cells.extend(c.stats.top_usec.iter().cloned());
                server_time.push(cells);
            }
        }
    }
    section.tables.push(Table::breakdown(
        "convoy: Redis calls per event by command (INFO commandstats, inside scripts included), most first",
        "convoy case",
        breakdown,
    ));
    section.tables.push(Table::breakdown(
        "convoy: Redis server time per event by command, µs (INFO commandstats usec; evalsha includes the commands its scripts called), most first",
        "convoy case",
        server_time,
    ));
    section.note("mu = max_unacked: 1 acknowledges after every event (a crash re-runs at most the event in flight, convoy's default); 100 acknowledges once per fenced read batch (up to 100 events may re-run).");
    section.note("events/s: N divided by the time from starting the consumers to the N-th handled event (startup and lease taking included).");
    section.note("longest pause: the longest time between two consecutive handled events (of any key) during the run; a stall shows here.");
    section.note("Redis calls/event: every command Redis ran (INFO commandstats deltas, commands called inside Lua scripts included) per event; round trips/event: convoy's script runs (each per-event step is one script; the wake-up read and heartbeat commands are left out), the baseline's commands.");
    section.note("Redis CPU / consumer CPU µs/event: used_cpu_user+sys of redis-server, and of this process (engines or baseline consumers), over the run, per event.");
    section.note("publish events/s: convoy's outbox processor (batches of up to 2,048 records, one publish script per shard a batch spans) vs XADDs of the same envelopes, pipelined 1,000 at a time; convoy's includes raising the events in units of work of 10,000 into the in-memory outbox. publish Redis CPU / publisher CPU µs/event: redis-server's and this process's CPU while publishing, per published event.");
    section.note("per-key order: the handler keeps each key's last seq and flags a decrease; the baseline is unordered, its figure shows what happens without convoy.");
    if args.keys.contains(&1) && args.max_unacked.contains(&1) {
        section.note(format!("per PING round trip (K=1 mu=1 only, measured after the case): Redis's and this process's CPU for {PINGS} PINGs sent one at a time from this process's runtime, the floor under anything that waits for one reply per event (a round trip wakes this process's reader on the other core, which costs both sides CPU in the kernel)."));
    }
    Ok(section)
}

/// PINGs [`ping_floor`] sends.
const PINGS: u32 = 5_000;

/// CPU per round trip of one PING at a time, in µs (Redis, this process).
async fn ping_floor(env: &mut Env) -> Result<CpuUse> {
    let mark = CpuMark::now(&mut env.admin).await?;
    let started = Instant::now();
    for _ in 0..PINGS {
        let _: String = redis::cmd("PING").query_async(&mut env.admin).await?;
    }
    let wall = started.elapsed().as_secs_f64();
    let used = mark.since(&mut env.admin).await?;
    let per = |share: f64| share * wall * 1e6 / f64::from(PINGS);
    Ok(CpuUse {
        process: per(used.process),
        redis: per(used.redis),
    })
}

/// The baseline side of a case, with progress lines.
async fn measured_baseline(
    env: &mut Env,
    args: &ThroughputArgs,
    case: &str,
    k: usize,
    e: usize,
    timeout: Duration,
) -> Result<Side> {
    progress("throughput", format!("{case}: baseline"));
    let b = baseline_side(env, args.events, k, e, timeout).await?;
    progress(
        "throughput",
        format!("{case}: baseline {:.0} events/s", b.rate()),
    );
    Ok(b)
}

/// The index of the median of `values` (the lower one of an even count).
fn median_index(values: &[f64]) -> usize {
    let mut order: Vec<usize> = (0..values.len()).collect();
    order.sort_by(|&a, &b| values[a].total_cmp(&values[b]));
    order
        .get(values.len().saturating_sub(1) / 2)
        .copied()
        .unwrap_or(0)
}

/// A target for one figure of a case: a bound on the convoy figure, or on
/// its ratio to the baseline's.
#[derive(Debug, Clone, Copy)]
enum Aim {
    /// The ratio to the baseline is at least this.
    RatioAtLeast(f64),
    /// The ratio to the baseline is at most this.
    RatioAtMost(f64),
    /// The convoy figure is at most this.
    AtMost(f64),
}

impl Aim {
    /// `row` with this target, met or missed (judged on the figure as
    /// shown: rounded to two decimals).
    fn judge(self, row: Row) -> Row {
        let shown = |v: Option<f64>| v.map(|v| (v * 100.0).round() / 100.0);
        let (value, at_least, limit, what) = match self {
            Aim::RatioAtLeast(l) => (row.ratio, true, l, format!(">= {l}x baseline")),
            Aim::RatioAtMost(l) => (row.ratio, false, l, format!("<= {l}x baseline")),
            Aim::AtMost(l) => (row.convoy.number(), false, l, format!("<= {l}")),
        };
        let met = shown(value).is_some_and(|v| if at_least { v >= limit } else { v <= limit });
        row.target(what, met)
    }
}

/// `row` with `aim`'s target when there is one.
fn aimed(row: Row, aim: Option<Aim>) -> Row {
    match aim {
        Some(aim) => aim.judge(row),
        None => row,
    }
}

/// The project's targets for one case (`None`: none for that figure),
/// shown beside the figures as met or missed.
#[derive(Debug, Clone, Copy, Default)]
struct Targets {
    rate: Option<Aim>,
    commands: Option<Aim>,
    round_trips: Option<Aim>,
    redis_cpu: Option<Aim>,
    consumer_cpu: Option<Aim>,
    publish_rate: Option<Aim>,
    publish_calls: Option<Aim>,
}

impl Targets {
    /// The targets of the case with `k` keys, `e` engines and
    /// `max_unacked` `mu`.
    fn of(k: usize, e: usize, mu: usize) -> Self {
        let publish = Targets {
            publish_rate: Some(Aim::RatioAtLeast(0.7)),
            publish_calls: Some(Aim::AtMost(1.1)),
            ..Targets::default()
        };
        let rate = |r| Targets {
            rate: Some(Aim::RatioAtLeast(r)),
            ..publish
        };
        match (k, e, mu) {
            (64, 1, 1) => Targets {
                commands: Some(Aim::AtMost(2.0)),
                redis_cpu: Some(Aim::RatioAtMost(2.5)),
                consumer_cpu: Some(Aim::RatioAtMost(1.5)),
                ..rate(0.7)
            },
            (64, 2, 1) | (1024, 1, 1) => rate(0.6),
            // One script per event; the fenced reads (one per 100
            // entries read ahead) add 0.01.
            (1, 1, 1) => Targets {
                round_trips: Some(Aim::AtMost(1.02)),
                redis_cpu: Some(Aim::AtMost(10.0)),
                ..publish
            },
            (_, _, 100) => rate(0.95),
            _ => publish,
        }
    }
}

fn push_rows(section: &mut Section, case: &str, c: &Side, b: &Side, n: usize, aims: Targets) {
    let label = case_label(
        case,
        [
            ("convoy", c.timed_out, c.handled),
            ("baseline", b.timed_out, b.handled),
        ],
        n,
    );
    let case = label.as_str();
    // Each figure of both sides, and its target.
    type Figure = fn(&Side, usize) -> f64;
    let figures: [(&str, Figure, Option<Aim>); 10] = [
        ("events/s", |s, _| s.rate(), aims.rate),
        ("longest pause ms", |s, _| s.longest_pause_ms, None),
        (
            "Redis calls/event",
            |s, _| s.per_event(s.stats.calls),
            aims.commands,
        ),
        (
            "round trips/event",
            |s, _| s.per_event(s.stats.round_trips),
            aims.round_trips,
        ),
        (
            "Redis CPU µs/event",
            |s, _| s.cpu_us_per_event(s.cpu.redis),
            aims.redis_cpu,
        ),
        (
            "consumer CPU µs/event",
            |s, _| s.cpu_us_per_event(s.cpu.process),
            aims.consumer_cpu,
        ),
        (
            "publish events/s",
            |s, n| n as f64 / s.publish_seconds.max(1e-9),
            aims.publish_rate,
        ),
        (
            "publish Redis calls/event",
            |s, n| s.publish_calls as f64 / n as f64,
            aims.publish_calls,
        ),
        (
            "publish Redis CPU µs/event",
            |s, n| s.publish_cpu_us_per_event(s.publish_cpu.redis, n),
            None,
        ),
        (
            "publisher CPU µs/event",
            |s, n| s.publish_cpu_us_per_event(s.publish_cpu.process, n),
            None,
        ),
    ];
    for (metric, figure, aim) in figures {
        let row = Row::new(case, metric, figure(c, n), figure(b, n));
        section.rows.push(aimed(row, aim));
    }
    section.rows.push(
        Row::new(
            case,
            "per-key order",
            Cell::Text(c.order.clone()),
            Cell::Text(b.order.clone()),
        )
        .target("no key goes backwards", c.order_ok),
    );
}

async fn convoy_side(
    env: &mut Env,
    n: usize,
    k: usize,
    e: usize,
    tuning: Tuning,
    timeout: Duration,
) -> Result<Side> {
    env.reset().await?;
    let state = ProbeState::new();
    let events = model::spread(k, n);
    let publisher = harness::publisher(&env.url)?;
    let published = env.stats().await?;
    let publish_cpu = CpuMark::now(&mut env.admin).await?;
    let t = Instant::now();
    harness::publish(&publisher, &events).await?;
    let publish_seconds = t.elapsed().as_secs_f64();
    let publish_cpu = publish_cpu.since(&mut env.admin).await?;
    let publish_calls = env.stats().await?.since(&published).total_calls();
    drop(events);
    let before = env.stats().await?;
    let cpu = CpuMark::now(&mut env.admin).await?;
    let start = Instant::now();
    let engines = harness::start_engines(&env.url, tuning, "e", e, &state)?;
    let done = harness::wait_for(timeout, Duration::from_millis(1), || {
        state.handled() >= n as u64
    })
    .await;
    let seconds = start.elapsed().as_secs_f64();
    let handled = state.handled();
    let cpu = cpu.since(&mut env.admin).await?;
    let stats = env.stats().await?.since(&before);
    harness::stop_engines(engines).await?;
    let (order, order_ok) = check(&state, k, n);
    let longest_pause_ms = state.longest_pause().as_secs_f64() * 1000.0;
    Ok(Side {
        handled,
        seconds,
        timed_out: !done,
        publish_seconds,
        publish_calls,
        publish_cpu,
        stats: summary(&stats, handled),
        cpu,
        order,
        order_ok,
        longest_pause_ms,
    })
}

async fn baseline_side(
    env: &mut Env,
    n: usize,
    k: usize,
    e: usize,
    timeout: Duration,
) -> Result<Side> {
    env.reset().await?;
    let state = ProbeState::new();
    let events = model::spread(k, n);
    let published = env.stats().await?;
    let publish_cpu = CpuMark::now(&mut env.admin).await?;
    let t = Instant::now();
    baseline::prepublish(&mut env.admin, &events).await?;
    let publish_seconds = t.elapsed().as_secs_f64();
    let publish_cpu = publish_cpu.since(&mut env.admin).await?;
    let publish_calls = env.stats().await?.since(&published).total_calls();
    drop(events);
    baseline::create_group(&mut env.admin, "0").await?;
    let before = env.stats().await?;
    let cpu = CpuMark::now(&mut env.admin).await?;
    let stop = CancellationToken::new();
    let start = Instant::now();
    let consumers = baseline::start_consumers(
        &env.client,
        "c",
        e,
        Duration::from_millis(100),
        &state,
        &stop,
    )
    .await?;
    let done = harness::wait_for(timeout, Duration::from_millis(1), || {
        state.handled() >= n as u64
    })
    .await;
    let seconds = start.elapsed().as_secs_f64();
    let handled = state.handled();
    let cpu = cpu.since(&mut env.admin).await?;
    let stats = env.stats().await?.since(&before);
    stop.cancel();
    baseline::join(consumers).await?;
    let (order, _) = check(&state, k, n);
    let longest_pause_ms = state.longest_pause().as_secs_f64() * 1000.0;
    Ok(Side {
        handled,
        seconds,
        timed_out: !done,
        publish_seconds,
        publish_calls,
        publish_cpu,
        stats: summary(&stats, handled),
        cpu,
        order,
        order_ok: true,
        longest_pause_ms,
    })
}

/// The order verdict, plus completeness: every key reached its last seq.
pub fn check(state: &ProbeState, k: usize, n: usize) -> (String, bool) {
    let order = state.order();
    let mut incomplete = 0;
    for i in 0..k {
        // Key i has events seq 0..count-1 where count = ceil((n - i) / k).
        let count = (n + k - 1 - i) / k;
        if count == 0 {
            continue;
        }
        let last = (count - 1) as u64;
        if state.key(&key_name(i)).is_none_or(|s| s.last_seq != last) {
            incomplete += 1;
        }
    }
    let mut text = order.describe();
    if incomplete > 0 {
        text.push_str(&format!(", {incomplete} keys incomplete"));
    }
    (text, order.decreases == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_are_judged_on_the_figures_as_shown() {
        let rate = |convoy: f64| Row::new("K=64 E=1 mu=1", "events/s", convoy, 100_000.0);
        let aim = Targets::of(64, 1, 1).rate.expect("K=64 has a rate target");
        // 0.6996x is shown as 0.70x, and meets 0.7x; 0.69x does not.
        assert_eq!(aim.judge(rate(69_960.0)).met, Some(true));
        assert_eq!(aim.judge(rate(69_000.0)).met, Some(false));
        let row = aim.judge(rate(80_000.0));
        assert_eq!(row.target.as_deref(), Some(">= 0.7x baseline"));

        let commands = |convoy: f64| Row::new("K=64 E=1 mu=1", "Redis calls/event", convoy, 0.02);
        let most = Targets::of(64, 1, 1).commands.expect("a command budget");
        assert_eq!(most.judge(commands(1.46)).met, Some(true));
        assert_eq!(most.judge(commands(2.1)).met, Some(false));
        assert_eq!(Aim::RatioAtMost(2.5).judge(commands(0.06)).met, Some(false));

        // Only the cases the project aims at have targets.
        assert!(Targets::of(1, 1, 1).rate.is_none());
        assert!(Targets::of(1, 1, 1).round_trips.is_some());
        assert!(Targets::of(64, 2, 100).rate.is_some());
        assert!(Targets::of(7, 1, 5).rate.is_none());
        assert!(Targets::of(7, 1, 5).publish_rate.is_some());
    }
}
