//! Latency: a steady light load over a few keys; publish-to-handle
//! percentiles.

use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use tokio_util::sync::CancellationToken;

use super::{Env, progress};
use crate::baseline;
use crate::harness::{self, Tuning};
use crate::model::{ProbeState, Tick, key_name};
use crate::report::{Row, Section, Table};
use crate::stats::{CommandStats, Percentiles};

/// Options of the latency scenario.
#[derive(clap::Args, Debug, Clone)]
pub struct LatencyArgs {
    /// Events per second.
    #[arg(long, default_value_t = 200)]
    pub rate: u64,
    /// Keys the events are spread over (round robin).
    #[arg(long, default_value_t = 64)]
    pub latency_keys: usize,
    /// How long the load runs, in seconds.
    #[arg(long, default_value_t = 10)]
    pub latency_secs: u64,
}

/// What one side measured.
struct Side {
    latency: Percentiles,
    stats: CommandStats,
    seconds: f64,
}

/// Runs the load through convoy, then through the baseline.
pub async fn run(env: &mut Env, args: &LatencyArgs) -> Result<Section> {
    if args.rate == 0 || args.latency_keys == 0 {
        bail!("--rate and --latency-keys must be above 0");
    }
    let mut section = Section::new("latency");
    let lease = Tuning::defaults();
    let total = args.rate * args.latency_secs;
    section.param(
        "load",
        format!(
            "{} events/s over {} keys for {} s ({total} events), one at a time, paced",
            args.rate, args.latency_keys, args.latency_secs
        ),
    );
    section.param(
        "convoy",
        format!(
            "1 engine, {}; a separate publisher domain raises and commits each event (its engine publishes the outbox); partitions are created and owned before measuring",
            lease.describe_lease()
        ),
    );
    section.param(
        "baseline",
        "one XADD per event; 1 consumer on XREADGROUP BLOCK 1000 COUNT 100 + multi-id XACK",
    );
    section.param(
        "clock",
        "a monotonic ns stamp in the payload at raise / XADD time, read in the handler (same process)",
    );

    progress("latency", "convoy");
    let c = convoy_side(env, args, lease).await?;
    progress(
        "latency",
        format!("convoy p50 {:.2} ms; baseline", c.latency.p50_ms),
    );
    let b = baseline_side(env, args).await?;
    progress(
        "latency",
        format!("baseline p50 {:.2} ms", b.latency.p50_ms),
    );

    let case = format!("{} ev/s, {} keys", args.rate, args.latency_keys);
    section.rows.push(
        Row::new(&case, "p50 ms", c.latency.p50_ms, b.latency.p50_ms)
            .target("<= 2 ms", c.latency.p50_ms <= 2.0),
    );
    section.rows.push(
        Row::new(&case, "p99 ms", c.latency.p99_ms, b.latency.p99_ms)
            .target("<= 10 ms", c.latency.p99_ms <= 10.0),
    );
    section.rows.push(Row::new(
        &case,
        "max ms",
        c.latency.max_ms,
        b.latency.max_ms,
    ));
    section.rows.push(Row::new(
        &case,
        "events measured",
        c.latency.count as f64,
        b.latency.count as f64,
    ));
    let per_event = |s: &Side, n: u64| n as f64 / s.latency.count.max(1) as f64;
    section.rows.push(Row::new(
        &case,
        "Redis calls/event",
        per_event(&c, c.stats.total_calls()),
        per_event(&b, b.stats.total_calls()),
    ));
    section.rows.push(Row::new(
        &case,
        "round trips/event",
        per_event(&c, c.stats.round_trips()),
        per_event(&b, b.stats.round_trips()),
    ));
    section.rows.push(Row::new(
        &case,
        "Redis calls/s",
        c.stats.total_calls() as f64 / c.seconds,
        b.stats.total_calls() as f64 / b.seconds,
    ));
    section.tables.push(Table::breakdown(
        "Redis calls per event by command while measuring (publishing included), most first",
        "side",
        vec![
            std::iter::once("convoy".to_owned())
                .chain(c.stats.top_per(8, c.latency.count as f64))
                .collect(),
            std::iter::once("baseline".to_owned())
                .chain(b.stats.top_per(8, b.latency.count as f64))
                .collect(),
        ],
    ));
    section.note("Latency runs from the raise (convoy: raise, commit to the outbox, outbox publish script, wake-up, fenced read) or the XADD (baseline) to the handler's first line.");
    section.note("round trips/event: convoy's script runs (publish, fenced read, fenced ack; the wake-up XREAD is left out), the baseline's commands.");
    section.note("Redis calls include publishing (convoy's publish script writes the entry, the index and the wake-up).");
    Ok(section)
}

