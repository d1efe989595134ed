//! Randomized fault schedules (issue #9, "Testing"): three engine processes
//! and a publisher share one Redis while a seeded schedule of faults hits
//! them, then everything is healed, drained and checked per key.
//!
//! Per schedule: a system-under-test `redis-server` with the append-only
//! file (`appendfsync always`), and a separate *record* server that is never
//! faulted, where the handlers record every enter and exit (instance,
//! process and fence generation) in the layout of the testing kit's
//! `Recorder` (`support/record.rs`). The engines are this test binary
//! re-executed (`child_engine`, selected by `CONVOY_FAULT_CHILD`), with a
//! 600 ms Redis response timeout; the publisher (its own engine, memory
//! outbox) runs in the test process. Engines and publisher reach Redis
//! through a `FaultProxy`. The faults, chosen from the seed only (their
//! timing is the machine's): `kill -9` of an engine (restarted under the
//! same or a new instance id), `SIGSTOP` past (or within) the lease then
//! `SIGCONT`, Redis stop+restart and kill+restart (often while an engine is
//! stopped), Redis frozen (`SIGSTOP`), `CLIENT PAUSE`, and through the
//! proxy: every connection cut, all traffic paused, the replies of one of
//! convoy's scripts (read, ack, claim, fail, acquire, release, reap,
//! publish) or of a plain command (SET, XREAD, SSCAN) delayed past the
//! response timeout or dropped after Redis ran the request. In half the
//! schedules the handlers' own dependency is also down for 0.5-3 s: every
//! key fails with `HandlerError::transient` meanwhile, none may halt.
//!
//! The checks, per key, from the record server: (1) every committed event
//! was handled to completion at least once; (2) nothing handled out of
//! order, re-runs only as in-order replays no longer than `max_unacked`;
//! (3) no two windows of different events of one key overlap, except a
//! stalled owner finishing the event it had in flight (see
//! `faults::overlap_allowed`); (4) a fence generation of a key is seen by
//! one process only, and never goes back from one started window to the
//! next. A window runs from the engine's dispatch of the attempt (`Context::dispatched_at`) to its exit record. Every failure prints the seed, the faults,
//! a replay command and a directory that keeps the engines' logs
//! (`{instance}-p{process}.log`), the timeline of the faults on the record
//! server's clock (`timeline.txt`), and what convoy left in Redis for the
//! keys in question with their windows (`evidence.txt`). Even seeds run
//! with `max_unacked = 1`, seeds of the form 4n+1 with `5`, and seeds of
//! the form 4n+3 with `100` after a backlog of 110-200 events per key
//! committed at the start: their owners read whole batches of new entries
//! and send each next read ahead while they handle the batch in hand (see
//! `Worker::read_ahead`), under the same faults. A seed gives the same
//! faults as long as `faults::plan` and `Settings::new` are unchanged.
//!
//! The three ways to run it:
//!
//! ```sh
//! # the bounded run, part of `cargo test --workspace --all-features` (30 schedules):
//! cargo test -p convoy-tests --test fault_schedules -- bounded_run --nocapture
//! # one seed again (its faults are the same; the engines log to the printed directory):
//! CONVOY_FAULT_SEED=1234 cargo test -p convoy-tests --test fault_schedules -- replay --nocapture
//! # a long run (CONVOY_FAULT_BASE=n picks the first seed, default: from the clock):
//! CONVOY_FAULT_SCHEDULES=300 cargo test --release -p convoy-tests --test fault_schedules -- --ignored long_run --nocapture
//! ```
//!
//! `CONVOY_FAULT_LOG` sets the engines' `RUST_LOG` (default
//! `convoy_runtime=info`); `CONVOY_FAULT_KEEP=1` keeps the log directory of
//! passing schedules too.

