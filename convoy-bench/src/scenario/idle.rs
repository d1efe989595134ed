//! Idle cost: one engine owning P drained partitions; Redis commands per
//! second, CPU, and how fast one new event on an idle partition is picked
//! up.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use tokio_util::sync::CancellationToken;

use super::{Env, progress};
use crate::baseline;
use crate::harness::{self, Tuning};
use crate::model::{self, ProbeState, Tick, key_name};
use crate::report::{Row, Section, Table};
use crate::stats::{self, CommandStats, CpuMark, CpuUse, Percentiles, RequestCounter};

/// Options of the idle scenario.
#[derive(clap::Args, Debug, Clone)]
pub struct IdleArgs {
    /// Idle partition counts P to run (comma separated).
    #[arg(long, value_delimiter = ',', default_values_t = [100usize, 1000, 10000])]
    pub partitions: Vec<usize>,
    /// How long the idle engine is measured, in seconds.
    #[arg(long, default_value_t = 10)]
    pub idle_secs: u64,
    /// New events published one at a time on idle partitions afterwards.
    #[arg(long, default_value_t = 10)]
    pub pickups: usize,
}

/// What one side measured.
struct Side {
    stats: CommandStats,
    /// Commands clients sent over the window (MONITOR), by name.
    requests: BTreeMap<String, u64>,
    seconds: f64,
    cpu: CpuUse,
    pickup: Percentiles,
    startup_s: f64,
}

impl Side {
    fn calls_per_s(&self) -> f64 {
        self.stats.total_calls() as f64 / self.seconds
    }

    fn requests_per_s(&self) -> f64 {
        self.requests.values().sum::<u64>() as f64 / self.seconds
    }
}

/// Runs every P, then the baseline once.
pub async fn run(env: &mut Env, args: &IdleArgs) -> Result<Section> {
    if args.partitions.contains(&0) || args.pickups == 0 {
        bail!("--partitions and --pickups must be above 0");
    }
    let mut section = Section::new("idle");
    let lease = Tuning::defaults();
    section.param("partitions (P)", format!("{:?}", args.partitions));
    section.param(
        "convoy",
        format!(
            "1 engine owning P partitions, each drained (one event handled), {}; measured for {} s",
            lease.describe_lease(),
            args.idle_secs
        ),
    );
    section.param(
        "baseline",
        format!(
            "1 consumer blocked on XREADGROUP BLOCK 1000 on one empty stream; measured for {} s",
            args.idle_secs
        ),
    );
    section.param(
        "pick-up",
        format!(
            "{} events, one at a time, each on a different idle partition (convoy) / the stream (baseline), 200 ms apart",
            args.pickups
        ),
    );

    progress("idle", "baseline");
    let b = baseline_side(env, args).await?;
    let mut first: Option<(f64, f64)> = None;
    let mut last = (0.0, 0.0);
    let mut breakdown = Vec::new();
    let mut sent = vec![requests_row("baseline", &b)];
    for &p in &args.partitions {
        progress("idle", format!("P={p}: convoy"));
        let c = convoy_side(env, args, p, lease).await?;
        progress(
            "idle",
            format!(
                "P={p}: {:.0} calls/s, {:.0} requests/s",
                c.calls_per_s(),
                c.requests_per_s()
            ),
        );
        let case = format!("P={p}");
        first.get_or_insert((c.calls_per_s(), c.requests_per_s()));
        last = (c.calls_per_s(), c.requests_per_s());
        sent.push(requests_row(&case, &c));
        breakdown.push(
            std::iter::once(case.clone())
                .chain(c.stats.top_per(8, c.seconds))
                .collect(),
        );
        section.rows.push(Row::new(
            &case,
            "Redis calls/s",
            c.calls_per_s(),
            b.calls_per_s(),
        ));
        section.rows.push(Row::new(
            &case,
            "requests/s",
            c.requests_per_s(),
            b.requests_per_s(),
        ));
        section.rows.push(Row::new(
            &case,
            "Redis CPU %",
            c.cpu.redis * 100.0,
            b.cpu.redis * 100.0,
        ));
        section.rows.push(Row::new(
            &case,
            "engine CPU %",
            c.cpu.process * 100.0,
            b.cpu.process * 100.0,
        ));
        section.rows.push(
            Row::new(&case, "pick-up p50 ms", c.pickup.p50_ms, b.pickup.p50_ms)
                .target("<= 2 ms", c.pickup.p50_ms <= 2.0),
        );
        section.rows.push(
            Row::new(&case, "pick-up max ms", c.pickup.max_ms, b.pickup.max_ms)
                .target("<= 10 ms", c.pickup.max_ms <= 10.0),
        );
        section
            .rows
            .push(Row::alone(&case, "start: all P handled, s", c.startup_s));
    }
    if let (Some(f), [lo, .., hi]) = (first, args.partitions.as_slice()) {
        let growth = |now: f64, then: f64| now / then.max(1e-9);
        let calls = growth(last.0, f.0);
        let requests = growth(last.1, f.1);
        for (metric, g) in [
            ("Redis calls/s growth", calls),
            ("requests/s growth", requests),
        ] {
            section.rows.push(
                Row::alone(format!("P={lo} -> P={hi}"), metric, format!("{g:.1}x"))
                    .target("roughly flat (<= 2x)", g <= 2.0),
            );
        }
    }
    section.tables.push(Table::breakdown(
        "convoy idle: Redis calls per second by command (inside scripts included), most first",
        "case",
        breakdown,
    ));
    section.tables.push(Table::breakdown(
        "requests per second by command (MONITOR: what clients sent, scripts' own commands left out), most first",
        "case",
        sent,
    ));
    section.note("Redis calls/s: every command Redis ran over the window (INFO commandstats deltas, commands called inside scripts included, the benchmark's INFO left out); requests/s: what clients sent, counted exactly with MONITOR (script runs count once).");
    section.note("CPU %: share of one core over the window; engine = this process (it only runs the engine while measuring).");
    section.note("pick-up: from raising one event on an idle partition (convoy: commit and publish through the outbox) or XADD (baseline) to the handler.");
    Ok(section)
}

