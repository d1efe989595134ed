//! The PostgreSQL outbox and the exactly-once helper across real OS
//! processes, against a real PostgreSQL and a real Redis: a writer killed
//! right after its commit, two relay replicas with the leader killed
//! mid-batch or stalled past its leadership, handler owners stalled past
//! their lease or killed between their commit and their ack, and
//! publishers restarted under the same instance id.
//!
//! The other processes are this test binary re-executed with the
//! `child_process` test selected and `CONVOY_PG_CHILD` naming the role.
//! Relays run as publishers without handlers, so nothing trims the
//! partition streams: what is on them (XRANGE) is everything published.
//!
//! To look into a failure: `CONVOY_KEEP_LOGS=/some/dir` keeps the
//! children's logs (stderr) there, `CONVOY_CHILD_LOG=debug` sets their
//! tracing filter (default `convoy_runtime=info`).

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use convoy_runtime::postgres::{Applied, AppliedEvents, PgOutbox};
use convoy_runtime::redis::RedisBroker;
use convoy_runtime::testing::{
    ChildEngine, FaultProxy, Match, RedisServer, current_test_command, script_sha,
};
use convoy_runtime::{Context, Domain, Error, HandlerError, Priority, event_handler};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use support::pg::{PgEnv, config_for, seqs};
use support::{Ledger, Posted, interleaved, publish, publisher, test_config, wait_until};

const WAIT: Duration = Duration::from_secs(30);

/// How long an [`Effects`] handler stalls at the step a test stops or
/// kills it in (the test sees the step's note within a poll or two).
const STALL: Duration = Duration::from_millis(1500);

// ---------------------------------------------------------------------
// The child processes.
// ---------------------------------------------------------------------

/// Plays the role named by `CONVOY_PG_CHILD` when re-executed as a child
/// (and does nothing in a normal test run):
///
/// - `writer`: commits `CONVOY_EVENTS`, one transaction each, with no
///   relay running, prints `committed` and waits to be killed;
/// - `relay`: an engine without handlers: the outbox relay only;
/// - `publisher`: a relay that also commits `CONVOY_EVENTS`, prints
///   `committed`, and runs until SIGTERM;
/// - `memory-publisher`: publishes `CONVOY_EVENTS` through the memory
///   outbox, prints `published` and exits;
/// - `effects`: an engine running [`Effects`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_process() {
    let Ok(role) = std::env::var("CONVOY_PG_CHILD") else {
        return;
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            std::env::var("CONVOY_CHILD_LOG").unwrap_or_else(|_| "convoy_runtime=info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .try_init();
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} is not set"));
    let redis = var("CONVOY_REDIS");
    let db = var("CONVOY_PG");
    let instance = var("CONVOY_INSTANCE");
    let events = decode(&std::env::var("CONVOY_EVENTS").unwrap_or_default());
    let config = config_for(&redis, &db);
    match role.as_str() {
        "writer" => {
            let d = publisher(config, &instance);
            let pool = PgPool::connect(&db).await.expect("connect");
            for e in &events {
                commit_one(&d, &pool, e).await;
            }
            println!("committed");
            std::future::pending::<()>().await;
        }
        "relay" => relay_domain(config, &redis, &instance)
            .engine()
            .run_until(convoy_runtime::shutdown_signal())
            .await
            .expect("relay"),
        "publisher" => {
            let d = publisher(config, &instance);
            let engine = d.engine().spawn();
            let pool = PgPool::connect(&db).await.expect("connect");
            for e in &events {
                commit_one(&d, &pool, e).await;
            }
            println!("committed");
            convoy_runtime::shutdown_signal().await;
            engine.shutdown().await.expect("shutdown");
        }
        "memory-publisher" => {
            publish(
                &publisher(test_config(&redis), &instance),
                &events,
                Priority::Normal,
            )
            .await;
            println!("published");
        }
        "effects" => {
            let stall = |k: &str| std::env::var(k).ok().map(|v| decode(&v)[0].clone());
            // As `AppliedEvents` recommends: PostgreSQL ends the session
            // of an owner stalled inside its transaction, so the row lock
            // it holds cannot hold up the next owner for long.
            let options = PgConnectOptions::from_str(&db)
                .expect("url")
                .options([("idle_in_transaction_session_timeout", "1000")]);
            let pool = PgPoolOptions::new()
                .max_connections(4)
                .connect_lazy_with(options);
            let applied = PgOutbox::from_config(&config.outbox)
                .expect("outbox")
                .applied_events();
            let handler = Effects {
                pool,
                applied,
                instance: instance.clone(),
                stall_before_claim: stall("CONVOY_STALL_BEFORE_CLAIM"),
                stall_after_commit: stall("CONVOY_STALL_AFTER_COMMIT"),
            };
            Domain::builder()
                .config(test_config(&redis))
                .instance_id(&instance)
                .handler(handler)
                .init()
                .expect("domain")
                .engine()
                .run_until(convoy_runtime::shutdown_signal())
                .await
                .expect("engine");
        }
        other => panic!("unknown child role {other:?}"),
    }
}