#[path = "support/faults.rs"]
mod faults;
#[path = "support/redis_schedule.rs"]
mod schedule;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use convoy_runtime::redis::RedisBroker;
use convoy_runtime::testing::{FaultProxy, Match, Recorder, RedisServer, Window, script_sha};
use convoy_runtime::{Aggregate, Config, Context, Domain, Event, HandlerError, event_handler};
use engine_slots::{ChildEnv, EngineSlots, run_timeline};
use faults::{Action, Observed, PlanParams, Planned, Rng, Verdict};
use schedule::{engine_slots, record, schedule_dir, schedule_io, schedule_run};
use schedule_dir::{log_dir, write_file};
use schedule_io::{
    Attempts, Notes, Workload, drain, drain_note, evidence_tail, failure_line, handler_group,
    key_evidence, outbox_left, publish_spread, record_clock, windows,
};
use schedule_run::{Ran, ScheduleOutcome, bounded_seeds, env_u64, long_seeds, write_schedule};
use serde::{Deserialize, Serialize};

/// Engine processes per schedule.
const ENGINES: usize = 3;
/// Faults start within this time; events are published over it too.
const PHASE: Duration = Duration::from_millis(3500);
const LEASE_TTL_MS: u64 = 1200;
const HEARTBEAT_S: f64 = 0.3;
/// The engines' Redis response timeout: delayed replies go past it.
const RESPONSE_TIMEOUT: Duration = Duration::from_millis(600);
/// The longest wait for the drain after healing.
const DRAIN: Duration = Duration::from_secs(60);
/// The drain gives up earlier when nothing completes for this long.
const STUCK: Duration = Duration::from_secs(12);
/// Whether engines and the publisher go through a [`FaultProxy`] (and the
/// schedules use its faults).
const PROXY: bool = true;
/// Schedules of the bounded run.
const BOUNDED_SCHEDULES: u64 = 30;

#[derive(Aggregate)]
#[aggregate(category = "faulty")]
struct Account;

/// The `seq`-th event of a client (from 0).
#[derive(Event, Serialize, Deserialize, Debug, Clone)]
#[event(part_of = Account)]
struct Booked {
    client_id: String,
    seq: u64,
}

/// Records enter and exit of every event in the record server (see
/// [`Attempts`]); every key fails transiently while the schedule's
/// dependency is down.
struct FaultRecording(Attempts);

#[event_handler(part_of = Account, sequential_by = "client_id")]
impl FaultRecording {
    #[handle]
    async fn booked(&self, e: Booked, ctx: &Context) -> Result<(), HandlerError> {
        self.0.handle(&e.client_id, e.seq, ctx).await
    }
}

/// What one schedule runs with; all of it follows from the seed.
#[derive(Debug, Clone)]
struct Settings {
    seed: u64,
    max_unacked: usize,
    load: Workload,
    /// Events per key committed at once at the start (0: none).
    backlog: u64,
    faults: Vec<Planned>,
    /// The handlers' dependency down (transient failures of every key):
    /// from, for how long; drawn from its own fork, so the other faults of
    /// a seed are the ones they were before it existed.
    dependency_outage: Option<(Duration, Duration)>,
}

impl Settings {
    fn new(seed: u64, proxy: bool) -> Self {
        let root = Rng::new(seed);
        let load = Workload::draw(&mut root.fork(1), (20, 50));
        let faults = faults::plan(
            &mut root.fork(2),
            &PlanParams {
                phase: PHASE,
                engines: ENGINES,
                lease_ttl: Duration::from_millis(LEASE_TTL_MS),
                response_timeout: RESPONSE_TIMEOUT,
                proxy,
            },
        );
        let mut o = root.fork(3);
        let dependency_outage = o
            .chance(50)
            .then(|| (o.ms(0, PHASE.as_millis() as u64), o.ms(500, 3_000)));
        let (max_unacked, backlog) = match seed % 4 {
            0 | 2 => (1, 0),
            1 => (5, 0),
            _ => (100, root.fork(4).range(110, 200)),
        };
        Settings {
            dependency_outage,
            seed,
            max_unacked,
            load,
            backlog,
            faults,
        }
    }

