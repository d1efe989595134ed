//! Randomized fault schedules for the PostgreSQL outbox and the
//! exactly-once helper: writers commit events with their own rows, three
//! engine replicas relay the outbox and apply every event's effect once,
//! while a seeded schedule of faults hits the writers, the engines (often
//! the relay leader), PostgreSQL and Redis; then everything is healed,
//! drained and checked from the database alone.
//!
//! Per schedule: a test-kit PostgreSQL (`PgServer`, database `app`) and a
//! `redis-server` with the append-only file (`appendfsync always`). The
//! other processes are this test binary re-executed (`child_process`,
//! selected by `CONVOY_PGF_CHILD`):
//!
//! - three **engines**, each running the PostgreSQL outbox relay (one
//!   leader among them, `[outbox] leader_timeout_ms` 1.5-2.5 s) and
//!   [`Effects`], a `sequential_by` handler that in its own transaction calls
//!   `AppliedEvents::claim` and, for a new event, inserts an `effects` row
//!   (key, n, uuid, instance); a short lease (1.2-2 s) and a 600 ms Redis
//!   response timeout;
//! - two or three **writers** (a domain whose outbox is the `PgOutbox`,
//!   running no relay): in one transaction they bump the `counters` row of
//!   one to three keys (`UPDATE ... SET n = n + 1 RETURNING n`, which
//!   serialises a key's writers, so `n` is the key's commit order), insert
//!   a `committed (key, n, uuid)` row and raise a `Bumped` event carrying
//!   them, `uow.commit_in(&mut tx)`, then commit, or (15%) roll back. Some
//!   writers `kill -9` themselves right after a commit returns.
//!
//! The faults, chosen from the seed only (their timing is the machine's):
//! an engine (the relay leader, found by asking PostgreSQL which backend
//! holds the leader's advisory lock, or a given replica) killed with
//! `kill -9` and restarted under the same or a new instance id, or stopped
//! with `SIGSTOP` past (or within) the lease and `leader_timeout_ms`, then
//! `SIGCONT`; a writer killed or stopped; PostgreSQL fast shutdown,
//! crash (`SIGKILL` to every backend) or freeze, then restart or thaw;
//! Redis `kill -9` (restarted from its append-only file), graceful stop or
//! freeze; and in every schedule **a relay leader change during a Redis
//! outage**: Redis frozen, killed or stopped, then the current leader
//! stopped past `leader_timeout_ms` (another replica takes the leadership
//! while Redis is unreachable), then the old leader resumed and Redis
//! brought back, in either order. After the fault phase (15-18 s for seeds
//! below 1000, 15-40 s above) the writers are killed, every fault ends,
//! and the schedule drains with a deadline.
//!
//! The check reads only the database (records the faults never touch
//! apart from their own transactions): per key, the `effects` rows in the
//! order of their serial id must be exactly `n = 1..N`, `N` the key's
//! counter, each once, each with the uuid `committed` has for that `n` (so
//! nothing of a rolled-back transaction was applied), and nothing may be
//! left pending (status 0) or abandoned in the outbox. The handler also
//! notes the stream entry it ran for, in its effect row and, for a run
//! that `claim` found already applied, in a `reruns` row: a redelivery
//! runs the same entry again, so two entries for one committed event are a
//! **stream duplicate** (the relay wrote the event twice), flagged even
//! when `claim` kept the effects right. A schedule reports its committed
//! transactions, events, faults, duplicates, gaps, reorders, leaks,
//! pending rows, re-runs and stream duplicates; a failure prints the seed, the faults, the
//! replay command and a directory that keeps the children's logs
//! (`{instance}-p{process}.log`), the timeline of the faults
//! (`timeline.txt`, with UTC times as in the logs), the violations and the
//! tails of the servers' logs.
//!
//! The three ways to run it:
//!
//! ```sh
//! # the bounded run, part of `cargo test --workspace --all-features` (6 short schedules):
//! cargo test -p convoy-tests --all-features --test pg_fault_schedules -- bounded_run --nocapture
//! # one seed again (the same faults; the children log to the printed directory):
//! CONVOY_PG_FAULT_SEED=1234 cargo test -p convoy-tests --all-features --test pg_fault_schedules -- replay --nocapture
//! # a long run (CONVOY_PG_FAULT_BASE=n picks the first seed, default: from the clock):
//! CONVOY_PG_FAULT_SCHEDULES=50 cargo test --release -p convoy-tests --all-features --test pg_fault_schedules -- --ignored long_run --nocapture
//! ```
//!
//! `CONVOY_PG_FAULT_LOG` sets the children's `RUST_LOG` (default
//! `convoy_runtime=info`); `CONVOY_PG_FAULT_KEEP=1` keeps the log directory
//! of passing schedules too. A seed gives the same faults as long as
//! `plan` and `Settings::new` are unchanged.

#[path = "support/faults.rs"]
mod faults;
#[path = "support/schedule_dir.rs"]
mod schedule_dir;
#[path = "support/schedule_run.rs"]
mod schedule_run;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::fs::{self, File};
use std::os::unix::process::ExitStatusExt as _;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::str::FromStr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use convoy_runtime::postgres::{Applied, AppliedEvents, PgOutbox};
use convoy_runtime::redis::RedisBroker;
use convoy_runtime::testing::{
    ChildEngine, PgServer, RedisServer, TestingError, current_test_command,
};
use convoy_runtime::{Aggregate, Config, Context, Domain, Event, HandlerError, event_handler};
use faults::Rng;
use schedule_dir::{log_dir, write_file};
use schedule_run::{
    Ran, ScheduleOutcome, bounded_seeds, env_u64, long_seeds, report_tail, write_schedule,
};
use serde::{Deserialize, Serialize};
use sqlx::Connection as _;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions};

/// Engine replicas per schedule.
const ENGINES: usize = 3;
/// The engines' lease heartbeat.
const HEARTBEAT_S: f64 = 0.3;
/// The engines' Redis response timeout.
const RESPONSE_TIMEOUT: Duration = Duration::from_millis(600);
/// Percent of writer transactions rolled back instead of committed.
const ROLLBACK_PERCENT: u64 = 15;
/// Seeds below this run short fault phases (15-18 s), the others 15-40 s.
const SHORT_SEEDS: u64 = 1000;
/// The longest wait for the drain after healing.
const DRAIN: Duration = Duration::from_secs(90);
/// The drain gives up earlier when nothing moves for this long.
const STUCK: Duration = Duration::from_secs(25);
/// How long the drain keeps watching once complete (late duplicates of a
/// stalled owner or relay show up by then).
const SETTLE: Duration = Duration::from_millis(2000);
/// Schedules of the bounded run.
const BOUNDED_SCHEDULES: u64 = 6;
/// The database of a schedule.
const DB: &str = "app";

/// The aggregate whose events the writers raise, partitioned by
/// `account` (declared here, so the writers, which link no handler, route
/// by it too).
#[derive(Aggregate)]
#[aggregate(category = "pgfaulty", partition_key = "account")]
struct Book;

/// One bump of `account`'s counter: its `n`-th committed event, with the
/// uuid of its `committed` row.
#[derive(Event, Serialize, Deserialize, Debug, Clone)]
#[event(part_of = Book)]
struct Bumped {
    account: String,
    n: u64,
    uuid: String,
}

/// The name of key `i`.
fn key_name(i: usize) -> String {
    format!("k{i:02}")
}

// ---------------------------------------------------------------------
// Settings and the plan of faults.
// ---------------------------------------------------------------------

/// What one schedule runs with; all of it follows from the seed.
#[derive(Debug, Clone)]
struct Settings {
    seed: u64,
    keys: usize,
    writers: usize,
    /// How long faults are injected (and writers write).
    phase: Duration,
    lease_ttl_ms: u64,
    leader_timeout_ms: u64,
    /// A writer's pause between transactions, ms, from .. to.
    pause_ms: (u64, u64),
    /// Percent of writer transactions that bump two or three keys.
    multi_key_percent: u64,
    faults: Vec<Planned>,
}

impl Settings {
    /// The settings of `seed`.
    fn new(seed: u64) -> Self {
        let root = Rng::new(seed);
        let mut r = root.fork(1);
        let keys = r.range(6, 12) as usize;
        let writers = r.range(2, 3) as usize;
        let phase_s = if seed < SHORT_SEEDS {
            r.range(15, 18)
        } else {
            r.range(15, 40)
        };
        let lease_ttl_ms = *r.pick(&[1200, 1500, 2000]);
        let leader_timeout_ms = *r.pick(&[1500, 2000, 2500]);
        let pause_ms = *r.pick(&[(30, 100), (50, 150)]);
        let multi_key_percent = *r.pick(&[0, 20, 40]);
        let mut s = Settings {
            seed,
            keys,
            writers,
            phase: Duration::from_secs(phase_s),
            lease_ttl_ms,
            leader_timeout_ms,
            pause_ms,
            multi_key_percent,
            faults: Vec::new(),
        };
        s.faults = plan(&mut root.fork(2), &s);
        s
    }

    /// The faults, one line.
    fn fault_list(&self) -> String {
        let items: Vec<String> = self
            .faults
            .iter()
            .map(|p| format!("@{}ms {}", p.at.as_millis(), p.fault))
            .collect();
        format!("[{}]", items.join("; "))
    }
}

/// Which engine a fault hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    /// Whichever replica leads the relay when the fault starts.
    Leader,
    /// The engine of this slot.
    Slot(usize),
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Leader => write!(f, "the relay leader"),
            Target::Slot(i) => write!(f, "engine slot {i}"),
        }
    }
}

/// How a server goes away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outage {
    /// Graceful: Redis `SIGTERM`, PostgreSQL fast shutdown.
    Stop,
    /// `SIGKILL` (every PostgreSQL backend too).
    Kill,
    /// `SIGSTOP`: connections stay open, nothing is answered.
    Freeze,
}

impl fmt::Display for Outage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Outage::Stop => "stop",
            Outage::Kill => "kill -9",
            Outage::Freeze => "freeze",
        })
    }
}