/// A domain without handlers (its engine is the outbox relay only); with
/// `CONVOY_RESPONSE_TIMEOUT_MS`, its Redis commands wait that long for a
/// reply (a test holding a batch in a paused proxy for longer than the
/// default 5 s).
fn relay_domain(config: convoy_runtime::Config, redis: &str, instance: &str) -> Domain {
    let Some(ms) = std::env::var("CONVOY_RESPONSE_TIMEOUT_MS").ok() else {
        return publisher(config, instance);
    };
    let broker = RedisBroker::from_url(redis)
        .expect("broker")
        .response_timeout(Duration::from_millis(ms.parse().expect("ms")));
    Domain::builder()
        .config(config)
        .instance_id(instance)
        .broker(broker)
        .init()
        .expect("relay domain")
}

/// A `sequential_by` handler whose effect is a row in `effects`, written
/// exactly once with [`AppliedEvents`] in the handler's own transaction.
/// Every step is noted in `attempts` (outside that transaction), so a test
/// can tell what each owner did: `started`, then `applied`, `already`
/// (a re-run: nothing written), `fenced` (refused: rolled back) or `error`.
#[derive(Debug)]
pub struct Effects {
    pool: PgPool,
    applied: AppliedEvents,
    instance: String,
    /// This event sleeps [`STALL`] before its transaction (where the test
    /// stops or kills the process).
    stall_before_claim: Option<Posted>,
    /// This event sleeps [`STALL`] after its commit, before returning (and
    /// so before its ack).
    stall_after_commit: Option<Posted>,
}

impl Effects {
    async fn note(&self, e: &Posted, generation: i64, outcome: &str) -> Result<(), HandlerError> {
        sqlx::query(
            "INSERT INTO attempts (key, seq, instance, generation, outcome) VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(&e.client_id)
        .bind(e.seq as i64)
        .bind(&self.instance)
        .bind(generation)
        .bind(outcome)
        .execute(&self.pool)
        .await?;
        Ok(())
    }
}

#[event_handler(part_of = Ledger, sequential_by = "client_id")]
impl Effects {
    #[handle]
    async fn posted(&self, e: Posted, ctx: &Context) -> Result<(), HandlerError> {
        let generation = ctx.fence().map_or(0, |f| f.generation) as i64;
        self.note(&e, generation, "started").await?;
        if self
            .stall_before_claim
            .as_ref()
            .is_some_and(|s| s.id() == e.id())
        {
            tokio::time::sleep(STALL).await;
        }
        let mut tx = self.pool.begin().await?;
        match self.applied.claim(&mut tx, ctx).await {
            Ok(Applied::New) => {}
            Ok(Applied::AlreadyApplied) => {
                tx.rollback().await?;
                self.note(&e, generation, "already").await?;
                return Ok(());
            }
            Err(err) => {
                let _ = tx.rollback().await;
                let outcome = match err {
                    Error::FencedWrite { .. } => "fenced",
                    _ => "error",
                };
                self.note(&e, generation, outcome).await?;
                return Err(err.into());
            }
        }
        sqlx::query("INSERT INTO effects (key, seq, instance, generation) VALUES ($1, $2, $3, $4)")
            .bind(&e.client_id)
            .bind(e.seq as i64)
            .bind(&self.instance)
            .bind(generation)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        self.note(&e, generation, "applied").await?;
        if self
            .stall_after_commit
            .as_ref()
            .is_some_and(|s| s.id() == e.id())
        {
            tokio::time::sleep(STALL).await;
        }
        Ok(())
    }
}

/// `key:seq,key:seq,...`
fn encode(events: &[Posted]) -> String {
    events
        .iter()
        .map(|e| format!("{}:{}", e.client_id, e.seq))
        .collect::<Vec<_>>()
        .join(",")
}

fn decode(s: &str) -> Vec<Posted> {
    s.split(',')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, seq) = p.rsplit_once(':').expect("key:seq");
            Posted::new(k, seq.parse().expect("seq"))
        })
        .collect()
}