    /// The workload, for a report.
    fn describe(&self) -> String {
        match self.backlog {
            0 => self.load.describe(),
            n => format!("{} after a backlog of {n} per key", self.load.describe()),
        }
    }

    fn fault_list(&self) -> String {
        let mut items: Vec<String> = self
            .faults
            .iter()
            .map(|p| format!("@{}ms {}", p.at.as_millis(), p.fault))
            .collect();
        if let Some((from, length)) = self.dependency_outage {
            items.push(format!(
                "@{}ms the handlers' dependency down for {} ms (transient failures)",
                from.as_millis(),
                length.as_millis()
            ));
        }
        format!("[{}]", items.join("; "))
    }

    fn incidents(&self) -> usize {
        self.faults.iter().map(|p| p.fault.incidents()).sum()
    }
}

fn replay_command(seed: u64) -> String {
    format!(
        "CONVOY_FAULT_SEED={seed} cargo test -p convoy-tests --test fault_schedules -- replay --nocapture"
    )
}

fn config(url: &str, s: &Settings) -> Config {
    schedule_io::config(
        url,
        LEASE_TTL_MS,
        HEARTBEAT_S,
        s.load.reap_idle_ms,
        s.max_unacked,
    )
}

fn broker(url: &str) -> RedisBroker {
    RedisBroker::from_url(url)
        .expect("a redis URL")
        .response_timeout(RESPONSE_TIMEOUT)
}

/// Runs an engine until SIGTERM when started as a child engine by a
/// schedule (`CONVOY_FAULT_CHILD` set); does nothing otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_engine() {
    let Ok(url) = std::env::var("CONVOY_FAULT_CHILD") else {
        return;
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .try_init();
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set"));
    let seed: u64 = var("CONVOY_FAULT_SCHEDULE").parse().expect("seed");
    let settings = Settings::new(seed, var("CONVOY_FAULT_PROXY") == "1");
    let instance = var("CONVOY_FAULT_INSTANCE");
    let proc = var("CONVOY_FAULT_PROC");
    let record = record::Record::new(
        &var("CONVOY_FAULT_RECORD"),
        &var("CONVOY_FAULT_NS"),
        &format!("p{proc}"),
    )
    .expect("record server client");
    let name = format!("{instance}/p{proc}");
    let handler = FaultRecording(Attempts::new(record, name, seed, &settings.load, true));
    let domain = Domain::builder()
        .config(config(&url, &settings))
        .broker(broker(&url))
        .instance_id(instance)
        .handler(handler)
        .init()
        .expect("engine domain");
    domain
        .engine()
        .shutdown_timeout(Duration::from_secs(3))
        .run_until(async {
            let mut term =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                    .expect("SIGTERM handler");
            term.recv().await;
        })
        .await
        .expect("engine");
}

/// The system under test and its fault injection; owned by the fault
/// thread while the schedule runs.
struct Harness {
    sut: RedisServer,
    proxy: Option<FaultProxy>,
    /// What engines and the publisher connect to.
    engine_url: String,
    ns: String,
    engines: EngineSlots,
    redis_down: bool,
    frozen: bool,
    /// The reply rule in force (one at a time) and `fired()` when it was
    /// added.
    rule: Option<(String, usize)>,
    /// Every reply rule and how often it fired.
    rules: Vec<(String, usize)>,
}

