//! The PostgreSQL outbox (issue 11): commit-to-published throughput and
//! commit-to-handled latency of `PgOutbox`, each beside a hand-written
//! outbox measured in the same run on the same servers.
//!
//! The scenario starts its own PostgreSQL (`convoy_runtime::testing::PgServer`:
//! `initdb` on a temporary directory, `fsync=on`) and uses a fresh database
//! for every side of every case; Redis is flushed before each side.
//!
//! * **throughput**: W writers commit N events over K keys, `per_tx` events
//!   per transaction. convoy: `uow.commit_in(&mut tx)` + `tx.commit()`,
//!   the relay of a running engine publishing; measured until the outbox
//!   has nothing pending (every row on its stream). Baseline: the same rows
//!   inserted by hand into a plain table in the same transactions (no key
//!   lock, no NOTIFY), each writer handing its committed envelopes to one
//!   task that XADDs them, pipelined, to the same per-key streams: a
//!   hand-written outbox at its best (it never reads its table back).
//! * **latency**: one commit every `interval` ms; convoy's `sequential_by`
//!   handler records when it sees each event. Baseline: hand insert +
//!   commit + one XADD, read by a plain consumer group.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail};
use convoy_runtime::outbox::OutboxStore;
use convoy_runtime::postgres::PgOutbox;
use convoy_runtime::testing::PgServer;
use convoy_runtime::{Config, Domain, Envelope, Priority};
use redis::aio::MultiplexedConnection;
use sqlx::AssertSqlSafe;
use sqlx::postgres::{PgListener, PgPool, PgPoolOptions};
use tokio_util::sync::CancellationToken;

use super::{Env, progress};
use crate::baseline;
use crate::harness::{self, Tuning};
use crate::model::{self, CATEGORY, Probe, ProbeState, Tick, key_name, now_ns};
use crate::report::{Cell, Row, Section};
use crate::stats::Percentiles;

/// Options of the PostgreSQL outbox scenario.
#[derive(clap::Args, Debug, Clone)]
pub struct PgOutboxArgs {
    /// Events per throughput case.
    #[arg(long, default_value_t = 5_000)]
    pub pg_events: usize,
    /// Keys the throughput events are spread over (round robin).
    #[arg(long, default_value_t = 64)]
    pub pg_keys: usize,
    /// Concurrent writers (each on its own connection); key i is written by
    /// writer i mod W, so each key's events commit in seq order.
    #[arg(long, default_value_t = 8)]
    pub pg_writers: usize,
    /// Events per transaction, one throughput case each (comma separated).
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 10])]
    pub pg_per_tx: Vec<usize>,
    /// Events of the latency load (one per transaction).
    #[arg(long, default_value_t = 300)]
    pub pg_latency_events: usize,
    /// Time between two commits of the latency load, in ms.
    #[arg(long, default_value_t = 20)]
    pub pg_latency_interval_ms: u64,
    /// Keys of the latency load (round robin).
    #[arg(long, default_value_t = 16)]
    pub pg_latency_keys: usize,
    /// `[outbox] poll_interval_ms` of the relay: high, so a latency far
    /// below it shows the relay is woken by NOTIFY, not by its poll.
    #[arg(long, default_value_t = 1000)]
    pub pg_poll_interval_ms: u64,
    /// Rounds of each throughput case (sides interleaved, order alternating);
    /// each side's best round is reported.
    #[arg(long, default_value_t = 2)]
    pub pg_rounds: usize,
    /// Longest one side of one throughput case may run.
    #[arg(long, default_value_t = 60)]
    pub pg_case_timeout_secs: u64,
}

/// The PostgreSQL server of a run and its maintenance pool.
struct Pg {
    server: PgServer,
    admin: PgPool,
    databases: AtomicU64,
}

impl Pg {
    async fn start() -> Result<Pg> {
        let server = tokio::task::spawn_blocking(PgServer::start)
            .await
            .context("PostgreSQL start panicked")?
            .map_err(|e| anyhow!("{e}"))?;
        let admin = PgPoolOptions::new()
            .max_connections(1)
            .connect(&server.url())
            .await
            .context("cannot connect to the benchmark's PostgreSQL")?;
        Ok(Pg {
            server,
            admin,
            databases: AtomicU64::new(0),
        })
    }

    /// A fresh database; its URL.
    async fn database(&self, what: &str) -> Result<String> {
        let name = format!("{what}_{}", self.databases.fetch_add(1, Ordering::Relaxed));
        sqlx::query(AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&self.admin)
            .await
            .with_context(|| format!("CREATE DATABASE {name} failed"))?;
        Ok(self.server.database_url(&name))
    }