/// Commits `e` in a transaction of its own with a row in the test's
/// `commits (key, seq)` table, whose commit timestamp is the transaction's.
async fn commit_one(d: &Domain, pool: &PgPool, e: &Posted) {
    let mut tx = pool.begin().await.expect("begin");
    let mut uow = d.unit_of_work();
    uow.raise(e.clone()).expect("raise");
    uow.commit_in(&mut tx).await.expect("commit_in");
    sqlx::query("INSERT INTO commits (key, seq) VALUES ($1, $2)")
        .bind(&e.client_id)
        .bind(e.seq as i64)
        .execute(&mut *tx)
        .await
        .expect("commit log");
    tx.commit().await.expect("commit");
}

/// A child process of this test binary, with its stdout lines and its
/// stderr (the runtime's log) in a file.
struct Child {
    process: ChildEngine,
    log: PathBuf,
    lines: mpsc::Receiver<String>,
}

impl Child {
    /// `role` as `instance` with PostgreSQL and the log directory of `env`.
    fn spawn(env: &PgEnv, role: &str, instance: &str, redis: &str, vars: &[(&str, &str)]) -> Child {
        Child::spawn_in(env.pg.dir(), &env.db_url, role, instance, redis, vars)
    }

    fn spawn_in(
        dir: &Path,
        db_url: &str,
        role: &str,
        instance: &str,
        redis: &str,
        vars: &[(&str, &str)],
    ) -> Child {
        // CONVOY_KEEP_LOGS=dir keeps the children's logs there (the
        // server's directory is removed with it).
        let dir = match std::env::var_os("CONVOY_KEEP_LOGS") {
            Some(keep) => {
                let keep = PathBuf::from(keep).join(format!("{}", dir.display()).replace('/', "_"));
                std::fs::create_dir_all(&keep).expect("log directory");
                keep
            }
            None => dir.to_owned(),
        };
        let log = dir.join(format!("{role}-{instance}.log"));
        let stderr = std::fs::File::create(&log).expect("log file");
        let mut cmd: Command = current_test_command("child_process").expect("command");
        cmd.env("CONVOY_PG_CHILD", role)
            .env("CONVOY_INSTANCE", instance)
            .env("CONVOY_REDIS", redis)
            .env("CONVOY_PG", db_url)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr);
        for (k, v) in vars {
            cmd.env(k, v);
        }
        let mut process = ChildEngine::spawn(&mut cmd).expect("spawn child");
        let out = process.child_mut().stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Child {
            process,
            log,
            lines,
        }
    }

    /// Waits until the child printed `want` on a line of its own.
    fn wait_for_line(&self, want: &str) {
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                // The test harness starts the line (`test child_process ... `).
                Ok(line) if line.trim_end().ends_with(want) => return,
                Ok(_) => {}
                Err(_) => panic!(
                    "the child did not print {want:?}; its log:\n{}",
                    self.log_text()
                ),
            }
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

// ---------------------------------------------------------------------
// Reading what happened.
// ---------------------------------------------------------------------

/// Migrates the outbox and creates the test's commit log; a pool.
async fn prepare(env: &PgEnv) -> PgPool {
    env.outbox().await;
    env.pg
        .psql("app", "CREATE TABLE commits (key text, seq bigint)")
        .expect("commit log table");
    env.pool().await
}

async fn pending(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM convoy_outbox WHERE status = 0")
        .fetch_one(pool)
        .await
        .expect("pending")
}

/// The (key, seq) of every pending row.
async fn pending_events(pool: &PgPool) -> BTreeSet<(String, u64)> {
    let rows: Vec<String> =
        sqlx::query_scalar("SELECT envelope FROM convoy_outbox WHERE status = 0")
            .fetch_all(pool)
            .await
            .expect("pending rows");
    rows.iter()
        .map(|json| {
            let env: convoy_runtime::Envelope = serde_json::from_str(json).expect("envelope");
            let p: Posted = serde_json::from_str(&env.payload).expect("payload");
            (p.client_id, p.seq)
        })
        .collect()
}