impl Harness {
    fn start(settings: Settings, dir: PathBuf, record: &RedisServer) -> Self {
        let sut = RedisServer::builder()
            .append_only(true)
            .start()
            .expect("system-under-test redis-server");
        let mut clock = record_clock(record);
        let proxy = if PROXY {
            let upstream = std::net::SocketAddr::from(([127, 0, 0, 1], sut.port()));
            Some(FaultProxy::start(upstream).expect("fault proxy"))
        } else {
            None
        };
        let engine_url = proxy.as_ref().map_or_else(|| sut.url(), FaultProxy::url);
        let ns = format!("faults-{}", settings.seed);
        let notes = Notes::start(&mut clock);
        let env = ChildEnv {
            prefix: "CONVOY_FAULT",
            url: engine_url.clone(),
            record_url: record.url(),
            ns: ns.clone(),
            seed: settings.seed,
            extra: vec![(
                "CONVOY_FAULT_PROXY".into(),
                if PROXY { "1" } else { "0" }.into(),
            )],
            log: "convoy_runtime=info",
        };
        Harness {
            proxy,
            ns,
            sut,
            engine_url,
            engines: EngineSlots::start(env, dir, ENGINES, clock, notes),
            redis_down: false,
            frozen: false,
            rule: None,
            rules: Vec::new(),
        }
    }

    fn note(&mut self, what: String) {
        self.engines.note(what);
    }

    fn run(&mut self, timeline: &[(Duration, Action)]) {
        run_timeline(timeline, |action| {
            self.engines.watch_children();
            self.apply(action);
        });
    }

    fn apply(&mut self, action: &Action) {
        match action {
            Action::Kill(slot) => self.engines.kill(*slot),
            Action::Respawn { slot, same_id } => self.engines.respawn(*slot, *same_id),
            Action::Stop(slot) => self.engines.stop(*slot),
            Action::Cont(slot) => self.engines.cont(*slot),
            Action::RedisDown { graceful } => {
                let r = if *graceful {
                    self.sut.stop()
                } else {
                    self.sut.kill()
                };
                r.expect("stop the system-under-test redis");
                self.redis_down = true;
                self.frozen = false;
                self.note(format!(
                    "redis {}",
                    if *graceful { "stopped" } else { "killed" }
                ));
            }
            Action::RedisUp => self.redis_up(),
            Action::Freeze => {
                self.sut.freeze().expect("freeze redis");
                self.frozen = true;
                self.note("redis frozen".into());
            }
            Action::Thaw => self.thaw(),
            Action::ClientPause(d) => {
                let r = self.sut_command(
                    redis::cmd("CLIENT")
                        .arg("PAUSE")
                        .arg(d.as_millis() as u64)
                        .arg("ALL"),
                );
                self.note(format!("CLIENT PAUSE {} ms: {r}", d.as_millis()));
            }
            Action::ProxyCut => {
                if let Some(p) = &self.proxy {
                    p.cut_all();
                }
                self.note_proxy("proxy cut_all");
            }
            Action::ProxyPause => {
                if let Some(p) = &self.proxy {
                    p.pause();
                }
                self.note_proxy("proxy paused");
            }
            Action::ProxyResume => {
                if let Some(p) = &self.proxy {
                    p.resume();
                }
                self.note_proxy("proxy resumed");
            }
            Action::Delay {
                target,
                delay,
                times,
            } => {
                if let Some(p) = &self.proxy {
                    p.delay_reply(matcher(target), *delay, *times);
                    self.rule = Some((format!("delay {target}"), p.fired()));
                }
                self.note_proxy(&format!(
                    "proxy: delay the next {times} {target} replies by {} ms",
                    delay.as_millis()
                ));
            }
            Action::Drop { target, times } => {
                if let Some(p) = &self.proxy {
                    p.drop_reply(matcher(target), *times);
                    self.rule = Some((format!("drop {target}"), p.fired()));
                }
                self.note_proxy(&format!("proxy: drop the next {times} {target} replies"));
            }
            Action::ProxyClear => self.clear_rules(),
        }
    }

    /// Forgets the reply rule in force, noting how often it fired.
    fn clear_rules(&mut self) {
        if let Some(p) = &self.proxy {
            p.clear();
            if let Some((rule, before)) = self.rule.take() {
                let fired = p.fired().saturating_sub(before);
                self.rules.push((rule.clone(), fired));
                self.note_proxy(&format!("proxy rules cleared ({rule} fired {fired} times)"));
            }
        }
    }