    async fn version(&self) -> Result<String> {
        let v: String = sqlx::query_scalar("SHOW server_version")
            .fetch_one(&self.admin)
            .await
            .context("SHOW server_version failed")?;
        Ok(v)
    }
}

/// A pool of `n` connections, all opened before anything is measured.
async fn writer_pool(url: &str, n: usize) -> Result<PgPool> {
    let pool = PgPoolOptions::new()
        .max_connections(n as u32)
        .min_connections(n as u32)
        .connect(url)
        .await
        .context("cannot connect the writers")?;
    let mut held = Vec::with_capacity(n);
    for _ in 0..n {
        held.push(
            pool.acquire()
                .await
                .context("opening a writer connection")?,
        );
    }
    drop(held);
    Ok(pool)
}

/// The configuration of convoy's side: the bench Redis, the outbox in
/// `db_url` (rows deleted as they are published: the default).
fn convoy_config(env: &Env, db_url: &str, args: &PgOutboxArgs) -> Config {
    let mut c = harness::config(&env.url, Tuning::defaults());
    c.outbox.postgres_url = Some(db_url.to_owned());
    c.outbox.poll_interval_ms = args.pg_poll_interval_ms;
    c
}

/// A migrated outbox as `config` describes it.
async fn outbox(config: &Config) -> Result<PgOutbox> {
    let outbox = PgOutbox::from_config(&config.outbox).map_err(|e| anyhow!("{e}"))?;
    outbox
        .migrate()
        .await
        .map_err(|e| anyhow!("outbox migration failed: {e}"))?;
    Ok(outbox)
}

/// The baseline's plain table: the outbox's data columns, a primary key,
/// no other index.
async fn hand_table(pool: &PgPool) -> Result<()> {
    sqlx::query(
        "CREATE TABLE hand_outbox (
            id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            category text NOT NULL,
            partition_key bytea,
            envelope text NOT NULL,
            raised_ms bigint NOT NULL
        )",
    )
    .execute(pool)
    .await
    .context("creating the baseline's table failed")?;
    Ok(())
}

/// The rows of `envelopes` inserted by hand in `tx`: one statement, as
/// convoy writes them.
async fn hand_insert(tx: &mut sqlx::PgConnection, envelopes: &[Envelope]) -> Result<()> {
    let mut categories = Vec::with_capacity(envelopes.len());
    let mut keys: Vec<Option<Vec<u8>>> = Vec::with_capacity(envelopes.len());
    let mut bodies = Vec::with_capacity(envelopes.len());
    let mut raised = Vec::with_capacity(envelopes.len());
    for e in envelopes {
        categories.push(e.category.clone());
        keys.push(e.partition_key.as_ref().map(|k| k.as_bytes().to_vec()));
        bodies.push(serde_json::to_string(e).context("encoding an envelope")?);
        raised.push(i64::try_from(e.time_ms).unwrap_or(i64::MAX));
    }
    sqlx::query(
        "INSERT INTO hand_outbox (category, partition_key, envelope, raised_ms)
         SELECT c, k, e, r FROM unnest($1::text[], $2::bytea[], $3::text[], $4::bigint[])
             WITH ORDINALITY AS u(c, k, e, r, n) ORDER BY n",
    )
    .bind(&categories)
    .bind(&keys)
    .bind(&bodies)
    .bind(&raised)
    .execute(&mut *tx)
    .await
    .context("the baseline's insert failed")?;
    Ok(())
}

fn envelope(t: &Tick) -> Result<Envelope> {
    Envelope::wrap(t, Some(t.client_id.clone()), Priority::Normal, None)
        .map_err(|e| anyhow!("encoding an envelope failed: {e}"))
}

/// The partition stream of `key` (`{s}{category}:{key}`, `s` its shard
/// among the default shard count).
fn stream_of(key: &str) -> String {
    use convoy_runtime::redis::keys;
    keys::partition_stream(keys::shard_of(key, keys::DEFAULT_SHARDS), CATEGORY, key)
}