async fn stream_total(env: &PgEnv, keys: &[&str]) -> usize {
    let mut n = 0;
    for k in keys {
        n += env.stream(k).await.len();
    }
    n
}

/// Waits until nothing is pending and every committed row (the test's
/// commit log) is on the streams, then checks per key that the stream
/// holds exactly the committed rows, each once, in commit order.
async fn assert_published_once_in_commit_order(env: &PgEnv, pool: &PgPool, keys: &[&str]) {
    let order = env.commit_log();
    let total: usize = order.values().map(Vec::len).sum();
    assert!(total > 0, "something was committed");
    wait_until(WAIT, "every committed row published", || async {
        pending(pool).await == 0 && stream_total(env, keys).await >= total
    })
    .await;
    // A late duplicate (a stale or re-sending relay) would show by now.
    tokio::time::sleep(Duration::from_millis(500)).await;
    for k in keys {
        let on_stream = seqs(&env.stream(k).await);
        let committed = order.get(*k).cloned().unwrap_or_default();
        let distinct: BTreeSet<u64> = on_stream.iter().copied().collect();
        assert_eq!(
            distinct.len(),
            on_stream.len(),
            "key {k}: a row reached the stream twice: {on_stream:?}"
        );
        assert_eq!(
            on_stream, committed,
            "key {k}: the stream must hold every committed row once, in commit order"
        );
    }
}

/// Writers committing continuously in this process (no relay here) over
/// `keys`; `gate.write()` holds them between transactions.
struct Writers {
    stop: Arc<AtomicBool>,
    gate: Arc<tokio::sync::RwLock<()>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Writers {
    fn start(
        d: &Domain,
        pool: &PgPool,
        writers: u64,
        keys: &[&'static str],
        pause: Duration,
    ) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let gate = Arc::new(tokio::sync::RwLock::new(()));
        let keys: Vec<&'static str> = keys.to_vec();
        let tasks = (0..writers)
            .map(|w| {
                let (d, pool, stop, gate, keys) = (
                    d.clone(),
                    pool.clone(),
                    stop.clone(),
                    gate.clone(),
                    keys.clone(),
                );
                tokio::spawn(async move {
                    let mut rng = (w + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                    let mut i = 0;
                    while !stop.load(Ordering::SeqCst) {
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        let key = keys[(rng % keys.len() as u64) as usize];
                        {
                            let _open = gate.read().await;
                            commit_one(&d, &pool, &Posted::new(key, w * 1_000_000 + i)).await;
                        }
                        i += 1;
                        tokio::time::sleep(pause).await;
                    }
                })
            })
            .collect();
        Writers { stop, gate, tasks }
    }

    async fn finish(self) {
        self.stop.store(true, Ordering::SeqCst);
        for t in self.tasks {
            t.await.expect("writer");
        }
    }
}

fn proxy_to(env: &PgEnv) -> FaultProxy {
    FaultProxy::start(SocketAddr::from(([127, 0, 0, 1], env.redis.port()))).expect("proxy")
}

fn publish_script() -> Match {
    Match::Script(script_sha("publish").expect("convoy ships publish.lua"))
}

// ---------------------------------------------------------------------
// The outbox relay.
// ---------------------------------------------------------------------

/// Issue 11, test 1. Guards: `commit_in` writes the outbox rows in the
/// caller's transaction, so a writer killed right after `tx.commit()` (no
/// relay running anywhere) leaves them in PostgreSQL, and a relay in
/// another process publishes each once, in commit order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_killed_after_its_commit_loses_nothing_its_rows_publish_once_in_order() {
    let env = PgEnv::start();
    let pool = prepare(&env).await;
    let keys = ["w0", "w1"];
    let events: Vec<Posted> = (0..4)
        .flat_map(|s| keys.map(|k| Posted::new(k, s)))
        .collect();
    let encoded = encode(&events);
    let mut writer = Child::spawn(
        &env,
        "writer",
        "w",
        &env.redis.url(),
        &[("CONVOY_EVENTS", &encoded)],
    );
    writer.wait_for_line("committed");
    writer.process.kill9().expect("kill -9");
    assert_eq!(
        pending(&pool).await,
        events.len() as i64,
        "the committed rows wait in PostgreSQL"
    );
    assert_eq!(stream_total(&env, &keys).await, 0, "no relay ran yet");

    let relay = Child::spawn(&env, "relay", "r", &env.redis.url(), &[]);
    assert_published_once_in_commit_order(&env, &pool, &keys).await;
    for k in keys {
        assert_eq!(seqs(&env.stream(k).await), vec![0, 1, 2, 3]);
    }
    drop(relay);
}

/// Issue 11, test 4. Guards: a standby replica takes the relay over when
/// the leader dies, and the broker drops the rows of the leader's last
/// batch (published, not yet marked) when the new leader sends them again
/// (dedup by each row's own seq in `publish.lua`): every committed row on
/// its partition stream exactly once, per key in commit order, while
/// writers keep committing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_relays_with_the_leader_killed_mid_batch_publish_every_row_once_in_order() {
    let env = PgEnv::start();
    let pool = prepare(&env).await;
    let proxy = proxy_to(&env);
    let keys = ["m0", "m1", "m2", "m3"];
    let d = publisher(env.config(), "writers");
    let writers = Writers::start(&d, &pool, 3, &keys, Duration::from_millis(5));
    // a reaches Redis through the proxy; it starts first, so it leads.
    let mut a = Child::spawn(&env, "relay", "a", &proxy.url(), &[]);
    wait_until(WAIT, "a publishes", || async {
        stream_total(&env, &keys).await > 0
    })
    .await;
    let b = Child::spawn(&env, "relay", "b", &env.redis.url(), &[]);
    tokio::time::sleep(Duration::from_millis(500)).await;