    /// Notes a proxy action with how many reply faults fired so far.
    fn note_proxy(&mut self, what: &str) {
        let fired = self.proxy.as_ref().map_or(0, FaultProxy::fired);
        self.note(format!("{what} (reply faults fired so far: {fired})"));
    }

    fn thaw(&mut self) {
        if self.frozen {
            self.sut.thaw().expect("thaw redis");
            self.frozen = false;
            self.note("redis thawed".into());
        }
    }

    fn redis_up(&mut self) {
        if self.redis_down {
            self.sut
                .restart()
                .expect("restart the system-under-test redis");
            self.redis_down = false;
            self.note("redis restarted".into());
        }
    }

    /// One command on the system under test, directly (not through the
    /// proxy); the outcome as text.
    fn sut_command(&self, cmd: &redis::Cmd) -> String {
        let r = redis::Client::open(self.sut.url())
            .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(1)));
        match r {
            Ok(mut conn) => match cmd.query::<redis::Value>(&mut conn) {
                Ok(v) => format!("{v:?}"),
                Err(e) => format!("failed: {e}"),
            },
            Err(e) => format!("failed: {e}"),
        }
    }

    /// Ends every fault still in force and makes sure three engines run.
    fn heal(&mut self) {
        self.engines.cont_all();
        self.thaw();
        self.redis_up();
        self.clear_rules();
        if let Some(p) = &self.proxy {
            p.resume();
        }
        self.engines.fill();
        self.note("healed".into());
    }
}

/// The proxy rule for a fault's target.
fn matcher(target: &faults::Target) -> Match {
    match target {
        faults::Target::Script(name) => {
            Match::Script(script_sha(name).unwrap_or_else(|| panic!("no convoy script {name:?}")))
        }
        faults::Target::Command(name) => Match::Command((*name).to_owned()),
    }
}

/// What one schedule did.
struct Outcome {
    settings: Settings,
    verdict: Verdict,
    events: usize,
    ran: Ran,
    /// Proxy replies delayed or dropped.
    fired: usize,
    /// Each reply rule and how often it fired.
    rules: Vec<(String, usize)>,
}

impl ScheduleOutcome for Outcome {
    fn ran(&self) -> &Ran {
        &self.ran
    }

    fn summary(&self) -> String {
        format!(
            "seed {} max_unacked {}: {} faults ({} proxy replies hit, {} of {} reply rules fired), {} events, {} handled, {} re-runs, {} violations, {:.1} s\n    faults: {}",
            self.settings.seed,
            self.settings.max_unacked,
            self.settings.faults.len(),
            self.fired,
            self.rules.iter().filter(|(_, n)| *n > 0).count(),
            self.rules.len(),
            self.events,
            self.verdict.handled,
            self.verdict.reruns,
            self.ran.violations.len(),
            self.ran.elapsed.as_secs_f64(),
            self.settings.fault_list()
        )
    }

    fn report(&self) -> String {
        let head = format!(
            "FAILED schedule seed {} (max_unacked {}, {})\n  faults: {}\n",
            self.settings.seed,
            self.settings.max_unacked,
            self.settings.describe(),
            self.settings.fault_list()
        );
        head + &evidence_tail(&self.ran, &replay_command(self.settings.seed))
    }
}