async fn convoy_side(env: &mut Env, args: &IdleArgs, p: usize, lease: Tuning) -> Result<Side> {
    env.reset().await?;
    let state = ProbeState::new();
    let publisher = harness::publisher(&env.url)?;
    harness::publish(&publisher, &model::spread(p, p)).await?;
    let start = Instant::now();
    let engines = harness::start_engines(&env.url, lease, "e", 1, &state)?;
    harness::wait_handled(
        &state,
        p as u64,
        Duration::from_secs(300),
        "every partition drained",
    )
    .await?;
    let startup_s = start.elapsed().as_secs_f64();
    let keys: Vec<String> = (0..p).map(key_name).collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (owners, _) = stats::lease_owners(&mut env.admin, env.group, &keys).await?;
        if owners.values().sum::<usize>() == p {
            break;
        }
        if Instant::now() >= deadline {
            bail!("the engine did not own all {p} partitions within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Let the last reads and acks settle.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (stats, requests, cpu, seconds) = window(env, args.idle_secs).await?;
    let mut lat = Vec::new();
    for j in 0..args.pickups {
        let key = key_name(j * p / args.pickups);
        let n = state.handled();
        state.take_latencies();
        harness::publish(&publisher, &[Tick::stamped(&key, 1)]).await?;
        harness::wait_handled(&state, n + 1, Duration::from_secs(30), "a pick-up").await?;
        lat.extend(state.take_latencies());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    harness::stop_engines(engines).await?;
    Ok(Side {
        stats,
        requests,
        seconds,
        cpu,
        pickup: Percentiles::of_ns(&mut lat),
        startup_s,
    })
}

/// `case`, then the most sent commands with their rate.
fn requests_row(case: &str, side: &Side) -> Vec<String> {
    let mut v: Vec<(&String, &u64)> = side.requests.iter().collect();
    v.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    std::iter::once(case.to_owned())
        .chain(
            v.into_iter()
                .take(8)
                .map(|(name, n)| format!("{name} {}", stats::per_unit(*n as f64 / side.seconds))),
        )
        .collect()
}

/// Measures an idle window: counters, exact requests, CPU, seconds.
async fn window(
    env: &mut Env,
    secs: u64,
) -> Result<(CommandStats, BTreeMap<String, u64>, CpuUse, f64)> {
    let monitor = RequestCounter::start(&env.client).await?;
    let before = env.stats().await?;
    let cpu = CpuMark::now(&mut env.admin).await?;
    let t = Instant::now();
    tokio::time::sleep(Duration::from_secs(secs)).await;
    let cpu = cpu.since(&mut env.admin).await?;
    let stats = env.stats().await?.since(&before);
    let seconds = t.elapsed().as_secs_f64();
    let requests = monitor.finish().await?;
    Ok((stats, requests, cpu, seconds))
}

async fn baseline_side(env: &mut Env, args: &IdleArgs) -> Result<Side> {
    env.reset().await?;
    let state = ProbeState::new();
    baseline::create_group(&mut env.admin, "$").await?;
    let stop = CancellationToken::new();
    let start = Instant::now();
    let consumers =
        baseline::start_consumers(&env.client, "c", 1, Duration::from_secs(1), &state, &stop)
            .await?;
    let startup_s = start.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (stats, requests, cpu, seconds) = window(env, args.idle_secs).await?;
    let mut conn = env.admin.clone();
    let mut lat = Vec::new();
    for j in 0..args.pickups {
        let n = state.handled();
        state.take_latencies();
        baseline::publish_one(&mut conn, &Tick::stamped(&key_name(j), 1)).await?;
        harness::wait_handled(&state, n + 1, Duration::from_secs(30), "a baseline pick-up").await?;
        lat.extend(state.take_latencies());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stop.cancel();
    baseline::join(consumers).await?;
    Ok(Side {
        stats,
        requests,
        seconds,
        cpu,
        pickup: Percentiles::of_ns(&mut lat),
        startup_s,
    })
}