/// One fault of a schedule (it may expand into several signals).
#[derive(Debug, Clone)]
enum Fault {
    /// `kill -9` an engine; restart it `down` later.
    EngineKill {
        target: Target,
        down: Duration,
        same_id: bool,
    },
    /// `SIGSTOP` an engine, `SIGCONT` it `stall` later.
    EngineStall { target: Target, stall: Duration },
    /// `kill -9` a writer; start it again `down` later.
    WriterKill { writer: usize, down: Duration },
    /// `SIGSTOP` a writer (maybe inside its transaction) for `stall`.
    WriterStall { writer: usize, stall: Duration },
    /// PostgreSQL away for `down`.
    Postgres { outage: Outage, down: Duration },
    /// Redis away for `down`.
    Redis { outage: Outage, down: Duration },
    /// Redis away; `before_stop` later the relay leader stopped for
    /// `stall` (past `leader_timeout_ms`); then the old leader resumed and
    /// Redis back (`leader_first`) or the other way round, `gap` apart.
    LeaderChangeInRedisOutage {
        outage: Outage,
        before_stop: Duration,
        stall: Duration,
        leader_first: bool,
        gap: Duration,
    },
}

/// What a fault occupies while it runs (faults on one resource never
/// overlap).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Resource {
    Engine(usize),
    Writer(usize),
    Postgres,
    Redis,
}

impl Fault {
    /// A short name, for the totals.
    fn kind(&self) -> &'static str {
        match self {
            Fault::EngineKill {
                target: Target::Leader,
                ..
            } => "kill -9 leader",
            Fault::EngineKill { .. } => "kill -9 engine",
            Fault::EngineStall {
                target: Target::Leader,
                ..
            } => "SIGSTOP leader",
            Fault::EngineStall { .. } => "SIGSTOP engine",
            Fault::WriterKill { .. } => "kill -9 writer",
            Fault::WriterStall { .. } => "SIGSTOP writer",
            Fault::Postgres {
                outage: Outage::Stop,
                ..
            } => "postgres stop",
            Fault::Postgres {
                outage: Outage::Kill,
                ..
            } => "postgres crash",
            Fault::Postgres { .. } => "postgres freeze",
            Fault::Redis {
                outage: Outage::Stop,
                ..
            } => "redis stop",
            Fault::Redis {
                outage: Outage::Kill,
                ..
            } => "redis kill -9",
            Fault::Redis { .. } => "redis freeze",
            Fault::LeaderChangeInRedisOutage { .. } => "leader change in redis outage",
        }
    }

    /// How long it lasts from its first signal to its last.
    fn span(&self) -> Duration {
        match self {
            Fault::EngineKill { down, .. }
            | Fault::WriterKill { down, .. }
            | Fault::Postgres { down, .. }
            | Fault::Redis { down, .. } => *down,
            Fault::EngineStall { stall, .. } | Fault::WriterStall { stall, .. } => *stall,
            Fault::LeaderChangeInRedisOutage {
                before_stop,
                stall,
                gap,
                ..
            } => *before_stop + *stall + *gap,
        }
    }

    /// What it occupies.
    fn resources(&self) -> Vec<Resource> {
        let engine = |t: &Target| match t {
            Target::Leader => (0..ENGINES).map(Resource::Engine).collect(),
            Target::Slot(i) => vec![Resource::Engine(*i)],
        };
        match self {
            Fault::EngineKill { target, .. } | Fault::EngineStall { target, .. } => engine(target),
            Fault::WriterKill { writer, .. } | Fault::WriterStall { writer, .. } => {
                vec![Resource::Writer(*writer)]
            }
            Fault::Postgres { .. } => vec![Resource::Postgres],
            Fault::Redis { .. } => vec![Resource::Redis],
            Fault::LeaderChangeInRedisOutage { .. } => {
                let mut r = engine(&Target::Leader);
                r.push(Resource::Redis);
                r
            }
        }
    }

    /// Its signals and commands, relative to its start; `ep` is its index
    /// in the plan (the engine it hits is resolved when it starts).
    fn actions(&self, ep: usize) -> Vec<(Duration, Action)> {
        let z = Duration::ZERO;
        match *self {
            Fault::EngineKill {
                target,
                down,
                same_id,
            } => vec![
                (z, Action::EngineKill { ep, target }),
                (down, Action::EngineRespawn { ep, same_id }),
            ],
            Fault::EngineStall { target, stall } => vec![
                (z, Action::EngineStop { ep, target }),
                (stall, Action::EngineCont { ep }),
            ],
            Fault::WriterKill { writer, down } => vec![
                (z, Action::WriterKill(writer)),
                (down, Action::WriterRespawn(writer)),
            ],
            Fault::WriterStall { writer, stall } => vec![
                (z, Action::WriterStop(writer)),
                (stall, Action::WriterCont(writer)),
            ],
            Fault::Postgres { outage, down } => {
                vec![(z, Action::PgDown(outage)), (down, Action::PgUp)]
            }
            Fault::Redis { outage, down } => {
                vec![(z, Action::RedisDown(outage)), (down, Action::RedisUp)]
            }
            Fault::LeaderChangeInRedisOutage {
                outage,
                before_stop,
                stall,
                leader_first,
                gap,
            } => {
                let cont = Action::EngineCont { ep };
                let (first, second) = if leader_first {
                    (cont, Action::RedisUp)
                } else {
                    (Action::RedisUp, cont)
                };
                let end = before_stop + stall;
                vec![
                    (z, Action::RedisDown(outage)),
                    (
                        before_stop,
                        Action::EngineStop {
                            ep,
                            target: Target::Leader,
                        },
                    ),
                    (end, first),
                    (end + gap, second),
                ]
            }
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = |d: &Duration| d.as_millis();
        match self {
            Fault::EngineKill {
                target,
                down,
                same_id,
            } => write!(
                f,
                "kill -9 {target}, restart {} ms later under {} id",
                ms(down),
                if *same_id { "the same" } else { "a new" }
            ),
            Fault::EngineStall { target, stall } => {
                write!(f, "SIGSTOP {target} for {} ms", ms(stall))
            }
            Fault::WriterKill { writer, down } => {
                write!(f, "kill -9 writer w{writer}, restart {} ms later", ms(down))
            }
            Fault::WriterStall { writer, stall } => {
                write!(f, "SIGSTOP writer w{writer} for {} ms", ms(stall))
            }
            Fault::Postgres { outage, down } => {
                write!(f, "postgres {outage} for {} ms", ms(down))
            }
            Fault::Redis { outage, down } => write!(f, "redis {outage} for {} ms", ms(down)),
            Fault::LeaderChangeInRedisOutage {
                outage,
                before_stop,
                stall,
                leader_first,
                gap,
            } => write!(
                f,
                "redis {outage}; +{} ms SIGSTOP the relay leader for {} ms; then {} and {} ms later {}",
                ms(before_stop),
                ms(stall),
                if *leader_first {
                    "SIGCONT it"
                } else {
                    "redis back"
                },
                ms(gap),
                if *leader_first {
                    "redis back"
                } else {
                    "SIGCONT it"
                },
            ),
        }
    }
}

/// A fault and when it starts (from the start of the fault phase).
#[derive(Debug, Clone)]
struct Planned {
    at: Duration,
    fault: Fault,
}

/// A stall of an engine: past both the lease and `leader_timeout_ms`
/// (mostly), or within both.
fn engine_stall(r: &mut Rng, s: &Settings) -> Duration {
    let past = s.lease_ttl_ms.max(s.leader_timeout_ms);
    let within = s.lease_ttl_ms.min(s.leader_timeout_ms);
    if r.chance(70) {
        r.ms(past + 300, past + 2500)
    } else {
        r.ms(200, within - 300)
    }
}

/// Any fault but the leader change during a Redis outage.
fn random_fault(r: &mut Rng, s: &Settings) -> Fault {
    let slot = |r: &mut Rng| Target::Slot(r.below(ENGINES as u64) as usize);
    let writer = |r: &mut Rng| r.below(s.writers as u64) as usize;
    let outage = |r: &mut Rng| *r.pick(&[Outage::Stop, Outage::Kill, Outage::Freeze]);
    match r.below(20) {
        0..=2 => Fault::EngineKill {
            target: Target::Leader,
            down: r.ms(0, 2500),
            same_id: r.chance(50),
        },
        3..=4 => Fault::EngineKill {
            target: slot(r),
            down: r.ms(0, 2500),
            same_id: r.chance(50),
        },
        5..=7 => Fault::EngineStall {
            target: Target::Leader,
            stall: engine_stall(r, s),
        },
        8..=9 => Fault::EngineStall {
            target: slot(r),
            stall: engine_stall(r, s),
        },
        10..=11 => Fault::WriterKill {
            writer: writer(r),
            down: r.ms(0, 2000),
        },
        12..=13 => Fault::WriterStall {
            writer: writer(r),
            stall: r.ms(300, 3000),
        },
        14..=16 => Fault::Postgres {
            outage: outage(r),
            down: r.ms(500, 4000),
        },
        _ => Fault::Redis {
            outage: outage(r),
            down: r.ms(500, 4000),
        },
    }
}

/// The leader change during a Redis outage (the combination of issue 13's
/// duplicate stream entries).
fn leader_change_in_outage(r: &mut Rng, s: &Settings) -> Fault {
    Fault::LeaderChangeInRedisOutage {
        outage: *r.pick(&[Outage::Freeze, Outage::Freeze, Outage::Kill, Outage::Stop]),
        before_stop: r.ms(200, 1200),
        stall: r.ms(s.leader_timeout_ms + 800, s.leader_timeout_ms + 3000),
        leader_first: r.chance(50),
        gap: r.ms(0, 1500),
    }
}