/// Runs the throughput cases, then the latency load.
pub async fn run(env: &mut Env, args: &PgOutboxArgs) -> Result<Section> {
    if args.pg_events == 0
        || args.pg_keys == 0
        || args.pg_writers == 0
        || args.pg_per_tx.is_empty()
        || args.pg_per_tx.contains(&0)
        || args.pg_latency_events == 0
        || args.pg_latency_keys == 0
        || args.pg_rounds == 0
    {
        bail!(
            "--pg-events, --pg-keys, --pg-writers, --pg-per-tx and the latency counts must be above 0"
        );
    }
    progress("pg-outbox", "starting PostgreSQL");
    let pg = Pg::start().await?;
    let mut section = Section::new("pg-outbox");
    section.param(
        "PostgreSQL",
        format!(
            "{} (own server on 127.0.0.1:{}, fsync=on, a fresh database per side)",
            pg.version().await?,
            pg.server.port()
        ),
    );
    section.param(
        "throughput load",
        format!(
            "{} events over {} keys, {} concurrent writers (key i written by writer i mod W), events per transaction {:?}, {} rounds",
            args.pg_events, args.pg_keys, args.pg_writers, args.pg_per_tx, args.pg_rounds
        ),
    );
    section.param(
        "convoy",
        format!(
            "raise + uow.commit_in(&mut tx) + tx.commit() (per-key advisory lock, rows, pg_notify); one engine's relay publishes (leader lock, publish script, rows deleted as published); [outbox] poll_interval_ms = {}",
            args.pg_poll_interval_ms
        ),
    );
    section.param(
        "baseline (throughput)",
        "the same rows INSERTed by hand into a plain table (primary key only) in the same transactions; after each commit the writer hands the envelopes to one task that XADDs them to the same per-key streams, pipelined (up to 512 per round trip)",
    );
    section.param(
        "latency load",
        format!(
            "{} events, one transaction each, every {} ms, over {} keys (each partition created and owned before measuring)",
            args.pg_latency_events, args.pg_latency_interval_ms, args.pg_latency_keys
        ),
    );
    section.param(
        "baseline (latency)",
        "hand INSERT + COMMIT, then one XADD; 1 plain consumer-group reader (XREADGROUP BLOCK 1000 COUNT 100 + XACK)",
    );
    let timeout = Duration::from_secs(args.pg_case_timeout_secs);
    for &per_tx in &args.pg_per_tx {
        let case = format!(
            "N={} K={} W={} {per_tx}/tx",
            args.pg_events, args.pg_keys, args.pg_writers
        );
        let mut runs: [Vec<Throughput>; 3] = [Vec::new(), Vec::new(), Vec::new()];
        for round in 0..args.pg_rounds {
            // Alternate the order so that a drift of the machine's load
            // does not always favour the same side.
            let order: [Side; 3] = if round % 2 == 0 {
                [Side::Baseline, Side::Convoy, Side::Notify]
            } else {
                [Side::Notify, Side::Convoy, Side::Baseline]
            };
            for side in order {
                let r = match side {
                    Side::Baseline => {
                        baseline_throughput(env, &pg, args, per_tx, timeout, false).await?
                    }
                    Side::Convoy => convoy_throughput(env, &pg, args, per_tx, timeout).await?,
                    Side::Notify => {
                        baseline_throughput(env, &pg, args, per_tx, timeout, true).await?
                    }
                };
                progress(
                    "pg-outbox",
                    format!(
                        "{case} round {}: {} {:.0} events/s",
                        round + 1,
                        side.name(),
                        r.rate()
                    ),
                );
                runs[side as usize].push(r);
            }
        }
        let [b, c, bn] = runs.map(best);
        push_throughput(&mut section, &case, &c, &b, &bn, args.pg_events);
    }

    progress("pg-outbox", "latency: baseline");
    let b = baseline_latency(env, &pg, args).await?;
    progress(
        "pg-outbox",
        format!("latency: baseline p50 {:.2} ms; convoy", b.handled.p50_ms),
    );
    let c = convoy_latency(env, &pg, args).await?;
    progress(
        "pg-outbox",
        format!("latency: convoy p50 {:.2} ms", c.handled.p50_ms),
    );
    let case = format!(
        "1 commit / {} ms, {} keys",
        args.pg_latency_interval_ms, args.pg_latency_keys
    );
    let poll = args.pg_poll_interval_ms as f64;
    section.rows.push(
        Row::new(
            &case,
            "commit-to-handled p50 ms",
            c.handled.p50_ms,
            b.handled.p50_ms,
        )
        .target("<= 5 ms", c.handled.p50_ms <= 5.0),
    );
    section.rows.push(
        Row::new(
            &case,
            "commit-to-handled p99 ms",
            c.handled.p99_ms,
            b.handled.p99_ms,
        )
        .target("<= 20 ms", c.handled.p99_ms <= 20.0),
    );
    section.rows.push(
        Row::new(
            &case,
            "commit-to-handled max ms",
            c.handled.max_ms,
            b.handled.max_ms,
        )
        .target(
            format!("< poll interval {poll:.0} ms / 10 (woken by NOTIFY)"),
            c.handled.max_ms < poll / 10.0,
        ),
    );
    section.rows.push(Row::new(
        &case,
        "commit call-to-handled p50 ms",
        c.from_commit_call.p50_ms,
        b.from_commit_call.p50_ms,
    ));
    section.rows.push(Row::new(
        &case,
        "commit call-to-handled p99 ms",
        c.from_commit_call.p99_ms,
        b.from_commit_call.p99_ms,
    ));
    section.rows.push(Row::new(
        &case,
        "transaction p50 ms",
        c.transaction.p50_ms,
        b.transaction.p50_ms,
    ));
    section.rows.push(Row::new(
        &case,
        "COMMIT alone p50 / p99 ms",
        Cell::Text(format!("{:.2} / {:.2}", c.commit.p50_ms, c.commit.p99_ms)),
        Cell::Text(format!("{:.2} / {:.2}", b.commit.p50_ms, b.commit.p99_ms)),
    ));
    section.rows.push(Row::new(
        &case,
        "events measured",
        c.handled.count as f64,
        b.handled.count as f64,
    ));
    section.rows.push(
        Row::new(
            &case,
            "per-key order",
            Cell::Text(c.order.clone()),
            Cell::Text(b.order.clone()),
        )
        .target("no key goes backwards", c.order_ok),
    );

    section.note(format!("throughput events/s: N divided by the time from the writers' first BEGIN to the moment every event is on its stream (convoy: the outbox has no pending row left, polled every 2 ms once the writers are done; baseline: the last XADD pipeline acknowledged). Each case runs {} rounds, the sides interleaved in alternating order; every throughput figure is from the side's best round.", args.pg_rounds));
    section.note("baseline + pg_notify: the baseline with one pg_notify in each transaction (and a listener draining them): what NOTIFY alone costs. A notifying transaction holds PostgreSQL's notify queue lock from pre-commit until it ends, WAL flush included, so notifying transactions commit one at a time instead of sharing a flush (group commit).");
    section.note("last commit to all published: from the last writer's COMMIT returning to every event on its stream (how far the relay lags behind the writers).");
    section.note("PG round trips per transaction: 3 on both sides (BEGIN, INSERT, COMMIT; convoy's INSERT takes the per-key advisory locks and, while the relay may be asleep, queues the pg_notify in the same statement); transaction ms is BEGIN to COMMIT returned, as the writer sees it.");
    section.note("relay rows per publish: events divided by the relay's publish script runs (INFO commandstats evalsha); the baseline's figure is events per XADD pipeline.");
    section.note("commit-to-handled: from tx.commit() returning (the commit is durable) to the handler's first line; commit call-to-handled: from calling tx.commit() (its WAL flush included).");
    section.note("The stream check reads every partition stream back (XRANGE): each key's events once each, in seq order, which is commit order (one writer per key).");
    section.note("Timings are on a shared 2-core machine where PostgreSQL (fsync=on), Redis, the writers, the relay and the handler compete for the same cores and disk; compare the ratios, not the absolute figures.");
    drop(pg);
    Ok(section)
}