    // a's next batch runs in Redis, but its reply is held: the rows are on
    // the streams and still pending in PostgreSQL when a dies.
    proxy.delay_reply(publish_script(), Duration::from_secs(30), 1);
    wait_until(WAIT, "a's batch ran in Redis", || async {
        proxy.fired() == 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut on_streams = BTreeSet::new();
    for k in keys {
        for p in env.stream(k).await {
            on_streams.insert((p.client_id, p.seq));
        }
    }
    let mid_batch: Vec<_> = pending_events(&pool)
        .await
        .intersection(&on_streams)
        .cloned()
        .collect();
    assert!(
        !mid_batch.is_empty(),
        "a is killed mid-batch: published rows not yet marked published"
    );
    a.process.kill9().expect("kill -9");

    // b takes over (a's session closed with it) while the writers go on,
    // and sends a's batch again: the broker must drop it.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    writers.finish().await;
    assert_published_once_in_commit_order(&env, &pool, &keys).await;
    assert!(
        b.log_text().contains("this instance publishes"),
        "b took over:\n{}",
        b.log_text()
    );
    drop(b);
}

/// Issue 11, test 4 (the stall). Guards: a leader stalled by `SIGSTOP`
/// loses its leadership after `leader_timeout_ms` (its session ends), and
/// the batch it had read and sent before the stall, reaching Redis after
/// its successor published later rows, is refused by the epoch check in
/// `publish.lua`: nothing published twice or out of order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_relay_leader_is_replaced_and_its_stale_batch_is_refused_by_the_epoch() {
    let env = PgEnv::start();
    let pool = prepare(&env).await;
    let proxy = proxy_to(&env);
    let keys = ["s0", "s1", "s2"];
    let d = publisher(env.config(), "writers");
    let writers = Writers::start(&d, &pool, 3, &keys, Duration::from_millis(10));
    // a's batch may wait in the paused proxy for a few seconds: past the
    // default response timeout on a loaded machine.
    let mut a = Child::spawn(
        &env,
        "relay",
        "a",
        &proxy.url(),
        &[("CONVOY_RESPONSE_TIMEOUT_MS", "60000")],
    );
    wait_until(WAIT, "a publishes", || async {
        stream_total(&env, &keys).await > 0
    })
    .await;
    let b = Child::spawn(&env, "relay", "b", &env.redis.url(), &[]);
    tokio::time::sleep(Duration::from_millis(500)).await;

    // a is idle (everything published) when its link to Redis freezes;
    // then rows commit: a reads them and sends a batch that the proxy holds.
    {
        let _held = writers.gate.write().await;
        wait_until(WAIT, "a is idle", || async { pending(&pool).await == 0 }).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        proxy.pause();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    a.process.stop().expect("SIGSTOP");
    let stopped = Instant::now();
    let at_stop = stream_total(&env, &keys).await;
    wait_until(WAIT, "b took over and publishes", || async {
        stream_total(&env, &keys).await > at_stop
    })
    .await;
    let took_over = stopped.elapsed();
    assert!(
        took_over >= Duration::from_millis(500),
        "b published {took_over:?} after a stalled: before a's session could end"
    );
    // b publishes many batches after the rows of a's held one (its own
    // copies of them included), then a's stale batch reaches Redis.
    tokio::time::sleep(Duration::from_millis(800)).await;
    proxy.resume();
    tokio::time::sleep(Duration::from_millis(300)).await;
    a.process.cont().expect("SIGCONT");
    tokio::time::sleep(Duration::from_millis(700)).await;
    writers.finish().await;

    assert_published_once_in_commit_order(&env, &pool, &keys).await;
    assert!(
        a.log_text().contains("another replica publishes now"),
        "a's stale batch was refused by its epoch:\n{}",
        a.log_text()
    );
    let epoch = env
        .pg
        .psql("app", "SELECT epoch FROM convoy_outbox_relay")
        .expect("epoch");
    assert!(epoch.parse::<u64>().expect("epoch") >= 2, "epoch {epoch}");
    drop(b);
}

// ---------------------------------------------------------------------
// Exactly-once handler effects.
// ---------------------------------------------------------------------

async fn prepare_effects(env: &PgEnv) -> PgPool {
    env.outbox().await;
    env.pg
        .psql(
            "app",
            "CREATE TABLE effects (id bigserial, key text, seq bigint, instance text, generation bigint);
             CREATE TABLE attempts (id bigserial, key text, seq bigint, instance text, generation bigint,
                                    outcome text, at timestamptz NOT NULL DEFAULT clock_timestamp())",
        )
        .expect("effect tables");
    env.pool().await
}

async fn effects_count(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM effects")
        .fetch_one(pool)
        .await
        .expect("effects")
}

/// Per key, the effects as (seq, instance, generation), in commit order.
async fn effects(pool: &PgPool) -> BTreeMap<String, Vec<(u64, String, i64)>> {
    let rows: Vec<(String, i64, String, i64)> = sqlx::query_as(
        "SELECT key, seq, instance, generation FROM effects
         ORDER BY pg_xact_commit_timestamp(xmin), id",
    )
    .fetch_all(pool)
    .await
    .expect("effects");
    let mut m: BTreeMap<String, Vec<(u64, String, i64)>> = BTreeMap::new();
    for (k, s, i, g) in rows {
        m.entry(k).or_default().push((s as u64, i, g));
    }
    m
}

/// Checks every event's effect is in the database once, in order.
async fn assert_effects_once_in_order(pool: &PgPool, events: &[Posted]) {
    let got = effects(pool).await;
    for (key, ids) in support::published(events) {
        let want: Vec<u64> = ids
            .iter()
            .map(|id| id.rsplit_once('#').expect("id").1.parse().expect("seq"))
            .collect();
        let seqs: Vec<u64> = got
            .get(&key)
            .map(|v| v.iter().map(|(s, _, _)| *s).collect())
            .unwrap_or_default();
        assert_eq!(
            seqs,
            want,
            "key {key}: each event's effect exactly once, in publish order ({:?})",
            got.get(&key)
        );
    }
}

async fn pg_now(pool: &PgPool) -> f64 {
    sqlx::query_scalar("SELECT extract(epoch FROM clock_timestamp())::float8")
        .fetch_one(pool)
        .await
        .expect("now")
}

/// Whether `instance` noted `outcome` for `event`.
async fn noted(pool: &PgPool, instance: &str, event: &Posted, outcome: &str) -> bool {
    let n: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM attempts
         WHERE instance = $1 AND key = $2 AND seq = $3 AND outcome = $4",
    )
    .bind(instance)
    .bind(&event.client_id)
    .bind(event.seq as i64)
    .bind(outcome)
    .fetch_one(pool)
    .await
    .expect("attempts");
    n > 0
}

/// The exactly-once tests' start: both servers, the effects tables, 3 keys
/// of 8 events published, and owner `a` running until it pauses in `c0#3`
/// at the step `stall` names (it notes `note` there first).
struct EffectsRun {
    env: PgEnv,
    pool: sqlx::PgPool,
    url: String,
    events: Vec<Posted>,
    stalled: Posted,
    a: Child,
}

async fn effects_owner_paused_at(stall: &str, note: &str) -> EffectsRun {
    let env = PgEnv::start();
    let pool = prepare_effects(&env).await;
    let url = env.redis.url();
    let events = interleaved(3, 8);
    publish(
        &publisher(test_config(&url), "p"),
        &events,
        Priority::Normal,
    )
    .await;
    let stalled = Posted::new("c0", 3);
    let at = encode(std::slice::from_ref(&stalled));
    let a = Child::spawn(&env, "effects", "a", &url, &[(stall, &at)]);
    wait_until(WAIT, &format!("a {note} c0#3"), || {
        noted(&pool, "a", &stalled, note)
    })
    .await;
    EffectsRun {
        env,
        pool,
        url,
        events,
        stalled,
        a,
    }
}

/// Issue 11, test 6 (the stall). Guards: `AppliedEvents::claim` refuses an
/// owner whose lease generation is older than the row's (a `SIGSTOP`-ed
/// owner whose lease was taken over): its transaction rolls back, and
/// every event's effect is in the database once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_owner_whose_lease_was_taken_over_has_its_write_refused() {
    // a is stopped in c0#3, before its transaction.
    let EffectsRun {
        env,
        pool,
        url,
        events,
        stalled: _,
        mut a,
    } = effects_owner_paused_at("CONVOY_STALL_BEFORE_CLAIM", "started").await;
    a.process.stop().expect("SIGSTOP");
    // Past a's lease (2 s) b takes c0 over and applies c0#3 onwards.
    let b = Child::spawn(&env, "effects", "b", &url, &[]);
    wait_until(WAIT, "b applied the rest", || async {
        effects_count(&pool).await >= events.len() as i64
    })
    .await;
    let resumed_at = pg_now(&pool).await;
    a.process.cont().expect("SIGCONT");
    // a's handler of c0#3 goes on now, after the takeover: its claim must
    // be refused and its transaction rolled back.
    wait_until(WAIT, "a's stale handler finished", || async {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM attempts
             WHERE instance = 'a' AND outcome <> 'started' AND at > to_timestamp($1)",
        )
        .bind(resumed_at)
        .fetch_one(&pool)
        .await
        .expect("attempts");
        n > 0
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;

    let stale: Vec<(String, i64, String)> = sqlx::query_as(
        "SELECT key, seq, outcome FROM attempts
         WHERE instance = 'a' AND outcome <> 'started' AND at > to_timestamp($1)",
    )
    .bind(resumed_at)
    .fetch_all(&pool)
    .await
    .expect("attempts");
    // (a was stopped in the middle of c1's and c2's current events too, at
    // any step: those may end in any way but a late effect, checked below.)
    let c0: Vec<_> = stale.iter().filter(|(k, _, _)| k == "c0").collect();
    assert_eq!(
        c0,
        [&("c0".to_owned(), 3, "fenced".to_owned())],
        "a's write of c0#3 after the takeover is refused (FencedWrite): {stale:?}"
    );
    let late: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM effects
         WHERE instance = 'a' AND pg_xact_commit_timestamp(xmin) > to_timestamp($1)",
    )
    .bind(resumed_at)
    .fetch_one(&pool)
    .await
    .expect("late effects");
    assert_eq!(late, 0, "no effect of a committed after it resumed");
    assert_effects_once_in_order(&pool, &events).await;
    // c0: a's effects up to c0#2, then b's at a newer generation.
    let c0 = effects(&pool).await.remove("c0").expect("c0");
    let owners: Vec<&str> = c0.iter().map(|(_, i, _)| i.as_str()).collect();
    assert_eq!(owners, ["a", "a", "a", "b", "b", "b", "b", "b"], "{c0:?}");
    assert!(c0[3].2 > c0[2].2, "b's generation is newer: {c0:?}");
    drop(a);
    drop(b);
}