async fn run_schedule(seed: u64) -> Outcome {
    let started = Instant::now();
    let settings = Settings::new(seed, PROXY);
    let dir = log_dir("convoy-faults", seed);
    write_schedule(
        &dir,
        &settings,
        &settings.fault_list(),
        &replay_command(seed),
    );
    let record = tokio::task::spawn_blocking(|| {
        RedisServer::start().expect("record redis-server (never faulted)")
    })
    .await
    .expect("start record server");
    let record_url = record.url();
    let (s2, d2) = (settings.clone(), dir.clone());
    let (mut harness, record) =
        tokio::task::spawn_blocking(move || (Harness::start(s2, d2, &record), record))
            .await
            .expect("start the system under test");
    let engine_url = harness.engine_url.clone();
    let recorder = Recorder::new(&record_url, harness.ns.clone()).expect("recorder");

    // The publisher: its own domain and engine (the outbox processor runs
    // continuously and keeps records pending while Redis is unreachable).
    let publisher = Domain::builder()
        .config(config(&engine_url, &settings))
        .broker(broker(&engine_url))
        .instance_id("publisher")
        .init()
        .expect("publisher domain");
    let publishing = publisher.engine().spawn();

    if let Some((from, length)) = settings.dependency_outage {
        let client = redis::Client::open(record_url.as_str()).expect("record client");
        let key = format!("convoy-test:{}:dependency-down", harness.ns);
        tokio::spawn(async move {
            tokio::time::sleep(from).await;
            if let Ok(mut c) = client.get_multiplexed_async_connection().await {
                let _: Result<(), _> = redis::cmd("SET")
                    .arg(&key)
                    .arg("1")
                    .arg("PX")
                    .arg(length.as_millis() as u64)
                    .query_async(&mut c)
                    .await;
            }
        });
    }
    let timeline = faults::timeline(&settings.faults);
    let faults_task = tokio::task::spawn_blocking(move || {
        harness.run(&timeline);
        harness.heal();
        harness
    });
    let keys = settings.load.key_names();
    let spread = settings
        .load
        .spread(settings.seed, &keys, PHASE)
        .after_backlog(settings.backlog);
    let committed = publish_spread::<Booked>(&publisher, &spread).await;
    let mut harness = faults_task.await.expect("fault thread");

    let events: usize = committed.values().map(Vec::len).sum();
    let (drained, drain_start) = drain(&publisher, &recorder, &committed, DRAIN, STUCK).await;
    harness.engines.watch_children();
    harness.note(drain_note(drained, drain_start));
    let windows = windows(&recorder, &committed).await;
    let mut verdict = faults::check(&Observed {
        committed: &committed,
        windows: &windows,
        stalls: &harness.engines.stalls,
        kills: &harness.engines.kills,
        max_unacked: settings.max_unacked,
        incidents: settings.incidents(),
    });
    let pending = outbox_left(&publisher).await;
    if pending > 0 {
        verdict.violations.push(format!(
            "(1) the publisher's outbox still holds {pending} pending record(s) after the drain"
        ));
    }
    for c in &harness.engines.crashed {
        verdict.violations.push(format!("(engine) {c}"));
    }
    write_file(&dir, "timeline.txt", &harness.engines.notes.text());
    let fired = harness.proxy.as_ref().map_or(0, FaultProxy::fired);
    let rules = harness.rules.clone();

    if !verdict.violations.is_empty() {
        write_file(&dir, "violations.txt", &verdict.violations.join("\n"));
        let evidence = evidence(&harness, &publisher, &verdict.keys, &windows).await;
        write_file(&dir, "evidence.txt", &evidence);
    }
    let _ = tokio::time::timeout(Duration::from_secs(5), publishing.shutdown()).await;
    tokio::task::spawn_blocking(move || {
        // Engines first (SIGKILL), so they do not log the servers going away.
        let mut harness = harness;
        harness.engines.slots.clear();
        drop(harness);
        drop(record);
    })
    .await
    .expect("teardown");
    let kinds = settings.faults.iter().map(|p| p.fault.kind()).collect();
    let violations = std::mem::take(&mut verdict.violations);
    let ran = Ran::new(seed, kinds, violations, started, dir, "CONVOY_FAULT_KEEP");
    Outcome {
        settings,
        verdict,
        events,
        ran,
        fired,
        rules,
    }
}

