//! Failover: an engine in a child process owns partitions beside an
//! in-process engine; it is killed with SIGKILL; how long until every one
//! of its keys handles a new event again.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail};
use convoy_runtime::testing::ChildEngine;
use tokio_util::sync::CancellationToken;

use super::{Env, progress};
use crate::baseline;
use crate::harness::{self, Tuning};
use crate::model::{self, ProbeState, Tick, key_name};
use crate::report::{Row, Section, Table};
use crate::stats::{self, Percentiles};

/// The short lease of the failover and balance scenarios.
#[derive(clap::Args, Debug, Clone, Copy)]
pub struct LeaseArgs {
    /// `lease_ttl_ms` of the failover and balance engines.
    #[arg(long, default_value_t = 2000)]
    pub lease_ttl_ms: u64,
    /// `heartbeat_interval_seconds` of the failover and balance engines.
    #[arg(long, default_value_t = 0.4)]
    pub heartbeat_s: f64,
}

impl LeaseArgs {
    /// As engine lease timing.
    pub fn timing(&self) -> Tuning {
        Tuning::short_lease(self.lease_ttl_ms, self.heartbeat_s)
    }
}

/// Options of the failover scenario.
#[derive(clap::Args, Debug, Clone)]
pub struct FailoverArgs {
    /// Keys (partitions) shared by the two engines.
    #[arg(long, default_value_t = 64)]
    pub failover_keys: usize,
    /// Kills to measure, each with fresh engines; the rounds start the
    /// survivor and kill the victim at different points of the heartbeat
    /// cycle.
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
}

/// The child engine's instance id in round `r`.
fn child_id(r: usize) -> String {
    format!("victim{r}")
}

/// Runs the rounds, then the baseline once.
pub async fn run(env: &mut Env, args: &FailoverArgs, lease: LeaseArgs) -> Result<Section> {
    if args.failover_keys < 2 || args.rounds == 0 {
        bail!("--failover-keys must be at least 2 and --rounds above 0");
    }
    let timing = lease.timing();
    let target_ms = timing.ttl_ms as f64 + timing.heartbeat_s * 1000.0;
    let mut section = Section::new("failover");
    section.param("keys", args.failover_keys);
    section.param("rounds", args.rounds);
    section.param("engines", timing.describe());
    section.param(
        "convoy",
        "engine A in a child process (this binary, hidden `engine` subcommand) and engine B in-process share the keys; A is killed with SIGKILL, then one new event is published on every key",
    );
    section.param(
        "baseline",
        "two plain consumers of one group; one is crashed (task aborted, connection cut with CLIENT KILL), then one new event per key is XADDed",
    );
    section.param(
        "target",
        format!("every killed owner's key resumes within lease_ttl_ms + one heartbeat = {target_ms:.0} ms"),
    );

    progress("failover", "baseline");
    let base = baseline_side(env, args.failover_keys).await?;
    let mut rounds = Vec::new();
    for r in 1..=args.rounds {
        progress("failover", format!("round {r}"));
        // Spread the kills over the heartbeat cycle: the survivor starts
        // `start_offset` after the victim took every key (so their
        // heartbeats are out of step by that much) and the victim dies
        // `phase` after the keys are shared.
        let step = timing.heartbeat_s / args.rounds as f64;
        let start_offset = Duration::from_secs_f64(step * (r - 1) as f64);
        let phase = Duration::from_secs_f64(step * ((2 * (r - 1)) % args.rounds) as f64);
        let o = convoy_round(env, args.failover_keys, timing, r, start_offset, phase).await?;
        progress(
            "failover",
            format!(
                "round {r}: {} keys of the killed owner resumed after {:.0} ms (max)",
                o.victim_keys, o.resume.max_ms
            ),
        );
        let case = format!("round {r} ({} keys killed)", o.victim_keys);
        section.rows.push(
            Row::new(&case, "all keys resumed, ms", o.resume.max_ms, base.max_ms).target(
                format!("<= {target_ms:.0} ms"),
                o.resume.max_ms <= target_ms,
            ),
        );
        section.rows.push(Row::new(
            &case,
            "median key resumed, ms",
            o.resume.p50_ms,
            base.p50_ms,
        ));
        section.rows.push(Row::alone(
            &case,
            "survivor's own keys, max ms",
            o.survivor_max_ms,
        ));
        rounds.push(vec![
            r.to_string(),
            o.victim_keys.to_string(),
            format!("{:.0}", o.resume.p50_ms),
            format!("{:.0}", o.resume.max_ms),
            format!("{:.0}", o.balanced_after_s * 1000.0),
            format!("{:.0}", start_offset.as_secs_f64() * 1000.0),
            format!("{:.0}", phase.as_secs_f64() * 1000.0),
        ]);
    }
    section.tables.push(Table {
        title: "convoy rounds".into(),
        header: vec![
            "round".into(),
            "keys of the killed owner".into(),
            "p50 resume ms".into(),
            "max resume ms".into(),
            "shared after ms".into(),
            "survivor start offset ms".into(),
            "kill delay ms".into(),
        ],
        rows: rounds,
    });
    section.note("survivor start offset: how long after the child took every key the in-process engine was started (it puts their heartbeats out of step); shared after: from that start until each engine owns half the keys; kill delay: how long after that the child was killed.");
    section.note("resume: from SIGKILL to the handler running the new event of the key (the survivor must first wait out the dead owner's lease, then take it at its next heartbeat, reclaim and read).");
    section.note("The baseline has no ownership: new events go to the surviving consumer at once; entries the dead consumer had been delivered stay pending until someone claims them, and nothing keeps per-key order.");
    Ok(section)
}