/// Issue 11, test 6 (the crash). Guards: `AppliedEvents::claim` recognises
/// an event whose effects committed before (the owner was killed after its
/// commit, before its ack): the new owner's re-run writes nothing, and
/// every event's effect is in the database once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owner_killed_between_its_commit_and_its_ack_is_rerun_without_a_second_effect() {
    // a is killed in c0#3, after its commit and before its ack.
    let EffectsRun {
        env,
        pool,
        url,
        events,
        stalled,
        mut a,
    } = effects_owner_paused_at("CONVOY_STALL_AFTER_COMMIT", "applied").await;
    a.process.kill9().expect("kill -9");
    let b = Child::spawn(&env, "effects", "b", &url, &[]);
    wait_until(WAIT, "b applied the rest", || async {
        effects_count(&pool).await >= events.len() as i64
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;

    assert_effects_once_in_order(&pool, &events).await;
    assert!(
        noted(&pool, "b", &stalled, "already").await,
        "b re-ran c0#3 (committed by a, never acknowledged) as already applied"
    );
    let c0 = effects(&pool).await.remove("c0").expect("c0");
    let owners: Vec<&str> = c0.iter().map(|(_, i, _)| i.as_str()).collect();
    assert_eq!(owners, ["a", "a", "a", "a", "b", "b", "b", "b"], "{c0:?}");
    drop(b);
}

// ---------------------------------------------------------------------
// Producer identity across restarts.
// ---------------------------------------------------------------------

/// Issue 11, test 7, for `MemoryOutbox`: it numbers its records from 1 in
/// every process, so a process restarted under the same instance id must
/// publish under another producer name, or its first records are dropped
/// as "already published". (`redis_faults.rs`'s
/// `a_publisher_restarted_under_the_same_instance_id_loses_nothing` checks
/// the same with two outboxes in one process; this is the real restart.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_outbox_publisher_restarted_under_the_same_instance_id_loses_nothing() {
    let redis = RedisServer::start().expect("redis");
    let url = redis.url();
    for run in 0..2u64 {
        let events: Vec<Posted> = (run * 3..run * 3 + 3)
            .map(|s| Posted::new("q", s))
            .collect();
        let encoded = encode(&events);
        let mut p = Child::spawn_in(
            redis.dir(),
            "",
            "memory-publisher",
            "p",
            &url,
            &[("CONVOY_EVENTS", &encoded)],
        );
        p.wait_for_line("published");
        assert!(
            p.process.wait_timeout(WAIT).expect("wait").is_some(),
            "the publisher exits"
        );
    }
    assert_eq!(
        seqs(&support::pg::stream_of(&url, "q").await),
        (0..6).collect::<Vec<_>>(),
        "the second run's records were dropped as already published"
    );
}