/// The faults of a schedule: one leader change during a Redis outage (two
/// in phases of 25 s or more) placed first, then random faults, about one
/// per three seconds; faults on one resource never overlap.
fn plan(r: &mut Rng, s: &Settings) -> Vec<Planned> {
    let margin = Duration::from_millis(400);
    let edge = Duration::from_millis(500);
    let combos = 1 + usize::from(s.phase >= Duration::from_secs(25));
    let want = (s.phase.as_secs() / 3) as usize + combos;
    let mut busy: Vec<(Duration, Duration, Vec<Resource>)> = Vec::new();
    let mut out: Vec<Planned> = Vec::new();
    let mut placed_combos = 0;
    for _ in 0..500 {
        if out.len() >= want {
            break;
        }
        let fault = if placed_combos < combos {
            leader_change_in_outage(r, s)
        } else {
            random_fault(r, s)
        };
        let span = fault.span();
        let Some(latest) = s.phase.checked_sub(span + edge) else {
            continue;
        };
        if latest <= edge {
            continue;
        }
        let at = r.ms(edge.as_millis() as u64, latest.as_millis() as u64);
        let res = fault.resources();
        let clash = busy.iter().any(|(from, to, rs)| {
            at < *to + margin && *from < at + span + margin && rs.iter().any(|x| res.contains(x))
        });
        if clash {
            continue;
        }
        if matches!(fault, Fault::LeaderChangeInRedisOutage { .. }) {
            placed_combos += 1;
        }
        busy.push((at, at + span, res));
        out.push(Planned { at, fault });
    }
    out.sort_by_key(|p| p.at);
    out
}

/// One signal or command of a fault.
#[derive(Debug, Clone, Copy)]
enum Action {
    EngineKill { ep: usize, target: Target },
    EngineRespawn { ep: usize, same_id: bool },
    EngineStop { ep: usize, target: Target },
    EngineCont { ep: usize },
    WriterKill(usize),
    WriterRespawn(usize),
    WriterStop(usize),
    WriterCont(usize),
    PgDown(Outage),
    PgUp,
    RedisDown(Outage),
    RedisUp,
}

/// Every fault's actions at their times, in order (the actions of one
/// instant in their fault's order).
fn timeline(plan: &[Planned]) -> Vec<(Duration, Action)> {
    let mut t: Vec<(Duration, Action)> = plan
        .iter()
        .enumerate()
        .flat_map(|(ep, p)| {
            p.fault
                .actions(ep)
                .into_iter()
                .map(move |(d, a)| (p.at + d, a))
        })
        .collect();
    t.sort_by_key(|(at, _)| *at);
    t
}

// ---------------------------------------------------------------------
// The child processes.
// ---------------------------------------------------------------------

/// The configuration of an engine (or a writer: the same outbox).
fn config(redis: &str, db: &str, s: &Settings) -> Config {
    let mut c = Config::default();
    c.broker.url = redis.to_owned();
    let p = &mut c.server.partitioning;
    p.lease_ttl_ms = s.lease_ttl_ms;
    p.heartbeat_interval_seconds = Some(HEARTBEAT_S);
    p.poll_interval_seconds = 0.05;
    // Outages of a few seconds must not halt a partition.
    c.server.retry.max_retries = 1000;
    c.server.retry.initial_backoff_ms = 20;
    c.server.retry.max_backoff_ms = 300;
    c.outbox.postgres_url = Some(db.to_owned());
    c.outbox.retention_seconds = 3600;
    c.outbox.leader_timeout_ms = s.leader_timeout_ms;
    c.outbox.poll_interval_ms = 200;
    // Small publish batches: a backlog goes out as several batches in
    // flight behind one another (the pipelined publish under every
    // fault, a relay handover included).
    c.outbox.batch = 8;
    c
}

/// A pool whose sessions PostgreSQL ends when they stall inside a
/// transaction (a stopped process must not hold row locks for long).
fn pool(db: &str, max: u32) -> PgPool {
    let options = PgConnectOptions::from_str(db)
        .expect("database url")
        .options([("idle_in_transaction_session_timeout", "2000")]);
    PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(Duration::from_secs(3))
        .connect_lazy_with(options)
}

/// The application name of an engine process's PostgreSQL sessions (how
/// the schedule tells which process holds the relay's leader lock).
fn application_name(instance: &str, proc: usize) -> String {
    format!("engine-{instance}-p{proc}")
}

/// Plays the role named by `CONVOY_PGF_CHILD` when re-executed as a child
/// of a schedule (and does nothing in a normal test run):
///
/// - `engine`: an engine with the outbox relay and [`Effects`], until
///   `SIGTERM`;
/// - `writer`: commits (or rolls back) transactions forever, see [`write`];
///   with `CONVOY_PGF_DIE_AFTER=m` it `kill -9`s itself right after its
///   `m`-th commit returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_process() {
    let Ok(role) = std::env::var("CONVOY_PGF_CHILD") else {
        return;
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .try_init();
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"));
    let seed: u64 = var("CONVOY_PGF_SEED").parse().expect("seed");
    let settings = Settings::new(seed);
    let redis = var("CONVOY_PGF_REDIS");
    let db = var("CONVOY_PGF_PG");
    let instance = var("CONVOY_PGF_INSTANCE");
    let proc: usize = var("CONVOY_PGF_PROC").parse().expect("proc");
    match role.as_str() {
        "engine" => {
            let db = format!(
                "{db}?application_name={}",
                application_name(&instance, proc)
            );
            let config = config(&redis, &db, &settings);
            let applied = PgOutbox::from_config(&config.outbox)
                .expect("outbox")
                .applied_events();
            let handler = Effects {
                pool: pool(&db, 4),
                applied,
                label: format!("{instance}/p{proc}"),
            };
            let broker = RedisBroker::from_url(&redis)
                .expect("a redis URL")
                .response_timeout(RESPONSE_TIMEOUT);
            Domain::builder()
                .config(config)
                .broker(broker)
                .instance_id(&instance)
                .handler(handler)
                .init()
                .expect("engine domain")
                .engine()
                .shutdown_timeout(Duration::from_secs(3))
                .run_until(convoy_runtime::shutdown_signal())
                .await
                .expect("engine");
        }
        "writer" => {
            let die_after = std::env::var("CONVOY_PGF_DIE_AFTER")
                .ok()
                .and_then(|v| v.parse().ok());
            // No engine: this domain's outbox is the PgOutbox, and the
            // engines' relays publish what it commits.
            let domain = Domain::builder()
                .config(config(&redis, &db, &settings))
                .instance_id(&instance)
                .init()
                .expect("writer domain");
            write(
                &domain,
                &pool(&db, 1),
                &settings,
                &instance,
                proc,
                die_after,
            )
            .await;
        }
        other => panic!("unknown child role {other:?}"),
    }
}

