//! Idle cost: one engine owning P drained partitions, for P from 100 up to
//! 1,000,000. Redis commands per second and Redis CPU per heartbeat (which
//! should not grow with P), how fast one new event on an idle partition is
//! picked up, how long the engine takes to own and drain every partition,
//! Redis bytes per partition (pending and drained, with a per-key
//! breakdown from `MEMORY USAGE`) and the engine's bytes per owned unit.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use convoy_runtime::Config;
use convoy_runtime::redis::keys;
use redis::aio::MultiplexedConnection;
use tokio_util::sync::CancellationToken;

use super::{Env, progress};
use crate::baseline;
use crate::harness::{self, Tuning};
use crate::heap::{self, Heap};
use crate::model::{self, CATEGORY, ProbeState, Tick, key_name};
use crate::report::{Cell, Row, Section, Table, format_num};
use crate::stats::{self, CommandStats, CpuMark, CpuUse, Percentiles, RequestCounter};

/// Options of the idle scenario.
#[derive(clap::Args, Debug, Clone)]
pub struct IdleArgs {
    /// Idle partition counts P to run (comma separated; the smallest is the
    /// reference the others are compared with). 1000000 takes minutes and
    /// several GiB of memory.
    #[arg(long, value_delimiter = ',', default_values_t = [100usize, 10_000, 100_000])]
    pub partitions: Vec<usize>,
    /// How long the idle engine is measured, in seconds (five heartbeats
    /// at convoy's default lease).
    #[arg(long, default_value_t = 15)]
    pub idle_secs: u64,
    /// New events published one at a time on idle partitions afterwards.
    #[arg(long, default_value_t = 10)]
    pub pickups: usize,
    /// Seconds between the last partition drained and the idle window (the
    /// drain's trims free memory that Redis's allocator hands back to the
    /// system over about ten seconds, with CPU of its own).
    #[arg(long, default_value_t = 15)]
    pub settle_secs: u64,
    /// Partitions whose keys are measured one by one with `MEMORY USAGE`.
    #[arg(long, default_value_t = 200)]
    pub memory_samples: usize,
}

/// What one side measured while idle.
struct Side {
    stats: CommandStats,
    /// Commands clients sent over the window (MONITOR), by name.
    requests: BTreeMap<String, u64>,
    seconds: f64,
    cpu: CpuUse,
    pickup: Percentiles,
}

impl Side {
    fn calls_per_s(&self) -> f64 {
        self.stats.total_calls() as f64 / self.seconds
    }

    fn requests_per_s(&self) -> f64 {
        self.requests.values().sum::<u64>() as f64 / self.seconds
    }

    /// Heartbeats in the window: the `ZADD`s clients sent (one per
    /// heartbeat renews the instance in `convoy:instances:{group}`; no
    /// other idle command is a ZADD), else the window over the interval.
    fn heartbeats(&self, interval_s: f64) -> f64 {
        match self.requests.get("zadd") {
            Some(&n) if n > 0 => n as f64,
            _ => self.seconds / interval_s,
        }
    }

    /// Redis CPU (`used_cpu_user + used_cpu_sys`) per heartbeat, in ms.
    fn cpu_ms_per(&self, beats: f64) -> f64 {
        self.cpu.redis * self.seconds * 1000.0 / beats.max(1e-9)
    }

    /// Server time of the commands (commandstats usec, scripts left out so
    /// that the commands they call count once) per heartbeat, in µs.
    fn command_us_per(&self, beats: f64) -> f64 {
        let usec: u64 = self
            .stats
            .0
            .iter()
            .filter(|(name, _)| !stats::is_script(name))
            .map(|(_, c)| c.usec)
            .sum();
        usec as f64 / beats.max(1e-9)
    }
}

/// Bytes of one partition's keys, averaged over the sampled partitions
/// (`MEMORY USAGE`), and the category-wide keys divided by P.
#[derive(Debug, Clone, Default)]
struct KeyBytes {
    /// `{s}bench:{key}`.
    stream: f64,
    /// `{s}bench:{key}:backfill` (absent unless priority lanes are on).
    backfill: f64,
    /// `{s}convoy:unit:{group}:bench:{key}`.
    unit: f64,
    /// `{s}convoy:lease:{group}:bench:{key}`.
    lease: f64,
    /// Every shard's `{s}bench:__partitions__`, divided by P.
    index: f64,
    /// `bench:__wake__` (capped), divided by P.
    wake: f64,
    /// A sampled stream: entries, groups, consumers, pending entries.
    shape: String,
}