struct RoundOutcome {
    victim_keys: usize,
    resume: Percentiles,
    survivor_max_ms: f64,
    balanced_after_s: f64,
}

async fn convoy_round(
    env: &mut Env,
    k: usize,
    timing: Tuning,
    round: usize,
    start_offset: Duration,
    phase: Duration,
) -> Result<RoundOutcome> {
    env.reset().await?;
    let state = ProbeState::new();
    let keys: Vec<String> = (0..k).map(key_name).collect();
    let publisher = harness::publisher(&env.url)?;
    harness::publish(&publisher, &model::spread(k, k)).await?;
    let victim = child_id(round);
    let mut child = spawn_child(&env.url, &victim, timing)?;
    wait_owners(env, &keys, Duration::from_secs(30), |o| {
        o.get(&victim).copied() == Some(k)
    })
    .await
    .context("the child engine did not take every partition")?;
    tokio::time::sleep(start_offset).await;
    let start = Instant::now();
    let engines = harness::start_engines(&env.url, timing, "survivor", 1, &state)?;
    let half = k / 2;
    wait_owners(env, &keys, Duration::from_secs(30), |o| {
        let a = o.get(&victim).copied().unwrap_or(0);
        let b = o.get("survivor1").copied().unwrap_or(0);
        a + b == k && a >= half && b >= half
    })
    .await
    .context("the two engines did not share the partitions")?;
    let balanced_after_s = start.elapsed().as_secs_f64();
    let victim_keys = stats::keys_owned_by(&mut env.admin, env.group, &keys, &victim).await?;
    if victim_keys.is_empty() {
        bail!("the child engine owns no partition");
    }
    tokio::time::sleep(phase).await;
    let killed_at = Instant::now();
    child
        .kill9()
        .map_err(|e| anyhow!("kill -9 of the child engine failed: {e}"))?;
    let fresh: Vec<Tick> = keys.iter().map(|k| Tick::stamped(k, 1)).collect();
    harness::publish(&publisher, &fresh).await?;
    let all_back = harness::wait_for(Duration::from_secs(60), Duration::from_millis(2), || {
        keys.iter()
            .all(|key| state.key(key).is_some_and(|s| s.last_seq >= 1))
    })
    .await;
    harness::stop_engines(engines).await?;
    if !all_back {
        bail!("some keys did not handle their new event within 60 s of the kill");
    }
    let since_kill = |key: &String| -> u64 {
        state
            .key(key)
            .map(|s| s.last_at.saturating_duration_since(killed_at).as_nanos() as u64)
            .unwrap_or(u64::MAX)
    };
    let mut resumed: Vec<u64> = victim_keys.iter().map(since_kill).collect();
    let survivor_max_ns = keys
        .iter()
        .filter(|k| !victim_keys.contains(k))
        .map(since_kill)
        .max()
        .unwrap_or(0);
    Ok(RoundOutcome {
        victim_keys: victim_keys.len(),
        resume: Percentiles::of_ns(&mut resumed),
        survivor_max_ms: survivor_max_ns as f64 / 1e6,
        balanced_after_s,
    })
}

/// Starts this binary's hidden `engine` subcommand as instance `instance`.
fn spawn_child(url: &str, instance: &str, timing: Tuning) -> Result<ChildEngine> {
    let exe = std::env::current_exe().context("cannot find this binary to re-execute it")?;
    let mut cmd = Command::new(exe);
    cmd.arg("--redis-url")
        .arg(url)
        .arg("engine")
        .arg("--instance")
        .arg(instance)
        .arg("--lease-ttl-ms")
        .arg(timing.ttl_ms.to_string())
        .arg("--heartbeat-s")
        .arg(timing.heartbeat_s.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    ChildEngine::spawn(&mut cmd).map_err(|e| anyhow!("cannot start the child engine: {e}"))
}

/// Polls lease owners until `done` holds.
async fn wait_owners(
    env: &mut Env,
    keys: &[String],
    timeout: Duration,
    done: impl Fn(&std::collections::BTreeMap<String, usize>) -> bool,
) -> Result<()> {
    let start = Instant::now();
    loop {
        let (owners, _) = stats::lease_owners(&mut env.admin, env.group, keys).await?;
        if done(&owners) {
            return Ok(());
        }
        if start.elapsed() >= timeout {
            bail!("timed out after {timeout:?}; owners: {owners:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn baseline_side(env: &mut Env, k: usize) -> Result<Percentiles> {
    env.reset().await?;
    let state = ProbeState::new();
    baseline::create_group(&mut env.admin, "$").await?;
    let stop = CancellationToken::new();
    let mut consumers =
        baseline::start_consumers(&env.client, "c", 2, Duration::from_secs(1), &state, &stop)
            .await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let victim = consumers.remove(0);
    let killed_at = Instant::now();
    baseline::crash(&mut env.admin, victim).await?;
    let fresh: Vec<Tick> = (0..k).map(|i| Tick::stamped(&key_name(i), 1)).collect();
    baseline::prepublish(&mut env.admin, &fresh).await?;
    harness::wait_handled(
        &state,
        k as u64,
        Duration::from_secs(30),
        "the baseline survivor",
    )
    .await?;
    stop.cancel();
    baseline::join(consumers).await?;
    let mut resumed: Vec<u64> = (0..k)
        .filter_map(|i| state.key(&key_name(i)))
        .map(|s| s.last_at.saturating_duration_since(killed_at).as_nanos() as u64)
        .collect();
    Ok(Percentiles::of_ns(&mut resumed))
}