/// A writer's loop: transactions over random keys, each committed or (at
/// random) rolled back, with a pause in between; errors (PostgreSQL away)
/// are retried. Prints a line per transaction.
async fn write(
    domain: &Domain,
    pool: &PgPool,
    s: &Settings,
    instance: &str,
    proc: usize,
    die_after: Option<u64>,
) {
    let mut rng = Rng::new(s.seed).fork(1000 + proc as u64);
    let mut commits = 0u64;
    loop {
        let count = if rng.chance(s.multi_key_percent) {
            rng.range(2, 3)
        } else {
            1
        };
        let mut keys = BTreeSet::new();
        while (keys.len() as u64) < count.min(s.keys as u64) {
            keys.insert(key_name(rng.below(s.keys as u64) as usize));
        }
        let rollback = rng.chance(ROLLBACK_PERCENT);
        match transaction(domain, pool, &keys, rollback, instance).await {
            Ok(bumped) if rollback => println!("rolled back {bumped}"),
            Ok(bumped) => {
                commits += 1;
                println!("commit #{commits}: {bumped}");
                if die_after == Some(commits) {
                    println!("kill -9 myself right after commit #{commits}");
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::this(),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
            }
            Err(e) => {
                println!("transaction failed: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        tokio::time::sleep(rng.ms(s.pause_ms.0, s.pause_ms.1)).await;
    }
}

/// One writer transaction: for each key (sorted), bump its counter,
/// insert its `committed` row and raise its event; `commit_in`; then
/// commit, or roll back when `rollback`. Returns the `key:n` bumped.
async fn transaction(
    domain: &Domain,
    pool: &PgPool,
    keys: &BTreeSet<String>,
    rollback: bool,
    instance: &str,
) -> Result<String, String> {
    let err = |what: &'static str| move |e: sqlx::Error| format!("{what}: {e}");
    let mut tx = pool.begin().await.map_err(err("begin"))?;
    let mut uow = domain.unit_of_work();
    let mut bumped = Vec::new();
    for key in keys {
        let (n, uuid): (i64, String) = sqlx::query_as(
            "UPDATE counters SET n = n + 1 WHERE key = $1 RETURNING n, gen_random_uuid()::text",
        )
        .bind(key)
        .fetch_one(&mut *tx)
        .await
        .map_err(err("bump"))?;
        sqlx::query("INSERT INTO committed (key, n, uuid, writer) VALUES ($1, $2, $3, $4)")
            .bind(key)
            .bind(n)
            .bind(&uuid)
            .bind(instance)
            .execute(&mut *tx)
            .await
            .map_err(err("committed row"))?;
        uow.raise(Bumped {
            account: key.clone(),
            n: n as u64,
            uuid,
        })
        .map_err(|e| format!("raise: {e}"))?;
        bumped.push(format!("{key}:{n}"));
    }
    uow.commit_in(&mut tx)
        .await
        .map_err(|e| format!("commit_in: {e}"))?;
    if rollback {
        tx.rollback().await.map_err(err("rollback"))?;
    } else {
        tx.commit().await.map_err(err("commit"))?;
    }
    Ok(bumped.join(" "))
}

/// An effect of an event, and a re-run of one: the same row in two
/// tables.
const EFFECT: &str =
    "INSERT INTO effects (key, n, uuid, entry, instance) VALUES ($1, $2, $3, $4, $5)";
const RERUN: &str =
    "INSERT INTO reruns (key, n, uuid, entry, instance) VALUES ($1, $2, $3, $4, $5)";

/// `sql` (an [`EFFECT`] or a [`RERUN`]) of `e`, its stream `entry`, by
/// `instance`.
fn row<'q>(
    sql: &'static str,
    e: &'q Bumped,
    entry: &'q str,
    instance: String,
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    sqlx::query(sql)
        .bind(&e.account)
        .bind(e.n as i64)
        .bind(&e.uuid)
        .bind(entry)
        .bind(instance)
}

/// A `sequential_by` handler whose effect is an `effects` row, written
/// exactly once with [`AppliedEvents`] in the handler's own transaction.
struct Effects {
    pool: PgPool,
    applied: AppliedEvents,
    /// `{instance}/p{process}`.
    label: String,
}

#[event_handler(part_of = Book, sequential_by = "account")]
impl Effects {
    #[handle]
    async fn bumped(&self, e: Bumped, ctx: &Context) -> Result<(), HandlerError> {
        let entry = ctx
            .position()
            .map(|p| p.entry_id.clone())
            .unwrap_or_default();
        let mut tx = self.pool.begin().await?;
        match self.applied.claim(&mut tx, ctx).await {
            Ok(Applied::New) => {}
            Ok(Applied::AlreadyApplied) => {
                // A re-run: its effect is in the database already. Noted
                // with its stream entry (outside the transaction), so the
                // check can tell a redelivery (the same entry) from a
                // second stream entry of the event.
                let _ = tx.rollback().await;
                let instance = self.label.clone();
                row(RERUN, &e, &entry, instance).execute(&self.pool).await?;
                return Ok(());
            }
            Err(err) => {
                let _ = tx.rollback().await;
                return Err(err.into());
            }
        }
        let generation = ctx.fence().map_or(0, |f| f.generation);
        let instance = format!("{}@{generation}", self.label);
        row(EFFECT, &e, &entry, instance).execute(&mut *tx).await?;
        tx.commit().await?;
        Ok(())
    }
}

// ---------------------------------------------------------------------
// The check.
// ---------------------------------------------------------------------

/// One row of `effects` (or of `reruns`).
#[derive(Debug, Clone)]
struct Effect {
    id: i64,
    key: String,
    n: u64,
    uuid: String,
    /// The stream entry the handler ran for.
    entry: String,
}

/// What the database holds after the drain.
#[derive(Debug, Default)]
struct Snapshot {
    /// Per key, its counter (how many of its events committed).
    counters: BTreeMap<String, u64>,
    /// (key, n, uuid) of every committed event.
    committed: Vec<(String, u64, String)>,
    effects: Vec<Effect>,
    /// The handler's runs that `claim` found already applied.
    reruns: Vec<Effect>,
    /// Committed writer transactions.
    transactions: u64,
    /// Outbox rows left pending (status 0) and abandoned (status 2).
    pending: u64,
    abandoned: u64,
}

/// The outcome of [`check`].
#[derive(Debug, Default)]
struct Verdict {
    /// Committed events.
    events: usize,
    /// Effects of committed events (each once).
    applied: usize,
    /// Effects of an `n` applied before.
    duplicates: usize,
    /// Committed events without an effect.
    gaps: usize,
    /// Effects applied after an effect of a later `n` of their key.
    reorders: usize,
    /// Effects of no committed event (a rolled-back transaction's, or a
    /// uuid that does not belong to their `n`).
    leaks: usize,
    /// Handler runs that `claim` found already applied.
    reruns: usize,
    /// Second (third, ...) stream entries of one committed event, seen by
    /// the handler as an effect or as a re-run (a redelivery runs the same
    /// entry again; the relay must never write an event twice).
    stream_duplicates: usize,
    violations: Vec<String>,
}

/// Checks per key that the effects, in serial id order, are exactly
/// `n = 1..N` with the committed uuids (see the module documentation).
fn check(snap: &Snapshot) -> Verdict {
    let mut v = Verdict {
        events: snap.committed.len(),
        ..Verdict::default()
    };
    let mut want: BTreeMap<&str, BTreeMap<u64, &str>> = BTreeMap::new();
    for (key, n, uuid) in &snap.committed {
        if want
            .entry(key)
            .or_default()
            .insert(*n, uuid.as_str())
            .is_some()
        {
            v.violations
                .push(format!("(test) key {key}: two committed rows for n {n}"));
        }
    }
    for (key, count) in &snap.counters {
        let ns: Vec<u64> = want
            .get(key.as_str())
            .map(|m| m.keys().copied().collect())
            .unwrap_or_default();
        if ns != (1..=*count).collect::<Vec<u64>>() {
            v.violations.push(format!(
                "(test) key {key}: its counter is {count} but its committed rows are {} (first {:?})",
                ns.len(),
                &ns[..ns.len().min(10)]
            ));
        }
    }
    let mut effects: Vec<&Effect> = snap.effects.iter().collect();
    effects.sort_by_key(|e| e.id);
    let mut by_key: BTreeMap<&str, Vec<&Effect>> = BTreeMap::new();
    for e in effects {
        by_key.entry(e.key.as_str()).or_default().push(e);
    }
    let keys: BTreeSet<&str> = want.keys().chain(by_key.keys()).copied().collect();
    for key in keys {
        let committed = want.get(key);
        let mut first: BTreeMap<u64, i64> = BTreeMap::new();
        let mut highest: Option<(u64, i64)> = None;
        for e in by_key.get(key).map(Vec::as_slice).unwrap_or_default() {
            let expected = committed.and_then(|c| c.get(&e.n)).copied();
            if expected != Some(e.uuid.as_str()) {
                v.leaks += 1;
                v.violations.push(format!(
                    "leak: key {key}: effect #{} (n {}, uuid {}) is no committed event (the committed uuid of n {} is {})",
                    e.id,
                    e.n,
                    e.uuid,
                    e.n,
                    expected.unwrap_or("none")
                ));
                continue;
            }
            if let Some(before) = first.get(&e.n) {
                v.duplicates += 1;
                v.violations.push(format!(
                    "duplicate: key {key}: n {} applied again by effect #{} (first by #{before})",
                    e.n, e.id
                ));
                continue;
            }
            first.insert(e.n, e.id);
            v.applied += 1;
            match highest {
                Some((h, hid)) if e.n < h => {
                    v.reorders += 1;
                    v.violations.push(format!(
                        "reorder: key {key}: n {} applied by effect #{} after n {h} (effect #{hid})",
                        e.n, e.id
                    ));
                }
                _ => highest = Some((e.n, e.id)),
            }
        }
        let missing: Vec<u64> = committed
            .map(|c| {
                c.keys()
                    .filter(|n| !first.contains_key(n))
                    .copied()
                    .collect()
            })
            .unwrap_or_default();
        if !missing.is_empty() {
            v.gaps += missing.len();
            v.violations.push(format!(
                "gap: key {key}: {} committed event(s) without an effect: n {:?}{}",
                missing.len(),
                &missing[..missing.len().min(20)],
                if missing.len() > 20 { " …" } else { "" }
            ));
        }
    }
    // Per committed event, the distinct stream entries the handler ran it
    // for, applied or recognised as applied.
    v.reruns = snap.reruns.len();
    let mut entries: BTreeMap<(&str, u64, &str), BTreeSet<&str>> = BTreeMap::new();
    for e in snap.effects.iter().chain(&snap.reruns) {
        let known = want
            .get(e.key.as_str())
            .and_then(|c| c.get(&e.n))
            .is_some_and(|u| *u == e.uuid);
        if known {
            entries
                .entry((e.key.as_str(), e.n, e.uuid.as_str()))
                .or_default()
                .insert(e.entry.as_str());
        }
    }
    for ((key, n, _), ids) in &entries {
        if ids.len() > 1 {
            v.stream_duplicates += ids.len() - 1;
            v.violations.push(format!(
                "stream duplicate: key {key}: n {n} reached its stream {} times (entries {ids:?})",
                ids.len()
            ));
        }
    }
    if snap.pending > 0 {
        v.violations.push(format!(
            "pending: {} outbox row(s) still pending after the drain",
            snap.pending
        ));
    }
    if snap.abandoned > 0 {
        v.violations.push(format!(
            "abandoned: {} outbox row(s) abandoned",
            snap.abandoned
        ));
    }
    v
}

/// Reads what [`check`] needs.
async fn snapshot(pool: &PgPool) -> Result<Snapshot, sqlx::Error> {
    let counters: Vec<(String, i64)> = sqlx::query_as("SELECT key, n FROM counters")
        .fetch_all(pool)
        .await?;
    let committed: Vec<(String, i64, String)> =
        sqlx::query_as("SELECT key, n, uuid FROM committed")
            .fetch_all(pool)
            .await?;
    let effect = |(id, key, n, uuid, entry): (i64, String, i64, String, String)| Effect {
        id,
        key,
        n: n.max(0) as u64,
        uuid,
        entry,
    };
    let effects: Vec<(i64, String, i64, String, String)> =
        sqlx::query_as("SELECT id, key, n, uuid, entry FROM effects ORDER BY id")
            .fetch_all(pool)
            .await?;
    let reruns: Vec<(i64, String, i64, String, String)> =
        sqlx::query_as("SELECT id, key, n, uuid, entry FROM reruns ORDER BY id")
            .fetch_all(pool)
            .await?;
    let (transactions, pending, abandoned): (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(DISTINCT tx) FROM committed),
                (SELECT count(*) FROM convoy_outbox WHERE status = 0),
                (SELECT count(*) FROM convoy_outbox WHERE status = 2)",
    )
    .fetch_one(pool)
    .await?;
    Ok(Snapshot {
        counters: counters
            .into_iter()
            .map(|(k, n)| (k, n.max(0) as u64))
            .collect(),
        committed: committed
            .into_iter()
            .map(|(k, n, u)| (k, n.max(0) as u64, u))
            .collect(),
        effects: effects.into_iter().map(effect).collect(),
        reruns: reruns.into_iter().map(effect).collect(),
        transactions: transactions.max(0) as u64,
        pending: pending.max(0) as u64,
        abandoned: abandoned.max(0) as u64,
    })
}

/// Where each committed event without an effect was lost: its outbox row,
/// the handler's runs of it that found it applied, and the entries of its
/// key's streams that carry it, with the streams' consumer groups (read
/// from PostgreSQL and Redis after the drain).
async fn diagnose_gaps(pool: &PgPool, redis_url: &str, snap: &Snapshot) -> String {
    let applied: BTreeSet<(&str, u64)> =
        snap.effects.iter().map(|e| (e.key.as_str(), e.n)).collect();
    let mut redis = match redis::Client::open(redis_url) {
        Ok(c) => c.get_multiplexed_async_connection().await.ok(),
        Err(_) => None,
    };
    let mut out = Vec::new();
    for (key, n, uuid) in &snap.committed {
        if applied.contains(&(key.as_str(), *n)) {
            continue;
        }
        out.push(format!("== key {key} n {n} uuid {uuid}"));
        let rows = sqlx::query_as::<_, (i64, i16, i32, Option<String>)>(
            "SELECT id, status, attempts, published_at::text FROM convoy_outbox
             WHERE envelope LIKE '%' || $1 || '%'",
        )
        .bind(uuid)
        .fetch_all(pool)
        .await;
        out.push(format!(
            "outbox rows (id, status, attempts, published at): {rows:?}"
        ));
        let around = sqlx::query_as::<_, (i64, Option<String>, Option<String>)>(
            "SELECT n, entry, instance FROM effects WHERE key = $1 AND n BETWEEN $2 - 3 AND $2 + 5 ORDER BY id",
        )
        .bind(key)
        .bind(*n as i64)
        .fetch_all(pool)
        .await;
        out.push(format!(
            "the key's effects nearby, in applied order (n, entry, instance): {around:?}"
        ));
        let rows = sqlx::query_as::<_, (i64, i16, Option<String>)>(
            "SELECT id, status, published_at::text FROM convoy_outbox
             WHERE partition_key = convert_to($1, 'UTF8') ORDER BY id",
        )
        .bind(key)
        .fetch_all(pool)
        .await;
        out.push(format!(
            "the key's outbox rows (id, status, published at): {rows:?}"
        ));
        for r in snap.reruns.iter().filter(|r| r.uuid == *uuid) {
            out.push(format!(
                "re-run found applied: entry {} (row #{})",
                r.entry, r.id
            ));
        }
        let Some(conn) = redis.as_mut() else {
            out.push("Redis unreachable".into());
            continue;
        };
        let streams: Vec<String> = redis::cmd("KEYS")
            .arg(format!("*pgfaulty:{key}"))
            .query_async(conn)
            .await
            .unwrap_or_default();
        for stream in streams {
            let entries: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
                .arg(&stream)
                .arg("-")
                .arg("+")
                .query_async(conn)
                .await
                .unwrap_or_default();
            let carrying: Vec<String> = entries
                .ids
                .iter()
                .filter(|e| {
                    e.map.values().any(|v| {
                        redis::from_redis_value::<String>(v.clone())
                            .is_ok_and(|t| t.contains(uuid.as_str()))
                    })
                })
                .map(|e| format!("{} {:?}", e.id, e.get::<String>("origin")))
                .collect();
            let groups: redis::Value = redis::cmd("XINFO")
                .arg("GROUPS")
                .arg(&stream)
                .query_async(conn)
                .await
                .unwrap_or(redis::Value::Nil);
            out.push(format!(
                "stream {stream}: {} entries, carrying it: {carrying:?}; groups: {groups:?}",
                entries.ids.len()
            ));
        }
    }
    out.join("\n")
}

/// (rows pending in the outbox, committed events, committed events with
/// their effect, effect rows).
async fn progress(pool: &PgPool) -> Result<(i64, i64, i64, i64), sqlx::Error> {
    sqlx::query_as(
        "SELECT (SELECT count(*) FROM convoy_outbox WHERE status = 0),
                (SELECT count(*) FROM committed),
                (SELECT count(*) FROM committed c WHERE EXISTS
                    (SELECT 1 FROM effects e WHERE e.key = c.key AND e.n = c.n AND e.uuid = c.uuid)),
                (SELECT count(*) FROM effects)",
    )
    .fetch_one(pool)
    .await
}

// ---------------------------------------------------------------------
// The harness.
// ---------------------------------------------------------------------

/// Whether a server is up, down or frozen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Srv {
    Up,
    Down,
    Frozen,
}

/// A server a schedule takes away and brings back.
trait Faulty {
    fn outage(&mut self, outage: Outage) -> Result<(), TestingError>;
    fn back(&mut self, was: Srv) -> Result<(), TestingError>;
}

macro_rules! faulty {
    ($($server:ty),*) => {$(
        impl Faulty for $server {
            fn outage(&mut self, outage: Outage) -> Result<(), TestingError> {
                match outage {
                    Outage::Stop => self.stop(),
                    Outage::Kill => self.kill(),
                    Outage::Freeze => self.freeze(),
                }
            }

            fn back(&mut self, was: Srv) -> Result<(), TestingError> {
                if was == Srv::Frozen {
                    self.thaw()
                } else {
                    self.restart()
                }
            }
        }
    )*};
}

faulty!(PgServer, RedisServer);

/// A server of the schedule, whether it is up, and how its faults read in
/// the timeline.
struct Faulted<S> {
    server: S,
    state: Srv,
    /// `postgres`, `redis`.
    name: &'static str,
    /// What a stop, a kill and a freeze do to it.
    gone: [&'static str; 3],
    /// What starting it again after a stop or a kill does.
    restarted: &'static str,
}

impl<S: Faulty> Faulted<S> {
    fn new(
        server: S,
        name: &'static str,
        gone: [&'static str; 3],
        restarted: &'static str,
    ) -> Self {
        Faulted {
            server,
            state: Srv::Up,
            name,
            gone,
            restarted,
        }
    }

    /// Takes the server away by `outage` if it is up; the timeline's line.
    fn down(&mut self, outage: Outage) -> Option<String> {
        if self.state != Srv::Up {
            return None;
        }
        let name = self.name;
        self.server
            .outage(outage)
            .unwrap_or_else(|e| panic!("{name} fault: {e:?}"));
        self.state = if outage == Outage::Freeze {
            Srv::Frozen
        } else {
            Srv::Down
        };
        let gone = match outage {
            Outage::Stop => self.gone[0],
            Outage::Kill => self.gone[1],
            Outage::Freeze => self.gone[2],
        };
        Some(format!("{name} {gone}"))
    }

    /// Brings the server back if it is away; the timeline's line.
    fn up(&mut self) -> Option<String> {
        let (was, name) = (self.state, self.name);
        match was {
            Srv::Up => return None,
            Srv::Down => self
                .server
                .back(was)
                .unwrap_or_else(|e| panic!("restart {name}: {e:?}")),
            Srv::Frozen => self
                .server
                .back(was)
                .unwrap_or_else(|e| panic!("thaw {name}: {e:?}")),
        }
        self.state = Srv::Up;
        let back = if was == Srv::Frozen {
            "thawed"
        } else {
            self.restarted
        };
        Some(format!("{name} {back}"))
    }
}

/// One engine or writer slot: the process currently playing it.
struct Slot {
    instance: String,
    proc: usize,
    child: Option<ChildEngine>,
    /// A writer's `CONVOY_PGF_DIE_AFTER`.
    die_after: Option<u64>,
}

impl Slot {
    fn name(&self) -> String {
        format!("{}/p{}", self.instance, self.proc)
    }
}

/// The system under test and its fault injection; owned by the fault
/// thread while the schedule runs.
struct Harness {
    settings: Settings,
    dir: PathBuf,
    rt: tokio::runtime::Handle,
    pg: Faulted<PgServer>,
    redis: Faulted<RedisServer>,
    db_url: String,
    redis_url: String,
    engines: Vec<Slot>,
    writers: Vec<Slot>,
    next_proc: usize,
    next_id: usize,
    /// Fault index -> the engine slot it hit.
    resolved: HashMap<usize, usize>,
    stopped_engines: BTreeSet<usize>,
    stopped_writers: BTreeSet<usize>,
    /// Whether writers are restarted when they exit.
    writing: bool,
    /// t = 0 of the timeline.
    start: Instant,
    log: Vec<String>,
    /// Children that exited unexpectedly.
    problems: Vec<String>,
    /// Writers that killed themselves right after a commit.
    self_kills: usize,
    /// How many leader-targeted faults found the leader in PostgreSQL.
    leader_found: usize,
    leader_guessed: usize,
    rng: Rng,
}

impl Harness {
    /// Starts both servers and the engines.
    fn start(settings: Settings, dir: PathBuf, rt: tokio::runtime::Handle) -> Self {
        let pg = PgServer::start().expect("start PostgreSQL");
        let db_url = pg.create_database(DB).expect("create database");
        let redis = RedisServer::builder()
            .append_only(true)
            .start()
            .expect("system-under-test redis-server");
        let redis_url = redis.url();
        let rng = Rng::new(settings.seed).fork(3);
        let mut h = Harness {
            settings,
            dir,
            rt,
            pg: Faulted::new(
                pg,
                "postgres",
                [
                    "fast shutdown",
                    "crashed (SIGKILL to every backend)",
                    "frozen",
                ],
                "restarted",
            ),
            redis: Faulted::new(
                redis,
                "redis",
                ["stopped", "killed (kill -9)", "frozen"],
                "restarted from its append-only file",
            ),
            db_url,
            redis_url,
            engines: Vec::new(),
            writers: Vec::new(),
            next_proc: 0,
            next_id: ENGINES,
            resolved: HashMap::new(),
            stopped_engines: BTreeSet::new(),
            stopped_writers: BTreeSet::new(),
            writing: false,
            start: Instant::now(),
            log: Vec::new(),
            problems: Vec::new(),
            self_kills: 0,
            leader_found: 0,
            leader_guessed: 0,
            rng,
        };
        h.rt.block_on(prepare(&h.db_url, &h.settings));
        for slot in 0..ENGINES {
            let e = h.spawn_engine(&format!("e{slot}"));
            h.engines.push(e);
        }
        h
    }

    /// Waits (up to 30 s) until a relay leader holds its lock.
    fn wait_for_leader(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Some(app) = self.rt.block_on(leader_application(&self.db_url)) {
                self.note(format!("relay leader at start: {app}"));
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        self.note("no relay leader after 30 s".into());
    }

    /// Starts the writers; the timeline starts now.
    fn start_writers(&mut self) {
        self.start = Instant::now();
        self.writing = true;
        for w in 0..self.settings.writers {
            let s = self.spawn_writer(w);
            self.writers.push(s);
        }
    }

    fn note(&mut self, what: String) {
        let t = self.start.elapsed().as_secs_f64();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let (secs, ms) = (now.as_secs(), now.subsec_millis());
        self.log.push(format!(
            "{t:>7.3}s ({:02}:{:02}:{:02}.{ms:03} UTC) {what}",
            secs / 3600 % 24,
            secs / 60 % 60,
            secs % 60
        ));
    }

    fn command(&mut self, role: &str, instance: &str) -> (Command, usize) {
        let proc = self.next_proc;
        self.next_proc += 1;
        let log = self.dir.join(format!("{instance}-p{proc}.log"));
        let out = File::create(&log).expect("child log file");
        let err = out.try_clone().expect("child log file");
        let mut cmd: Command = current_test_command("child_process").expect("test binary");
        cmd.env("CONVOY_PGF_CHILD", role)
            .env("CONVOY_PGF_SEED", self.settings.seed.to_string())
            .env("CONVOY_PGF_REDIS", &self.redis_url)
            .env("CONVOY_PGF_PG", &self.db_url)
            .env("CONVOY_PGF_INSTANCE", instance)
            .env("CONVOY_PGF_PROC", proc.to_string())
            .env(
                "RUST_LOG",
                std::env::var("CONVOY_PG_FAULT_LOG")
                    .unwrap_or_else(|_| "convoy_runtime=info".into()),
            )
            .env_remove("CONVOY_PG_FAULT_SEED")
            .env_remove("CONVOY_PGF_DIE_AFTER")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        (cmd, proc)
    }

    fn spawn_engine(&mut self, instance: &str) -> Slot {
        let (mut cmd, proc) = self.command("engine", instance);
        let child = ChildEngine::spawn(&mut cmd).expect("spawn an engine");
        self.note(format!(
            "started engine {instance}/p{proc} (pid {})",
            child.pid()
        ));
        Slot {
            instance: instance.to_owned(),
            proc,
            child: Some(child),
            die_after: None,
        }
    }

    fn spawn_writer(&mut self, w: usize) -> Slot {
        let instance = format!("w{w}");
        let (mut cmd, proc) = self.command("writer", &instance);
        let die_after = self.rng.chance(50).then(|| self.rng.range(20, 150));
        if let Some(m) = die_after {
            cmd.env("CONVOY_PGF_DIE_AFTER", m.to_string());
        }
        let child = ChildEngine::spawn(&mut cmd).expect("spawn a writer");
        self.note(format!(
            "started writer {instance}/p{proc} (pid {}){}",
            child.pid(),
            die_after.map_or(String::new(), |m| format!(
                ", kills itself right after commit #{m}"
            ))
        ));
        Slot {
            instance,
            proc,
            child: Some(child),
            die_after,
        }
    }

    /// Runs the timeline, then waits for the end of the fault phase.
    fn run(&mut self, timeline: &[(Duration, Action)]) {
        for (at, action) in timeline {
            self.sleep_until(*at);
            self.apply(action);
        }
        self.sleep_until(self.settings.phase);
    }

    fn sleep_until(&mut self, at: Duration) {
        loop {
            self.watch_children();
            let now = self.start.elapsed();
            if now >= at {
                return;
            }
            std::thread::sleep((at - now).min(Duration::from_millis(100)));
        }
    }

    /// The engine slot of the relay leader: the process whose session
    /// holds the leader lock in PostgreSQL, else (PostgreSQL away) the
    /// engine whose log last says it publishes, else a running one at
    /// random. `None` if no engine runs.
    fn leader(&mut self) -> Option<(usize, &'static str)> {
        let running: Vec<usize> = (0..self.engines.len())
            .filter(|i| self.engines[*i].child.is_some() && !self.stopped_engines.contains(i))
            .collect();
        if self.pg.state == Srv::Up
            && let Some(app) = self.rt.block_on(leader_application(&self.db_url))
            && let Some(&slot) = running.iter().find(|i| {
                let s = &self.engines[**i];
                application_name(&s.instance, s.proc) == app
            })
        {
            self.leader_found += 1;
            return Some((slot, "per PostgreSQL"));
        }
        self.leader_guessed += 1;
        for &i in &running {
            let s = &self.engines[i];
            let text = fs::read_to_string(self.dir.join(format!("{}-p{}.log", s.instance, s.proc)))
                .unwrap_or_default();
            let leads = text.rfind("outbox relay: this instance publishes");
            let gave_up = ["standing by", "cannot reach PostgreSQL"]
                .iter()
                .filter_map(|m| text.rfind(m))
                .max();
            if leads.is_some() && leads > gave_up {
                return Some((i, "per its log"));
            }
        }
        if running.is_empty() {
            return None;
        }
        let i = running[self.rng.below(running.len() as u64) as usize];
        Some((i, "guessed: no leader found"))
    }

    /// Resolves `target` to a running engine slot.
    fn resolve(&mut self, target: Target) -> Option<(usize, &'static str)> {
        match target {
            Target::Leader => self.leader(),
            Target::Slot(i) => Some((i, "as planned")),
        }
    }

    /// Notes who leads now (when PostgreSQL answers).
    fn note_leader(&mut self) {
        if self.pg.state == Srv::Up {
            let app = self.rt.block_on(leader_application(&self.db_url));
            self.note(format!(
                "  relay leader now: {}",
                app.as_deref().unwrap_or("none")
            ));
        }
    }

    fn apply(&mut self, action: &Action) {
        match *action {
            Action::EngineKill { ep, target } => {
                let Some((slot, how)) = self.resolve(target) else {
                    self.note(format!("kill -9 {target}: no engine runs"));
                    return;
                };
                self.resolved.insert(ep, slot);
                if let Some(mut child) = self.engines[slot].child.take() {
                    let _ = child.kill9();
                }
                self.stopped_engines.remove(&slot);
                let name = self.engines[slot].name();
                self.note(format!("kill -9 engine {name} ({target} {how})"));
            }
            Action::EngineRespawn { ep, same_id } => {
                let Some(&slot) = self.resolved.get(&ep) else {
                    return;
                };
                if self.engines[slot].child.is_none() {
                    let instance = if same_id {
                        self.engines[slot].instance.clone()
                    } else {
                        self.next_id += 1;
                        format!("e{}", self.next_id - 1)
                    };
                    self.engines[slot] = self.spawn_engine(&instance);
                    self.note_leader();
                }
            }
            Action::EngineStop { ep, target } => {
                let Some((slot, how)) = self.resolve(target) else {
                    self.note(format!("SIGSTOP {target}: no engine runs"));
                    return;
                };
                self.resolved.insert(ep, slot);
                if let Some(child) = self.engines[slot].child.as_mut()
                    && child.stop().is_ok()
                {
                    self.stopped_engines.insert(slot);
                }
                let name = self.engines[slot].name();
                self.note(format!("SIGSTOP engine {name} ({target} {how})"));
            }
            Action::EngineCont { ep } => {
                if let Some(&slot) = self.resolved.get(&ep) {
                    self.cont_engine(slot);
                    self.note_leader();
                }
            }
            Action::WriterKill(w) => {
                if let Some(mut child) = self.writers[w].child.take() {
                    let _ = child.kill9();
                }
                self.stopped_writers.remove(&w);
                let name = self.writers[w].name();
                self.note(format!("kill -9 writer {name}"));
            }
            Action::WriterRespawn(w) => {
                if self.writers[w].child.is_none() {
                    self.writers[w] = self.spawn_writer(w);
                }
            }
            Action::WriterStop(w) => {
                if let Some(child) = self.writers[w].child.as_mut()
                    && child.stop().is_ok()
                {
                    self.stopped_writers.insert(w);
                }
                let name = self.writers[w].name();
                self.note(format!("SIGSTOP writer {name}"));
            }
            Action::WriterCont(w) => self.cont_writer(w),
            Action::PgDown(outage) => self.server(|h| h.pg.down(outage)),
            Action::PgUp => self.server(|h| h.pg.up()),
            Action::RedisDown(outage) => self.server(|h| h.redis.down(outage)),
            Action::RedisUp => self.server(|h| h.redis.up()),
        }
    }

    fn cont_engine(&mut self, slot: usize) {
        self.cont(false, slot);
    }

    fn cont_writer(&mut self, w: usize) {
        self.cont(true, w);
    }

    /// `SIGCONT` of writer (or engine) `i`, if it is stopped.
    fn cont(&mut self, writer: bool, i: usize) {
        let (slots, stopped, what) = if writer {
            (&mut self.writers, &mut self.stopped_writers, "writer")
        } else {
            (&mut self.engines, &mut self.stopped_engines, "engine")
        };
        if stopped.remove(&i) {
            if let Some(child) = slots[i].child.as_mut() {
                let _ = child.cont();
            }
            let name = slots[i].name();
            self.note(format!("SIGCONT {what} {name}"));
        }
    }

    /// Runs a server's fault or healing, noting what it did, if anything.
    fn server(&mut self, act: impl FnOnce(&mut Self) -> Option<String>) {
        if let Some(line) = act(self) {
            self.note(line);
        }
    }

    /// Notes children that exited, and starts them again: a writer that
    /// killed itself after a commit (as told), or anything else (a
    /// problem).
    fn watch_children(&mut self) {
        let mut gone = Vec::new();
        for (i, s) in self.engines.iter_mut().enumerate() {
            if let Some(child) = s.child.as_mut()
                && let Ok(Some(status)) = child.try_status()
            {
                s.child = None;
                gone.push((true, i, format!("{} exited by itself ({status})", s.name())));
            }
        }
        for (i, s) in self.writers.iter_mut().enumerate() {
            if let Some(child) = s.child.as_mut()
                && let Ok(Some(status)) = child.try_status()
            {
                s.child = None;
                if status.signal() == Some(9) && s.die_after.is_some() {
                    gone.push((
                        false,
                        i,
                        format!(
                            "writer {} killed itself right after commit #{}",
                            s.name(),
                            s.die_after.unwrap_or_default()
                        ),
                    ));
                    self.self_kills += 1;
                } else {
                    gone.push((
                        false,
                        i,
                        format!("writer {} exited by itself ({status})", s.name()),
                    ));
                }
            }
        }
        for (engine, i, what) in gone {
            self.note(what.clone());
            if engine {
                self.problems.push(format!("(engine) {what}"));
                let instance = self.engines[i].instance.clone();
                self.stopped_engines.remove(&i);
                self.engines[i] = self.spawn_engine(&instance);
            } else {
                if !what.contains("killed itself") {
                    self.problems.push(format!("(writer) {what}"));
                }
                self.stopped_writers.remove(&i);
                if self.writing {
                    self.writers[i] = self.spawn_writer(i);
                }
            }
        }
    }

    /// Stops the writers, ends every fault in force and makes sure every
    /// engine runs.
    fn heal(&mut self) {
        self.writing = false;
        self.watch_children();
        for w in 0..self.writers.len() {
            if let Some(mut child) = self.writers[w].child.take() {
                let _ = child.kill9();
            }
        }
        self.stopped_writers.clear();
        self.note("writers killed (end of the fault phase)".into());
        let stopped: Vec<usize> = self.stopped_engines.iter().copied().collect();
        for slot in stopped {
            self.cont_engine(slot);
        }
        self.server(|h| h.pg.up());
        self.server(|h| h.redis.up());
        for slot in 0..self.engines.len() {
            if self.engines[slot].child.is_none() {
                let instance = self.engines[slot].instance.clone();
                self.engines[slot] = self.spawn_engine(&instance);
            }
        }
        self.watch_children();
        self.note("healed".into());
        self.note_leader();
    }
}

/// Creates the test's tables and the outbox's in a fresh database.
async fn prepare(db_url: &str, s: &Settings) {
    let pool = PgPool::connect(db_url).await.expect("connect");
    for sql in [
        "CREATE TABLE counters (key text PRIMARY KEY, n bigint NOT NULL)",
        "CREATE TABLE committed (key text, n bigint, uuid text NOT NULL, writer text,
             tx bigint NOT NULL DEFAULT txid_current(), PRIMARY KEY (key, n))",
        "CREATE TABLE effects (id bigserial PRIMARY KEY, key text, n bigint, uuid text, entry text,
             instance text)",
        "CREATE TABLE reruns (id bigserial PRIMARY KEY, key text, n bigint, uuid text, entry text,
             instance text)",
    ] {
        sqlx::query(sql)
            .execute(&pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
    sqlx::query(
        "INSERT INTO counters SELECT 'k' || lpad(g::text, 2, '0'), 0 FROM generate_series(0, $1 - 1) g",
    )
    .bind(s.keys as i64)
    .execute(&pool)
    .await
    .expect("counters");
    let outbox =
        PgOutbox::from_config(&config("redis://127.0.0.1:1/", db_url, s).outbox).expect("outbox");
    outbox.migrate().await.expect("migrate the outbox");
    pool.close().await;
}

/// The application name of the session holding the relay's leader lock
/// (a session-level advisory lock held by an idle engine session), if
/// PostgreSQL answers within 3 s.
async fn leader_application(db_url: &str) -> Option<String> {
    let ask = async {
        let mut c = PgConnection::connect(db_url).await.ok()?;
        let name: Option<String> = sqlx::query_scalar(
            "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
             WHERE l.locktype = 'advisory' AND l.granted AND a.application_name LIKE 'engine-%'
             ORDER BY (a.xact_start IS NULL) DESC LIMIT 1",
        )
        .fetch_optional(&mut c)
        .await
        .ok()?;
        let _ = c.close().await;
        name
    };
    tokio::time::timeout(Duration::from_secs(3), ask)
        .await
        .ok()
        .flatten()
}

// ---------------------------------------------------------------------
// Running schedules.
// ---------------------------------------------------------------------

/// What one schedule did.
struct Outcome {
    settings: Settings,
    verdict: Verdict,
    transactions: u64,
    pending: u64,
    self_kills: usize,
    leader_found: usize,
    leader_guessed: usize,
    drain: Duration,
    ran: Ran,
}

impl ScheduleOutcome for Outcome {
    fn ran(&self) -> &Ran {
        &self.ran
    }

    fn summary(&self) -> String {
        let v = &self.verdict;
        format!(
            "seed {}: {} s of faults, {} keys, {} writers, lease {} ms, leader_timeout {} ms: {} committed transactions, {} events, {} faults (+{} writer self-kills after a commit; leader found in PostgreSQL {}x, guessed {}x), {} duplicates, {} gaps, {} reorders, {} leaks, {} pending left, {} re-runs recognised by claim, {} stream duplicates, {} violations; drain {:.1} s, {:.1} s in all\n    faults: {}",
            self.settings.seed,
            self.settings.phase.as_secs(),
            self.settings.keys,
            self.settings.writers,
            self.settings.lease_ttl_ms,
            self.settings.leader_timeout_ms,
            self.transactions,
            v.events,
            self.settings.faults.len(),
            self.self_kills,
            self.leader_found,
            self.leader_guessed,
            v.duplicates,
            v.gaps,
            v.reorders,
            v.leaks,
            self.pending,
            v.reruns,
            v.stream_duplicates,
            self.ran.violations.len(),
            self.drain.as_secs_f64(),
            self.ran.elapsed.as_secs_f64(),
            self.settings.fault_list()
        )
    }

    fn report(&self) -> String {
        let head = format!(
            "FAILED schedule seed {}\n  faults: {}\n",
            self.settings.seed,
            self.settings.fault_list()
        );
        head + &report_tail(
            &self.ran,
            "violations.txt",
            "logs and timeline (with the faults' times)",
            &replay_command(self.settings.seed),
        )
    }
}

fn replay_command(seed: u64) -> String {
    format!(
        "CONVOY_PG_FAULT_SEED={seed} cargo test -p convoy-tests --all-features --test pg_fault_schedules -- replay --nocapture"
    )
}

/// Runs one schedule: start, faults, heal, drain, check, teardown.
async fn run_schedule(seed: u64) -> Outcome {
    let started = Instant::now();
    let settings = Settings::new(seed);
    let dir = log_dir("convoy-pg-faults", seed);
    write_schedule(
        &dir,
        &settings,
        &settings.fault_list(),
        &replay_command(seed),
    );
    let timeline = timeline(&settings.faults);
    let rt = tokio::runtime::Handle::current();
    let (s2, d2) = (settings.clone(), dir.clone());
    let harness = tokio::task::spawn_blocking(move || {
        let mut h = Harness::start(s2, d2, rt);
        h.wait_for_leader();
        h.start_writers();
        h.run(&timeline);
        h.heal();
        h
    })
    .await
    .expect("the fault thread");
    let mut harness = harness;
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_secs(3))
        .connect_lazy(&harness.db_url)
        .expect("pool");

    // Drain: until nothing is pending and every committed event has its
    // effect, at most DRAIN, or until nothing moves for STUCK.
    let drain_start = Instant::now();
    let mut last = (None, Instant::now());
    let mut drained = false;
    while drain_start.elapsed() < DRAIN && last.1.elapsed() < STUCK {
        if let Ok(p) = progress(&pool).await {
            let (pending, committed, applied, _) = p;
            if pending == 0 && applied == committed {
                drained = true;
                break;
            }
            if last.0 != Some(p) {
                last = (Some(p), Instant::now());
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let drain = drain_start.elapsed();
    tokio::time::sleep(SETTLE).await;
    let moved = progress(&pool).await.ok();
    harness.note(format!(
        "drain {} after {:.1} s (pending, committed, applied, effect rows: {:?})",
        if drained { "complete" } else { "gave up" },
        drain.as_secs_f64(),
        moved
    ));
    let snap = snapshot(&pool).await.expect("read the database");
    let mut verdict = check(&snap);
    verdict.violations.extend(harness.problems.iter().cloned());
    if verdict.gaps > 0 {
        let diagnosis = diagnose_gaps(&pool, &harness.redis_url, &snap).await;
        write_file(&dir, "gaps.txt", &diagnosis);
    }
    pool.close().await;

    write_file(&dir, "timeline.txt", &harness.log.join("\n"));
    let failed = !verdict.violations.is_empty();
    if failed {
        write_file(&dir, "violations.txt", &verdict.violations.join("\n"));
        write_file(&dir, "postgres-log-tail.txt", &harness.pg.server.log_tail());
        write_file(&dir, "redis-log-tail.txt", &harness.redis.server.log_tail());
    }
    let (self_kills, leader_found, leader_guessed) = (
        harness.self_kills,
        harness.leader_found,
        harness.leader_guessed,
    );
    tokio::task::spawn_blocking(move || {
        // Children first (SIGKILL), then the servers.
        harness.engines.clear();
        harness.writers.clear();
        drop(harness);
    })
    .await
    .expect("teardown");
    let kinds = settings.faults.iter().map(|p| p.fault.kind()).collect();
    let violations = std::mem::take(&mut verdict.violations);
    let ran = Ran::new(
        seed,
        kinds,
        violations,
        started,
        dir,
        "CONVOY_PG_FAULT_KEEP",
    );
    Outcome {
        settings,
        transactions: snap.transactions,
        pending: snap.pending,
        verdict,
        self_kills,
        leader_found,
        leader_guessed,
        drain,
        ran,
    }
}

/// Runs `seeds`, prints one line per schedule and a summary, and panics
/// with every failed schedule's report.
async fn run_all(what: &str, seeds: impl IntoIterator<Item = u64>) {
    let started = Instant::now();
    let outcomes = schedule_run::run_seeds(what, seeds, run_schedule).await;
    let sum = |f: fn(&Outcome) -> usize| outcomes.iter().map(f).sum::<usize>();
    let failed = schedule_run::failed(&outcomes);
    println!(
        "[{what}] {} schedules in {:.0} s; {} committed transactions, {} events; faults: {}; +{} writer self-kills; {} duplicates, {} gaps, {} reorders, {} leaks, {} pending left, {} re-runs recognised by claim, {} stream duplicates; {} violations in {} schedule(s){}",
        outcomes.len(),
        started.elapsed().as_secs_f64(),
        outcomes.iter().map(|o| o.transactions).sum::<u64>(),
        sum(|o| o.verdict.events),
        schedule_run::fault_kinds(&outcomes),
        sum(|o| o.self_kills),
        sum(|o| o.verdict.duplicates),
        sum(|o| o.verdict.gaps),
        sum(|o| o.verdict.reorders),
        sum(|o| o.verdict.leaks),
        outcomes.iter().map(|o| o.pending).sum::<u64>(),
        sum(|o| o.verdict.reruns),
        sum(|o| o.verdict.stream_duplicates),
        sum(|o| o.ran.violations.len()),
        failed.len(),
        schedule_run::failed_seeds(&failed)
    );
    schedule_run::panic_if_failed("outbox fault schedules", &outcomes, |o| {
        format!(
            "  seed {}: {}\n    logs: {}\n    replay: {}",
            o.ran.seed,
            o.ran.violations.first().map_or("", String::as_str),
            o.ran
                .dir
                .as_ref()
                .map_or("-".into(), |d| d.display().to_string()),
            replay_command(o.settings.seed)
        )
    });
}

/// The bounded run of the normal test suite: 6 short schedules from seed
/// 1 (`CONVOY_PG_FAULT_BASE` shifts them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bounded_run() {
    run_all(
        "bounded",
        bounded_seeds("CONVOY_PG_FAULT", BOUNDED_SCHEDULES),
    )
    .await;
}

/// One schedule again: `CONVOY_PG_FAULT_SEED=n`. Does nothing without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay() {
    let Some(seed) = env_u64("CONVOY_PG_FAULT_SEED") else {
        return;
    };
    run_all("replay", [seed]).await;
}

/// `CONVOY_PG_FAULT_SCHEDULES` schedules (default 50) from seed
/// `CONVOY_PG_FAULT_BASE` (default: from the clock, printed; at least
/// 1000, so with fault phases of 15-40 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long: run with --ignored long_run"]
async fn long_run() {
    let seeds = long_seeds("CONVOY_PG_FAULT", 50, SHORT_SEEDS, "schedules");
    run_all("long", seeds).await;
}

// ---------------------------------------------------------------------
// The checker and the planner, made to fail on purpose.
// ---------------------------------------------------------------------

/// A key's committed events `1..=n` with uuids `u{key}{n}`.
fn committed_rows(key: &str, n: u64) -> Vec<(String, u64, String)> {
    (1..=n)
        .map(|i| (key.to_owned(), i, format!("u{key}{i}")))
        .collect()
}

/// Effects of `key` with these `n`s, ids in this order, committed uuids.
fn effects_of(key: &str, ns: &[u64], first_id: i64) -> Vec<Effect> {
    ns.iter()
        .enumerate()
        .map(|(i, n)| Effect {
            id: first_id + i as i64,
            key: key.to_owned(),
            n: *n,
            uuid: format!("u{key}{n}"),
            entry: format!("{}-0", first_id + i as i64),
        })
        .collect()
}

/// The effects of `a` with these `n`s (ids from 1), then of `b` (ids
/// from `b_id`).
fn effects_ab(a: &[u64], b: &[u64], b_id: i64) -> Vec<Effect> {
    let mut effects = effects_of("a", a, 1);
    effects.extend(effects_of("b", b, b_id));
    effects
}

/// Asserts the verdict's duplicates, gaps, reorders and leaks.
#[track_caller]
fn assert_counts(v: &Verdict, want: (usize, usize, usize, usize)) {
    assert_eq!(
        (v.duplicates, v.gaps, v.reorders, v.leaks),
        want,
        "{:?}",
        v.violations
    );
}

/// A snapshot of keys `a` (4 events) and `b` (3) with the given effects.
fn snap_with(effects: Vec<Effect>) -> Snapshot {
    let mut committed = committed_rows("a", 4);
    committed.extend(committed_rows("b", 3));
    Snapshot {
        counters: [("a".to_owned(), 4), ("b".to_owned(), 3)].into(),
        committed,
        effects,
        reruns: Vec::new(),
        transactions: 7,
        pending: 0,
        abandoned: 0,
    }
}

#[test]
fn check_passes_every_effect_once_in_order_across_interleaved_keys() {
    let mut effects = effects_of("a", &[1, 2], 1);
    effects.extend(effects_of("b", &[1, 2, 3], 3));
    effects.extend(effects_of("a", &[3, 4], 6));
    let v = check(&snap_with(effects));
    assert!(v.violations.is_empty(), "{:?}", v.violations);
    assert_eq!((v.events, v.applied), (7, 7));
}

#[test]
fn check_flags_a_duplicate() {
    let v = check(&snap_with(effects_ab(&[1, 2, 3, 3, 4], &[1, 2, 3], 10)));
    assert_counts(&v, (1, 0, 0, 0));
    assert!(v.violations[0].starts_with("duplicate: key a: n 3"));
}

#[test]
fn check_flags_a_late_duplicate_as_a_duplicate_not_a_reorder() {
    let v = check(&snap_with(effects_ab(&[1, 2, 3, 4, 2], &[1, 2, 3], 10)));
    assert_counts(&v, (1, 0, 0, 0));
}

#[test]
fn check_flags_a_gap() {
    let v = check(&snap_with(effects_ab(&[1, 2, 4], &[1, 2], 10)));
    assert_counts(&v, (0, 2, 0, 0));
    assert!(
        v.violations
            .iter()
            .any(|m| m.contains("key a") && m.contains("[3]"))
    );
    assert!(
        v.violations
            .iter()
            .any(|m| m.contains("key b") && m.contains("[3]"))
    );
}

#[test]
fn check_flags_a_reorder_by_serial_id_not_by_input_order() {
    // Handed over in n order, but the ids say n 3 was applied before n 2.
    let mut effects = effects_of("a", &[1, 2, 3, 4], 1);
    effects[1].id = 3;
    effects[2].id = 2;
    effects.extend(effects_of("b", &[1, 2, 3], 30));
    let v = check(&snap_with(effects));
    assert_counts(&v, (0, 0, 1, 0));
    assert!(v.violations[0].starts_with("reorder: key a: n 2"));
}

#[test]
fn check_flags_a_leaked_uuid_of_a_rolled_back_transaction() {
    // n 3 of a was applied from a rolled-back transaction (another uuid),
    // then again from the committed one.
    let mut effects = effects_of("a", &[1, 2, 3, 4], 1);
    effects.insert(
        2,
        Effect {
            id: 100,
            key: "a".into(),
            n: 3,
            uuid: "rolled-back".into(),
            entry: "100-0".into(),
        },
    );
    effects.extend(effects_of("b", &[1, 2, 3], 10));
    // An effect of a key nothing was committed for.
    effects.push(Effect {
        id: 200,
        key: "z".into(),
        n: 1,
        uuid: "nobody".into(),
        entry: "200-0".into(),
    });
    let v = check(&snap_with(effects));
    assert_counts(&v, (0, 0, 0, 2));
    assert!(v.violations.iter().all(|m| m.starts_with("leak:")));
}

#[test]
fn check_passes_a_redelivery_and_flags_a_second_stream_entry_that_claim_hid() {
    let mut snap = snap_with(effects_ab(&[1, 2, 3, 4], &[1, 2, 3], 10));
    // A redelivery of a#2: the same entry ran again, claim said applied.
    let mut again = snap.effects[1].clone();
    again.id = 1;
    snap.reruns.push(again);
    let v = check(&snap);
    assert!(v.violations.is_empty(), "{:?}", v.violations);
    assert_eq!(v.reruns, 1);
    // b#3 published twice: claim recognised the second entry, so the
    // effects are right, but the stream held the event twice.
    let mut twice = snap.effects[6].clone();
    twice.id = 2;
    twice.entry = "99-0".into();
    snap.reruns.push(twice);
    let v = check(&snap);
    assert_eq!(
        (
            v.duplicates,
            v.gaps,
            v.reorders,
            v.leaks,
            v.stream_duplicates
        ),
        (0, 0, 0, 0, 1),
        "{:?}",
        v.violations
    );
    assert!(v.violations[0].starts_with("stream duplicate: key b: n 3"));
}

#[test]
fn check_flags_pending_and_abandoned_rows_and_a_counter_without_its_rows() {
    let mut snap = snap_with(effects_ab(&[1, 2, 3, 4], &[1, 2, 3], 10));
    snap.pending = 2;
    snap.abandoned = 1;
    snap.counters.insert("b".into(), 4);
    let v = check(&snap);
    assert_eq!(v.violations.len(), 3, "{:?}", v.violations);
    assert!(v.violations.iter().any(|m| m.starts_with("pending: 2")));
    assert!(v.violations.iter().any(|m| m.starts_with("abandoned: 1")));
    assert!(v.violations.iter().any(|m| m.starts_with("(test) key b")));
}

#[test]
fn every_plan_has_a_leader_change_in_a_redis_outage_and_no_clashing_faults() {
    for seed in (1..60).chain(1000..1040) {
        let s = Settings::new(seed);
        let combos = s
            .faults
            .iter()
            .filter(|p| matches!(p.fault, Fault::LeaderChangeInRedisOutage { .. }))
            .count();
        assert!(combos >= 1, "seed {seed}: {}", s.fault_list());
        for (i, a) in s.faults.iter().enumerate() {
            assert!(a.at + a.fault.span() < s.phase, "seed {seed}: {}", a.fault);
            for b in &s.faults[i + 1..] {
                let overlap = b.at < a.at + a.fault.span() && a.at < b.at + b.fault.span();
                let shared = a
                    .fault
                    .resources()
                    .iter()
                    .any(|r| b.fault.resources().contains(r));
                assert!(
                    !(overlap && shared),
                    "seed {seed}: {} and {} clash",
                    a.fault,
                    b.fault
                );
            }
            if let Fault::LeaderChangeInRedisOutage { stall, .. } = a.fault {
                assert!(stall > Duration::from_millis(s.leader_timeout_ms));
            }
        }
        // The timeline holds every action, in order.
        let t = timeline(&s.faults);
        assert!(t.windows(2).all(|w| w[0].0 <= w[1].0));
        let actions: usize = s.faults.iter().map(|p| p.fault.actions(0).len()).sum();
        assert_eq!(t.len(), actions);
    }
}