async fn convoy_side(env: &mut Env, args: &LatencyArgs, lease: Tuning) -> Result<Side> {
    env.reset().await?;
    let state = ProbeState::new();
    let keys: Vec<String> = (0..args.latency_keys).map(key_name).collect();
    let engines = harness::start_engines(&env.url, lease, "e", 1, &state)?;
    let publisher = harness::publisher(&env.url)?;
    let publisher_engine = publisher.engine().spawn();
    // Warm-up: every partition exists and is owned before measuring.
    for k in &keys {
        harness::commit_one(&publisher, Tick::new(k, 0)).await?;
    }
    harness::wait_handled(
        &state,
        keys.len() as u64,
        Duration::from_secs(60),
        "warm-up",
    )
    .await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    state.take_latencies();
    let before = env.stats().await?;
    let start = Instant::now();
    let total = paced(args, |i| {
        let key = &keys[i % keys.len()];
        let seq = 1 + (i / keys.len()) as u64;
        harness::commit_one(&publisher, Tick::stamped(key, seq))
    })
    .await?;
    harness::wait_handled(
        &state,
        (keys.len() + total) as u64,
        Duration::from_secs(30),
        "the latency load",
    )
    .await?;
    let seconds = start.elapsed().as_secs_f64();
    let stats = env.stats().await?.since(&before);
    let mut lat = state.take_latencies();
    harness::stop_engines(engines).await?;
    publisher_engine
        .shutdown()
        .await
        .map_err(|e| anyhow::anyhow!("publisher shutdown failed: {e}"))?;
    Ok(Side {
        latency: Percentiles::of_ns(&mut lat),
        stats,
        seconds,
    })
}

async fn baseline_side(env: &mut Env, args: &LatencyArgs) -> Result<Side> {
    env.reset().await?;
    let state = ProbeState::new();
    let keys: Vec<String> = (0..args.latency_keys).map(key_name).collect();
    baseline::create_group(&mut env.admin, "$").await?;
    let stop = CancellationToken::new();
    let consumers =
        baseline::start_consumers(&env.client, "c", 1, Duration::from_secs(1), &state, &stop)
            .await?;
    let conn = env
        .client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| anyhow::anyhow!("cannot connect the baseline publisher: {e}"))?;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = env.stats().await?;
    let start = Instant::now();
    let total = paced(args, |i| {
        let key = &keys[i % keys.len()];
        let tick = Tick::stamped(key, (i / keys.len()) as u64);
        let mut conn = conn.clone();
        async move { baseline::publish_one(&mut conn, &tick).await }
    })
    .await?;
    harness::wait_handled(
        &state,
        total as u64,
        Duration::from_secs(30),
        "the baseline load",
    )
    .await?;
    let seconds = start.elapsed().as_secs_f64();
    let stats = env.stats().await?.since(&before);
    stop.cancel();
    baseline::join(consumers).await?;
    let mut lat = state.take_latencies();
    Ok(Side {
        latency: Percentiles::of_ns(&mut lat),
        stats,
        seconds,
    })
}

/// Sends `rate × secs` events, one per tick; returns how many.
async fn paced<F, Fut>(args: &LatencyArgs, mut send: F) -> Result<usize>
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let total = (args.rate * args.latency_secs) as usize;
    let period = Duration::from_secs_f64(1.0 / args.rate as f64);
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    for i in 0..total {
        tick.tick().await;
        send(i).await?;
    }
    Ok(total)
}