impl KeyBytes {
    fn sum(&self) -> f64 {
        self.stream + self.backfill + self.unit + self.lease + self.index + self.wake
    }
}

/// Memory of one state of the P partitions.
#[derive(Debug, Clone)]
struct Memory {
    /// `used_memory` above the empty database, divided by P.
    per_partition: f64,
    keys: KeyBytes,
}

/// What the convoy side of one P measured.
struct ConvoySide {
    idle: Side,
    publish_s: f64,
    drained_s: f64,
    leased: usize,
    pending: Memory,
    drained: Memory,
    /// Drained and idle past the worker's rest delay (consumers deleted).
    rested: Memory,
    repending: Memory,
    heap: Option<Heap>,
    rss: i64,
}

/// Runs the baseline once, then every P.
pub async fn run(env: &mut Env, args: &IdleArgs) -> Result<Section> {
    let mut ps = args.partitions.clone();
    ps.sort_unstable();
    ps.dedup();
    if ps.is_empty() || ps.contains(&0) || args.pickups == 0 {
        bail!("--partitions and --pickups must be above 0");
    }
    let mut section = Section::new("idle");
    let lease = Tuning::defaults();
    let heartbeat_s = lease.heartbeat_s;
    section.param("partitions (P)", format!("{ps:?}"));
    section.param(
        "convoy",
        format!(
            "1 engine owning P partitions ({} shards), each drained (its one event handled), {}; measured for {} s, from {} s after the last partition drained",
            harness::shards(),
            lease.describe_lease(),
            args.idle_secs,
            args.settle_secs + 2
        ),
    );
    section.param(
        "creating P partitions",
        "one event per key raised in units of work of 10,000 and published by convoy's outbox processor (batches of up to 2,048 records, one publish script per shard) before the engine starts",
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
    section.param(
        "engine memory",
        match Heap::now() {
            Some(_) => "live heap (counting allocator, feature heap-stats) and RSS of this process, from before the engine starts to every partition owned and drained, divided by P",
            None => "RSS of this process, from before the engine starts to every partition owned and drained, divided by P (build with --features heap-stats for the live heap too)",
        },
    );

    progress("idle", "baseline");
    let b = baseline_side(env, args).await?;
    let b_beats = b.seconds / heartbeat_s;
    let mut reference: Option<(usize, f64, f64, f64)> = None;
    let mut breakdown = Vec::new();
    let mut server_time = Vec::new();
    let mut sent = vec![requests_row("baseline", &b)];
    let mut memory_rows = Vec::new();
    for &p in &ps {
        progress("idle", format!("P={p}: baseline memory"));
        let b_bytes = baseline_bytes_per_event(env, p.min(100_000)).await?;
        progress("idle", format!("P={p}: convoy"));
        let c = convoy_side(env, args, p, lease).await?;
        let beats = c.idle.heartbeats(heartbeat_s);
        let calls = c.idle.calls_per_s();
        let cpu_ms = c.idle.cpu_ms_per(beats);
        let cmd_us = c.idle.command_us_per(beats);
        progress(
            "idle",
            format!(
                "P={p}: {calls:.1} calls/s, Redis CPU {cpu_ms:.2} ms and command time {cmd_us:.0} µs per heartbeat, drained in {:.1} s",
                c.drained_s
            ),
        );
        let case = format!("P={p}");
        let (ref_p, ref_calls, ref_cpu, ref_cmd) =
            *reference.get_or_insert((p, calls, cpu_ms, cmd_us));
        sent.push(requests_row(&case, &c.idle));
        server_time.push(
            std::iter::once(case.clone())
                .chain(c.idle.stats.top_usec_per(8, beats))
                .collect(),
        );
        breakdown.push(
            std::iter::once(case.clone())
                .chain(c.idle.stats.top_per(8, c.idle.seconds))
                .collect(),
        );
        let rows = &mut section.rows;
        rows.push(Row::new(&case, "Redis calls/s", calls, b.calls_per_s()));
        rows.push(Row::new(
            &case,
            "requests/s",
            c.idle.requests_per_s(),
            b.requests_per_s(),
        ));
        rows.push(Row::new(
            &case,
            "Redis CPU ms per heartbeat",
            cpu_ms,
            b.cpu_ms_per(b_beats),
        ));
        rows.push(Row::new(
            &case,
            "Redis command µs per heartbeat",
            cmd_us,
            b.command_us_per(b_beats),
        ));
        if p != ref_p {
            let within = format!("<= 2x of P={ref_p}");
            for (metric, now, then) in [
                ("Redis calls/s", calls, ref_calls),
                ("Redis CPU per heartbeat", cpu_ms, ref_cpu),
                ("Redis command time per heartbeat", cmd_us, ref_cmd),
            ] {
                let g = now / then.max(1e-9);
                rows.push(
                    Row::alone(
                        &case,
                        format!("{metric} / P={ref_p}"),
                        Cell::Text(format!("{g:.2}x")),
                    )
                    .target(&within, g <= 2.0),
                );
            }
        }
        rows.push(Row::new(
            &case,
            "Redis CPU %",
            c.idle.cpu.redis * 100.0,
            b.cpu.redis * 100.0,
        ));
        rows.push(Row::new(
            &case,
            "engine CPU %",
            c.idle.cpu.process * 100.0,
            b.cpu.process * 100.0,
        ));
        rows.push(
            Row::new(
                &case,
                "pick-up p50 ms",
                c.idle.pickup.p50_ms,
                b.pickup.p50_ms,
            )
            .target("<= 2 ms", c.idle.pickup.p50_ms <= 2.0),
        );
        rows.push(
            Row::new(
                &case,
                "pick-up max ms",
                c.idle.pickup.max_ms,
                b.pickup.max_ms,
            )
            .target("<= 10 ms", c.idle.pickup.max_ms <= 10.0),
        );
        rows.push(Row::alone(&case, "publish P partitions, s", c.publish_s));
        rows.push(
            Row::alone(&case, "start: all P owned and drained, s", c.drained_s)
                .target(format!("all {p} leased"), c.leased == p),
        );
        rows.push(Row::new(
            &case,
            "Redis B/partition pending (never handled)",
            c.pending.per_partition,
            b_bytes,
        ));
        rows.push(Row::alone(
            &case,
            "Redis B/partition drained, owned",
            c.drained.per_partition,
        ));
        rows.push(Row::alone(
            &case,
            "Redis B/partition drained, owned, idle (rested)",
            c.rested.per_partition,
        ));
        rows.push(Row::alone(
            &case,
            "Redis B/partition pending after a drain (no owner)",
            c.repending.per_partition,
        ));
        if let Some(h) = c.heap {
            rows.push(Row::alone(
                &case,
                "engine heap B/owned unit",
                h.bytes as f64 / p as f64,
            ));
            rows.push(Row::alone(
                &case,
                "engine heap blocks/owned unit",
                h.blocks as f64 / p as f64,
            ));
        }
        rows.push(Row::alone(
            &case,
            "engine RSS B/owned unit",
            c.rss as f64 / p as f64,
        ));
        for (state, m) in [
            ("pending (never handled)", &c.pending),
            ("drained, owned", &c.drained),
            ("drained, idle (rested)", &c.rested),
            ("pending after a drain", &c.repending),
        ] {
            memory_rows.push(memory_row(&case, state, m));
        }
    }
    section.tables.push(Table {
        title: "Redis bytes per partition by key (MEMORY USAGE of each key of the sampled partitions, averaged; index and wake stream: the category's keys divided by P; rest: used_memory/P minus the keys, i.e. the keyspace's hash tables, counters, producer keys and allocator slack)".into(),
        header: [
            "case", "state", "used_memory/P", "stream", "backfill", "unit hash", "lease",
            "index", "wake", "rest", "sampled stream",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
        rows: memory_rows,
    });
    section.tables.push(Table::breakdown(
        "convoy idle: Redis calls per second by command (inside scripts included), most first",
        "case",
        breakdown,
    ));
    section.tables.push(Table::breakdown(
        "convoy idle: Redis server time per heartbeat by command, µs (INFO commandstats usec), most first",
        "case",
        server_time,
    ));
    section.tables.push(Table::breakdown(
        "requests per second by command (MONITOR: what clients sent, scripts' own commands left out), most first",
        "case",
        sent,
    ));
    section.note("Redis calls/s: every command Redis ran over the window (INFO commandstats deltas, commands called inside scripts included, the benchmark's INFO left out); requests/s: what clients sent, counted exactly with MONITOR (script runs count once).");
    section.note(format!("per heartbeat: over the window's heartbeats (the ZADDs the engine sent, one per heartbeat); the baseline's figure is per {heartbeat_s} s, the same interval. Redis CPU: used_cpu_user+sys of redis-server (its cron, and MONITOR feeding the benchmark, included); command time: INFO commandstats usec of the engine's commands."));
    section.note("CPU %: share of one core over the window; engine = this process (it only runs the engine while measuring).");
    section.note("pick-up: from raising one event on an idle partition (convoy: commit and publish through the outbox) or XADD (baseline) to the handler.");
    section.note("start: from starting the engine until every partition's one event was handled (a partition is owned before it is drained, so this bounds the time to own them all); then every lease key is read to check all P are leased to the engine.");
    section.note("Redis B/partition: INFO memory used_memory above the empty database divided by P. pending (never handled): after publishing, before any engine ran; the baseline's figure is one pending event in a plain stream (XADD of the same envelope, at most 100,000 events). drained, owned: every partition's event handled and acknowledged, the engine idle (2 s after the last); idle (rested): the same after the settle time, past the 10 s after which a drained unit's worker deletes its consumer. pending after a drain: the engine stopped (leases released), then one more event published to every partition.");
    section.note("engine B/owned unit: this process's memory with every partition owned and drained, minus before the engine started, divided by P (the benchmark's handler keeps no per-key state in this scenario).");
    Ok(section)
}

/// One row of the memory table.
fn memory_row(case: &str, state: &str, m: &Memory) -> Vec<String> {
    let k = &m.keys;
    let b = |v: f64| format_num(v);
    vec![
        case.to_owned(),
        state.to_owned(),
        b(m.per_partition),
        b(k.stream),
        b(k.backfill),
        b(k.unit),
        b(k.lease),
        b(k.index),
        b(k.wake),
        b(m.per_partition - k.sum()),
        k.shape.clone(),
    ]
}

async fn convoy_side(
    env: &mut Env,
    args: &IdleArgs,
    p: usize,
    lease: Tuning,
) -> Result<ConvoySide> {
    env.reset().await?;
    let empty = stats::used_memory(&mut env.admin).await?;
    let state = ProbeState::counting_only();
    let publisher = harness::publisher(&env.url)?;
    let t = Instant::now();
    let events = model::spread(p, p);
    harness::publish(&publisher, &events).await?;
    drop(events);
    let publish_s = t.elapsed().as_secs_f64();
    let samples = sample_keys(p, args.memory_samples);
    let pending = memory(env, p, empty, &samples).await?;
    progress(
        "idle",
        format!(
            "P={p}: published in {publish_s:.1} s, {:.0} B/partition",
            pending.per_partition
        ),
    );

    let heap_before = Heap::now();
    let rss_before = heap::rss_bytes()?;
    let start = Instant::now();
    let engines = harness::start_engines(&env.url, lease, "e", 1, &state)?;
    let timeout = Duration::from_secs(120 + p as u64 / 500);
    harness::wait_handled(&state, p as u64, timeout, "every partition drained").await?;
    let drained_s = start.elapsed().as_secs_f64();
    let keys: Vec<String> = (0..p).map(key_name).collect();
    let (owners, _) = stats::lease_owners(&mut env.admin, env.group, &keys).await?;
    let leased = owners.values().sum::<usize>();
    drop(keys);
    // Let the last reads, acknowledgements and trims settle.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let heap = heap_before.zip(Heap::now()).map(|(b, a)| a.since(&b));
    let rss = heap::rss_bytes()? as i64 - rss_before as i64;
    let drained = memory(env, p, empty, &samples).await?;
    tokio::time::sleep(Duration::from_secs(args.settle_secs)).await;
    // Past the worker's rest delay (10 s): the consumers of the drained
    // units are gone.
    let rested = memory(env, p, empty, &samples).await?;
    progress(
        "idle",
        format!(
            "P={p}: drained in {drained_s:.1} s, {:.0} B/partition in Redis, engine RSS {:.0} B/unit",
            drained.per_partition,
            rss as f64 / p as f64
        ),
    );

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
    progress("idle", format!("P={p}: stopping the engine"));
    harness::stop_engines(engines).await?;
    let again: Vec<Tick> = (0..p).map(|i| Tick::new(&key_name(i), 2)).collect();
    harness::publish(&publisher, &again).await?;
    drop(again);
    let repending = memory(env, p, empty, &samples).await?;
    Ok(ConvoySide {
        idle: Side {
            stats,
            requests,
            seconds,
            cpu,
            pickup: Percentiles::of_ns(&mut lat),
        },
        publish_s,
        drained_s,
        leased,
        pending,
        drained,
        rested,
        repending,
        heap,
        rss,
    })
}

/// Up to `n` partition keys spread evenly over the P keys.
fn sample_keys(p: usize, n: usize) -> Vec<String> {
    let n = n.clamp(1, p);
    (0..n).map(|j| key_name(j * p / n)).collect()
}

/// `used_memory` above `empty` per partition, and the sampled keys'
/// bytes.
async fn memory(env: &mut Env, p: usize, empty: u64, samples: &[String]) -> Result<Memory> {
    let used = stats::used_memory(&mut env.admin).await?;
    let keys = key_bytes(&mut env.admin, env.group, p, samples).await?;
    Ok(Memory {
        per_partition: (used as f64 - empty as f64) / p as f64,
        keys,
    })
}

async fn key_bytes(
    conn: &mut MultiplexedConnection,
    group: &str,
    p: usize,
    samples: &[String],
) -> Result<KeyBytes> {
    let shards = harness::shards();
    let suffix = Config::default().server.priority_lanes.backfill_suffix;
    let mut out = KeyBytes::default();
    for k in samples {
        let s = keys::shard_of(k, shards);
        out.stream += bytes(conn, &keys::partition_stream(s, CATEGORY, k)).await?;
        out.backfill += bytes(conn, &keys::backfill_stream(s, CATEGORY, k, &suffix)).await?;
        out.unit += bytes(conn, &keys::unit(s, group, CATEGORY, k)).await?;
        out.lease += bytes(conn, &keys::lease(s, group, CATEGORY, k)).await?;
    }
    let n = samples.len().max(1) as f64;
    out.stream /= n;
    out.backfill /= n;
    out.unit /= n;
    out.lease /= n;
    for s in 0..shards {
        out.index += bytes(conn, &keys::partition_index(s, CATEGORY)).await?;
    }
    out.index /= p as f64;
    out.wake = bytes(conn, &keys::wake_stream(CATEGORY)).await? / p as f64;
    if let Some(k) = samples.first() {
        out.shape = stream_shape(
            conn,
            &keys::partition_stream(keys::shard_of(k, shards), CATEGORY, k),
        )
        .await?;
    }
    Ok(out)
}

/// `MEMORY USAGE` of `key`, 0 when it does not exist.
async fn bytes(conn: &mut MultiplexedConnection, key: &str) -> Result<f64> {
    Ok(stats::memory_usage(conn, key).await?.unwrap_or(0) as f64)
}

/// `entries E, groups G, consumers C, pending N` of one stream.
async fn stream_shape(conn: &mut MultiplexedConnection, stream: &str) -> Result<String> {
    let len: u64 = redis::cmd("XLEN").arg(stream).query_async(conn).await?;
    let groups: redis::streams::StreamInfoGroupsReply = match redis::cmd("XINFO")
        .arg("GROUPS")
        .arg(stream)
        .query_async(conn)
        .await
    {
        Ok(g) => g,
        // No such key: nothing was ever published there.
        Err(_) => return Ok(format!("entries {len}, no stream")),
    };
    let consumers: usize = groups.groups.iter().map(|g| g.consumers).sum();
    let pending: usize = groups.groups.iter().map(|g| g.pending).sum();
    Ok(format!(
        "entries {len}, groups {}, consumers {consumers}, pending {pending}",
        groups.groups.len()
    ))
}

/// Redis bytes per pending event in one plain stream: `n` envelopes
/// XADDed to the baseline stream.
async fn baseline_bytes_per_event(env: &mut Env, n: usize) -> Result<f64> {
    env.reset().await?;
    let empty = stats::used_memory(&mut env.admin).await?;
    baseline::prepublish(&mut env.admin, &model::spread(n, n)).await?;
    let used = stats::used_memory(&mut env.admin).await?;
    env.reset().await?;
    Ok((used as f64 - empty as f64) / n as f64)
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
    let consumers =
        baseline::start_consumers(&env.client, "c", 1, Duration::from_secs(1), &state, &stop)
            .await?;
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
    })
}