/// The sides of a throughput case.
#[derive(Debug, Clone, Copy)]
enum Side {
    Baseline = 0,
    Convoy = 1,
    Notify = 2,
}

impl Side {
    fn name(self) -> &'static str {
        match self {
            Side::Baseline => "baseline",
            Side::Convoy => "convoy",
            Side::Notify => "baseline + pg_notify",
        }
    }
}

/// The round with the highest rate (interference on a shared machine only
/// ever slows a round down).
fn best(runs: Vec<Throughput>) -> Throughput {
    runs.into_iter()
        .max_by(|a, b| a.rate().total_cmp(&b.rate()))
        .unwrap_or_else(|| Throughput {
            handled: 0,
            seconds: 0.0,
            after_last_commit_ms: 0.0,
            timed_out: true,
            transaction: Percentiles::default(),
            publishes: 0,
            redis_calls: 0,
            stream_check: "not run".into(),
            stream_ok: false,
        })
}

/// What one side of one throughput case measured.
struct Throughput {
    handled: usize,
    seconds: f64,
    /// From the last writer's commit to the last event on its stream.
    after_last_commit_ms: f64,
    timed_out: bool,
    transaction: Percentiles,
    /// Publish script runs (convoy) or XADD pipelines (baseline).
    publishes: u64,
    redis_calls: u64,
    stream_check: String,
    stream_ok: bool,
}

impl Throughput {
    fn rate(&self) -> f64 {
        self.handled as f64 / self.seconds.max(1e-9)
    }
}