/// Issue 11, test 7, for `PgOutbox`: three runs of one process under the
/// same instance id (stopped cleanly, then killed with a batch published
/// but not marked): every run's rows published, none dropped as "already
/// published", none twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_outbox_publisher_restarted_under_the_same_instance_id_loses_nothing() {
    let env = PgEnv::start();
    let pool = prepare(&env).await;
    let proxy = proxy_to(&env);
    let run = |from: u64| -> String {
        encode(
            &(from..from + 3)
                .map(|s| Posted::new("r", s))
                .collect::<Vec<_>>(),
        )
    };

    // Run 1 publishes and stops cleanly.
    let first = run(0);
    let mut p = Child::spawn(
        &env,
        "publisher",
        "p",
        &env.redis.url(),
        &[("CONVOY_EVENTS", &first)],
    );
    p.wait_for_line("committed");
    wait_until(WAIT, "run 1 published", || async {
        env.stream("r").await.len() == 3 && pending(&pool).await == 0
    })
    .await;
    p.process.terminate(WAIT).expect("SIGTERM");

    // Run 2, under the same instance id, is killed with its batch
    // published but not marked: the next run sends it again.
    proxy.delay_reply(publish_script(), Duration::from_secs(30), 1);
    let second = run(3);
    let mut p = Child::spawn(
        &env,
        "publisher",
        "p",
        &proxy.url(),
        &[("CONVOY_EVENTS", &second)],
    );
    p.wait_for_line("committed");
    wait_until(WAIT, "run 2's batch ran in Redis", || async {
        proxy.fired() == 1
    })
    .await;
    p.process.kill9().expect("kill -9");
    assert!(
        pending(&pool).await > 0,
        "run 2 died before marking its rows"
    );

    // Run 3, the same instance id again.
    let third = run(6);
    let p = Child::spawn(
        &env,
        "publisher",
        "p",
        &env.redis.url(),
        &[("CONVOY_EVENTS", &third)],
    );
    p.wait_for_line("committed");
    assert_published_once_in_commit_order(&env, &pool, &["r"]).await;
    assert_eq!(seqs(&env.stream("r").await), (0..9).collect::<Vec<_>>());
    drop(p);
}