/// The state convoy left in the system under test for the keys with
/// problems, and their windows.
async fn evidence(
    h: &Harness,
    domain: &Domain,
    keys: &[String],
    windows: &BTreeMap<String, Vec<Window>>,
) -> String {
    let group = handler_group(domain);
    let e = &h.engines;
    let mut out = format!(
        "handler group {group}\nstalls: {:?}\nkills: {:?}\n",
        e.stalls, e.kills
    );
    let conn = h
        .sut
        .connection_with_timeout(Duration::from_secs(2))
        .await
        .ok();
    let header = |key: &str| format!("\n== key {key}\n");
    let start_us = e.notes.start_us;
    out.push_str(&key_evidence(conn, group, "faulty", keys, windows, start_us, header).await);
    out
}

/// Runs `seeds`, prints one line per schedule and a summary, and panics
/// with every failed schedule's report.
async fn run_all(what: &str, seeds: impl IntoIterator<Item = u64>) {
    let started = Instant::now();
    let outcomes = schedule_run::run_seeds(what, seeds, run_schedule).await;
    let failed = schedule_run::failed(&outcomes);
    let by_unacked = |n: usize| {
        outcomes
            .iter()
            .filter(|o| o.settings.max_unacked == n)
            .count()
    };
    // How many reply rules of each target fired at least once: a rule that
    // never fires (e.g. a script hash that does not match) tests nothing.
    let mut rules: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    for (rule, fired) in outcomes.iter().flat_map(|o| &o.rules) {
        let e = rules.entry(rule.as_str()).or_default();
        e.0 += usize::from(*fired > 0);
        e.1 += 1;
    }
    let rules: Vec<String> = rules
        .iter()
        .map(|(r, (f, n))| format!("{r} {f}/{n}"))
        .collect();
    println!(
        "[{what}] reply rules that fired: {}",
        if rules.is_empty() {
            "none installed".to_owned()
        } else {
            rules.join(", ")
        }
    );
    println!(
        "[{what}] {} schedules ({} with max_unacked 1, {} with 5, {} with 100 after a backlog) in {:.0} s; faults: {}; {} events, {} re-runs; {} violations in {} schedule(s){}",
        outcomes.len(),
        by_unacked(1),
        by_unacked(5),
        by_unacked(100),
        started.elapsed().as_secs_f64(),
        schedule_run::fault_kinds(&outcomes),
        outcomes.iter().map(|o| o.events).sum::<usize>(),
        outcomes.iter().map(|o| o.verdict.reruns).sum::<usize>(),
        outcomes
            .iter()
            .map(|o| o.ran.violations.len())
            .sum::<usize>(),
        failed.len(),
        schedule_run::failed_seeds(&failed)
    );
    schedule_run::panic_if_failed("fault schedules", &outcomes, |o| {
        failure_line(&o.ran, o.settings.max_unacked, &replay_command(o.ran.seed))
    });
}

/// The bounded run of the normal test suite: 30 schedules, half with
/// `max_unacked = 1`, a quarter with `5`, a quarter with `100` after a
/// backlog (`CONVOY_FAULT_BASE` shifts the seeds,
/// `CONVOY_FAULT_BOUNDED` sets the count: the Valkey pass runs fewer).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bounded_run() {
    let n = env_u64("CONVOY_FAULT_BOUNDED").unwrap_or(BOUNDED_SCHEDULES);
    run_all("bounded", bounded_seeds("CONVOY_FAULT", n)).await;
}

/// One schedule again: `CONVOY_FAULT_SEED=n`. Does nothing without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay() {
    let Some(seed) = env_u64("CONVOY_FAULT_SEED") else {
        return;
    };
    run_all("replay", [seed]).await;
}

/// `CONVOY_FAULT_SCHEDULES` schedules (default 300) from seed
/// `CONVOY_FAULT_BASE` (default: from the clock, printed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long: run with --ignored long_run"]
async fn long_run() {
    run_all("long", long_seeds("CONVOY_FAULT", 300, 0, "schedules")).await;
}