fn push_throughput(
    section: &mut Section,
    case: &str,
    c: &Throughput,
    b: &Throughput,
    bn: &Throughput,
    n: usize,
) {
    let mut label = case.to_owned();
    for (who, s) in [("convoy", c), ("baseline", b), ("baseline + pg_notify", bn)] {
        if s.timed_out {
            label.push_str(&format!(" ({who} timed out at {}/{n})", s.handled));
        }
    }
    let case = label.as_str();
    section.rows.push(Row::new(
        case,
        "commit-to-published events/s",
        c.rate(),
        b.rate(),
    ));
    section.rows.push(Row::new(
        case,
        "same, baseline + pg_notify per tx",
        c.rate(),
        bn.rate(),
    ));
    section.rows.push(Row::new(
        case,
        "last commit to all published ms",
        c.after_last_commit_ms,
        b.after_last_commit_ms,
    ));
    section.rows.push(Row::new(
        case,
        "transaction p50 ms",
        c.transaction.p50_ms,
        b.transaction.p50_ms,
    ));
    section.rows.push(Row::new(
        case,
        "transaction p99 ms",
        c.transaction.p99_ms,
        b.transaction.p99_ms,
    ));
    section.rows.push(Row::new(
        case,
        "relay rows per publish",
        n as f64 / c.publishes.max(1) as f64,
        n as f64 / b.publishes.max(1) as f64,
    ));
    section.rows.push(Row::new(
        case,
        "Redis calls/event",
        c.redis_calls as f64 / n as f64,
        b.redis_calls as f64 / n as f64,
    ));
    section.rows.push(
        Row::new(
            case,
            "on the streams",
            Cell::Text(c.stream_check.clone()),
            Cell::Text(b.stream_check.clone()),
        )
        .target("each once, per-key order", c.stream_ok),
    );
}

/// The throughput events of writer `w` of `writers`, in transactions of
/// `per_tx`: the events of the keys it owns, in order.
fn writer_batches(n: usize, k: usize, writers: usize, per_tx: usize) -> Vec<Vec<Vec<Tick>>> {
    let mut mine: Vec<Vec<Tick>> = vec![Vec::new(); writers];
    for t in model::spread(k, n) {
        let key: usize = t.client_id[1..].parse().unwrap_or(0);
        mine[key % writers].push(t);
    }
    mine.into_iter()
        .map(|evs| evs.chunks(per_tx).map(<[Tick]>::to_vec).collect())
        .collect()
}

/// Reads every key's stream back: each event once, seqs in order.
async fn check_streams(
    conn: &mut MultiplexedConnection,
    n: usize,
    k: usize,
) -> Result<(String, bool)> {
    let mut found = 0usize;
    let mut bad_keys = 0usize;
    for i in 0..k {
        let key = key_name(i);
        let expected = (n + k - 1 - i) / k;
        let reply: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
            .arg(stream_of(&key))
            .arg("-")
            .arg("+")
            .query_async(conn)
            .await
            .context("XRANGE failed")?;
        found += reply.ids.len();
        let seqs: Vec<u64> = reply
            .ids
            .iter()
            .filter_map(|e| e.get::<String>("payload"))
            .filter_map(|p| serde_json::from_str::<Tick>(&p).ok())
            .map(|t| t.seq)
            .collect();
        if seqs.len() != expected || seqs.iter().enumerate().any(|(j, s)| *s != j as u64) {
            bad_keys += 1;
        }
    }
    let ok = found == n && bad_keys == 0;
    let text = if ok {
        format!("{found}/{n}, ok")
    } else {
        format!("{found}/{n}, {bad_keys} keys wrong")
    };
    Ok((text, ok))
}

async fn convoy_throughput(
    env: &mut Env,
    pg: &Pg,
    args: &PgOutboxArgs,
    per_tx: usize,
    timeout: Duration,
) -> Result<Throughput> {
    let (n, k, w) = (args.pg_events, args.pg_keys, args.pg_writers);
    env.reset().await?;
    let db = pg.database("convoy_throughput").await?;
    let config = convoy_config(env, &db, args);
    let outbox = outbox(&config).await?;
    let domain = Domain::builder()
        .config(config)
        .instance_id("pg-bench-writer")
        .outbox(outbox.clone())
        .init()
        .map_err(|e| anyhow!("domain init failed: {e}"))?;
    let engine = domain.engine().spawn();
    let pool = writer_pool(&db, w).await?;
    // Warm-up: the relay is the leader and has published once.
    let mut tx = pool.begin().await.context("begin")?;
    let mut uow = domain.unit_of_work();
    uow.raise(Tick::new("warmup", 0))
        .map_err(|e| anyhow!("raise failed: {e}"))?;
    uow.commit_in(&mut tx)
        .await
        .map_err(|e| anyhow!("commit_in failed: {e}"))?;
    tx.commit().await.context("commit")?;
    wait_published(&outbox, Duration::from_secs(30)).await?;

    let batches = writer_batches(n, k, w, per_tx);
    let before = env.stats().await?;
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(w);
    for mine in batches {
        let pool = pool.clone();
        let domain = domain.clone();
        tasks.push(tokio::spawn(async move {
            let mut durations = Vec::with_capacity(mine.len());
            for batch in mine {
                let t = Instant::now();
                let mut tx = pool.begin().await.context("begin")?;
                let mut uow = domain.unit_of_work();
                for e in batch {
                    uow.raise(e).map_err(|e| anyhow!("raise failed: {e}"))?;
                }
                uow.commit_in(&mut tx)
                    .await
                    .map_err(|e| anyhow!("commit_in failed: {e}"))?;
                tx.commit().await.context("commit")?;
                durations.push(t.elapsed().as_nanos() as u64);
            }
            Ok::<_, anyhow::Error>(durations)
        }));
    }
    let mut durations = Vec::new();
    for t in tasks {
        durations.extend(t.await.context("a writer panicked")??);
    }
    let committed = start.elapsed();
    let left = timeout.saturating_sub(committed);
    let done = wait_no_pending(&outbox, left).await?;
    let elapsed = start.elapsed();
    let seconds = elapsed.as_secs_f64();
    let stats = env.stats().await?.since(&before);
    let pending = outbox
        .stats()
        .await
        .map_err(|e| anyhow!("outbox stats failed: {e}"))?
        .pending as usize;
    engine
        .shutdown()
        .await
        .map_err(|e| anyhow!("engine shutdown failed: {e}"))?;
    pool.close().await;
    let (stream_check, stream_ok) = check_streams(&mut env.admin, n, k).await?;
    Ok(Throughput {
        handled: if done { n } else { n.saturating_sub(pending) },
        seconds,
        after_last_commit_ms: elapsed.saturating_sub(committed).as_secs_f64() * 1000.0,
        timed_out: !done,
        transaction: Percentiles::of_ns(&mut durations),
        publishes: stats.script_calls(),
        redis_calls: stats.total_calls(),
        stream_check,
        stream_ok,
    })
}

/// Waits until the outbox has no pending row; fails on timeout.
async fn wait_published(outbox: &PgOutbox, timeout: Duration) -> Result<()> {
    if wait_no_pending(outbox, timeout).await? {
        Ok(())
    } else {
        bail!("the outbox still has pending rows after {timeout:?}")
    }
}

/// Polls the outbox every 2 ms until no row is pending; false on timeout.
async fn wait_no_pending(outbox: &PgOutbox, timeout: Duration) -> Result<bool> {
    let start = Instant::now();
    loop {
        let stats = outbox
            .stats()
            .await
            .map_err(|e| anyhow!("outbox stats failed: {e}"))?;
        if stats.pending == 0 {
            return Ok(true);
        }
        if start.elapsed() >= timeout {
            return Ok(false);
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// The baseline of a throughput case; with `notify`, each transaction also
/// sends a `pg_notify` (to a listener that only drains them), to show what
/// NOTIFY alone costs.
async fn baseline_throughput(
    env: &mut Env,
    pg: &Pg,
    args: &PgOutboxArgs,
    per_tx: usize,
    timeout: Duration,
    notify: bool,
) -> Result<Throughput> {
    let (n, k, w) = (args.pg_events, args.pg_keys, args.pg_writers);
    env.reset().await?;
    let db = pg
        .database(if notify {
            "notify_throughput"
        } else {
            "baseline_throughput"
        })
        .await?;
    let pool = writer_pool(&db, w).await?;
    hand_table(&pool).await?;
    let listening = CancellationToken::new();
    let listener = if notify {
        let mut l = PgListener::connect(&db)
            .await
            .context("cannot connect the baseline's listener")?;
        l.listen("hand_outbox").await.context("LISTEN failed")?;
        let stop = listening.clone();
        Some(tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    r = l.recv() => if r.is_err() { return },
                }
            }
        }))
    } else {
        None
    };
    let batches = writer_batches(n, k, w, per_tx);
    let (to_redis, mut committed) =
        tokio::sync::mpsc::unbounded_channel::<Vec<(String, Vec<(&'static str, String)>)>>();
    let mut conn = env
        .client
        .get_multiplexed_async_connection()
        .await
        .context("cannot connect the baseline's publisher")?;
    let stop = CancellationToken::new();
    let before = env.stats().await?;
    let start = Instant::now();
    let publisher = tokio::spawn({
        let stop = stop.clone();
        async move {
            let mut sent = 0usize;
            let mut pipelines = 0u64;
            let mut buf = Vec::with_capacity(512);
            while sent < n {
                buf.clear();
                let mut entries = Vec::with_capacity(512);
                tokio::select! {
                    _ = stop.cancelled() => break,
                    got = committed.recv_many(&mut buf, 512) => if got == 0 { break },
                }
                for batch in buf.drain(..) {
                    entries.extend(batch);
                }
                for chunk in entries.chunks(512) {
                    let mut pipe = redis::pipe();
                    for (stream, fields) in chunk {
                        pipe.cmd("XADD").arg(stream).arg("*");
                        for (f, v) in fields {
                            pipe.arg(*f).arg(v);
                        }
                        pipe.ignore();
                    }
                    let () = pipe
                        .query_async(&mut conn)
                        .await
                        .context("the baseline's XADD pipeline failed")?;
                    pipelines += 1;
                    sent += chunk.len();
                }
            }
            Ok::<_, anyhow::Error>((sent, pipelines, start.elapsed()))
        }
    });
    let mut tasks = Vec::with_capacity(w);
    for mine in batches {
        let pool = pool.clone();
        let to_redis = to_redis.clone();
        tasks.push(tokio::spawn(async move {
            let mut durations = Vec::with_capacity(mine.len());
            for batch in mine {
                let t = Instant::now();
                let envelopes: Vec<Envelope> = batch.iter().map(envelope).collect::<Result<_>>()?;
                let mut tx = pool.begin().await.context("begin")?;
                hand_insert(&mut tx, &envelopes).await?;
                if notify {
                    sqlx::query("SELECT pg_notify('hand_outbox', '')")
                        .execute(&mut *tx)
                        .await
                        .context("pg_notify failed")?;
                }
                tx.commit().await.context("commit")?;
                durations.push(t.elapsed().as_nanos() as u64);
                let entries = envelopes
                    .iter()
                    .map(|e| {
                        let key = e.partition_key.as_deref().unwrap_or_default();
                        (stream_of(key), e.to_fields())
                    })
                    .collect();
                let _ = to_redis.send(entries);
            }
            Ok::<_, anyhow::Error>(durations)
        }));
    }
    drop(to_redis);
    let mut durations = Vec::new();
    for t in tasks {
        durations.extend(t.await.context("a writer panicked")??);
    }
    let committed = start.elapsed();
    let left = timeout.saturating_sub(committed);
    let finished = tokio::time::timeout(left, publisher).await;
    let (sent, pipelines, elapsed, timed_out) = match finished {
        Ok(joined) => {
            let (sent, pipelines, elapsed) =
                joined.context("the baseline's publisher panicked")??;
            (sent, pipelines, elapsed, sent < n)
        }
        Err(_) => {
            stop.cancel();
            (0, 0, start.elapsed(), true)
        }
    };
    let stats = env.stats().await?.since(&before);
    listening.cancel();
    if let Some(l) = listener {
        let _ = l.await;
    }
    pool.close().await;
    let (stream_check, stream_ok) = check_streams(&mut env.admin, n, k).await?;
    Ok(Throughput {
        handled: sent,
        seconds: elapsed.as_secs_f64(),
        after_last_commit_ms: elapsed.saturating_sub(committed).as_secs_f64() * 1000.0,
        timed_out,
        transaction: Percentiles::of_ns(&mut durations),
        publishes: pipelines,
        redis_calls: stats.total_calls(),
        stream_check,
        stream_ok,
    })
}

/// What one side of the latency load measured.
struct Latency {
    /// From `tx.commit()` returning to the handler.
    handled: Percentiles,
    /// From calling `tx.commit()` to the handler.
    from_commit_call: Percentiles,
    /// BEGIN to COMMIT returned.
    transaction: Percentiles,
    /// The COMMIT alone (called to returned).
    commit: Percentiles,
    order: String,
    order_ok: bool,
}

/// One committed event of the latency load: when the commit was called and
/// when it returned (`now_ns`), and how long the transaction took.
type Committed = HashMap<(String, u64), (u64, u64)>;

/// Sends the paced latency load through `commit(key, seq)`, which returns
/// `(commit called, commit returned, transaction ns)`.
async fn paced<F, Fut>(
    args: &PgOutboxArgs,
    keys: &[String],
    first_seq: u64,
    mut commit: F,
) -> Result<(Committed, Vec<u64>)>
where
    F: FnMut(String, u64) -> Fut,
    Fut: std::future::Future<Output = Result<(u64, u64, u64)>>,
{
    let mut tick = tokio::time::interval(Duration::from_millis(args.pg_latency_interval_ms));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut committed = HashMap::with_capacity(args.pg_latency_events);
    let mut transactions = Vec::with_capacity(args.pg_latency_events);
    for i in 0..args.pg_latency_events {
        tick.tick().await;
        let key = keys[i % keys.len()].clone();
        let seq = first_seq + (i / keys.len()) as u64;
        let (called, returned, took) = commit(key.clone(), seq).await?;
        committed.insert((key, seq), (called, returned));
        transactions.push(took);
    }
    Ok((committed, transactions))
}

/// The latencies of the handled events of `log` that were committed in
/// `committed`.
fn latencies(state: &ProbeState, committed: &Committed, mut transactions: Vec<u64>) -> Latency {
    let mut handled = Vec::with_capacity(committed.len());
    let mut from_call = Vec::with_capacity(committed.len());
    for (key, seq, at) in state.take_handled_log() {
        if let Some((called, returned)) = committed.get(&(key, seq)) {
            handled.push(at.saturating_sub(*returned));
            from_call.push(at.saturating_sub(*called));
        }
    }
    let mut commits: Vec<u64> = committed
        .values()
        .map(|(called, returned)| returned.saturating_sub(*called))
        .collect();
    let order = state.order();
    Latency {
        handled: Percentiles::of_ns(&mut handled),
        from_commit_call: Percentiles::of_ns(&mut from_call),
        transaction: Percentiles::of_ns(&mut transactions),
        commit: Percentiles::of_ns(&mut commits),
        order: order.describe(),
        order_ok: order.decreases == 0,
    }
}

async fn convoy_latency(env: &mut Env, pg: &Pg, args: &PgOutboxArgs) -> Result<Latency> {
    env.reset().await?;
    let db = pg.database("convoy_latency").await?;
    let config = convoy_config(env, &db, args);
    let outbox = outbox(&config).await?;
    let state = ProbeState::new();
    let domain = Domain::builder()
        .config(config)
        .instance_id("pg-bench-latency")
        .outbox(outbox)
        .handler(Probe {
            state: state.clone(),
        })
        .init()
        .map_err(|e| anyhow!("domain init failed: {e}"))?;
    let engine = domain.engine().spawn();
    let pool = writer_pool(&db, 1).await?;
    let keys: Vec<String> = (0..args.pg_latency_keys).map(key_name).collect();
    let commit = |key: String, seq: u64| {
        let pool = pool.clone();
        let domain = domain.clone();
        async move {
            let begun = Instant::now();
            let mut tx = pool.begin().await.context("begin")?;
            let mut uow = domain.unit_of_work();
            uow.raise(Tick::new(&key, seq))
                .map_err(|e| anyhow!("raise failed: {e}"))?;
            uow.commit_in(&mut tx)
                .await
                .map_err(|e| anyhow!("commit_in failed: {e}"))?;
            let called = now_ns();
            tx.commit().await.context("commit")?;
            let returned = now_ns();
            Ok((called, returned, begun.elapsed().as_nanos() as u64))
        }
    };
    // Warm-up: every partition exists and is owned before measuring.
    for key in &keys {
        commit(key.clone(), 0).await?;
    }
    harness::wait_handled(
        &state,
        keys.len() as u64,
        Duration::from_secs(60),
        "warm-up",
    )
    .await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    state.log_handled();
    let (committed, transactions) = paced(args, &keys, 1, commit).await?;
    harness::wait_handled(
        &state,
        (keys.len() + args.pg_latency_events) as u64,
        Duration::from_secs(30),
        "the latency load",
    )
    .await?;
    engine
        .shutdown()
        .await
        .map_err(|e| anyhow!("engine shutdown failed: {e}"))?;
    pool.close().await;
    Ok(latencies(&state, &committed, transactions))
}

async fn baseline_latency(env: &mut Env, pg: &Pg, args: &PgOutboxArgs) -> Result<Latency> {
    env.reset().await?;
    let db = pg.database("baseline_latency").await?;
    let pool = writer_pool(&db, 1).await?;
    hand_table(&pool).await?;
    let state = ProbeState::new();
    baseline::create_group(&mut env.admin, "$").await?;
    let stop = CancellationToken::new();
    let consumers =
        baseline::start_consumers(&env.client, "c", 1, Duration::from_secs(1), &state, &stop)
            .await?;
    let conn = env
        .client
        .get_multiplexed_async_connection()
        .await
        .context("cannot connect the baseline publisher")?;
    let keys: Vec<String> = (0..args.pg_latency_keys).map(key_name).collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    state.log_handled();
    let commit = |key: String, seq: u64| {
        let pool = pool.clone();
        let mut conn = conn.clone();
        async move {
            let begun = Instant::now();
            let tick = Tick::new(&key, seq);
            let envelopes = vec![envelope(&tick)?];
            let mut tx = pool.begin().await.context("begin")?;
            hand_insert(&mut tx, &envelopes).await?;
            let called = now_ns();
            tx.commit().await.context("commit")?;
            let returned = now_ns();
            let took = begun.elapsed().as_nanos() as u64;
            baseline::publish_one(&mut conn, &tick).await?;
            Ok((called, returned, took))
        }
    };
    let (committed, transactions) = paced(args, &keys, 0, commit).await?;
    harness::wait_handled(
        &state,
        args.pg_latency_events as u64,
        Duration::from_secs(30),
        "the baseline load",
    )
    .await?;
    stop.cancel();
    baseline::join(consumers).await?;
    pool.close().await;
    Ok(latencies(&state, &committed, transactions))
}
