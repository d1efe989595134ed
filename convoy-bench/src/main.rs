//! convoy-bench: measures convoy side by side with an unordered plain Redis
//! consumer group, in the same run, on the same server.
//!
//! ```text
//! cargo run --release -p convoy-bench -- all
//! cargo run --release -p convoy-bench -- throughput --keys 64 --instances 1 --json
//! cargo run --release -p convoy-bench -- idle --partitions 100,10000,100000,1000000
//! cargo run --release -p convoy-bench -- cluster
//! cargo run --release -p convoy-bench -- pg-outbox
//! cargo run --release -p convoy-bench -- throughput --out convoy-bench/results/new.json
//! cargo run --release -p convoy-bench -- compare old.json new.json
//! ```
//!
//! Without `--redis-url` it starts its own `redis-server` on a free port
//! (through `convoy_runtime::testing::RedisServer`); `pg-outbox` also
//! starts its own PostgreSQL (`convoy_runtime::testing::PgServer`). Results go to stdout
//! (tables, or JSON with `--json`), progress to stderr; `--out FILE` also
//! writes the JSON to FILE. Every result records its commit, date, server,
//! CPU count and command line; `compare` prints how the convoy/baseline
//! ratios changed between two result files.

// A binary has no public API: `pub` in its modules only marks what the
// other modules use (the workspace's `unreachable_pub` is for libraries).
#![allow(unreachable_pub)]

mod baseline;
mod compare;
mod git;
mod harness;
mod heap;
mod model;
mod provenance;
mod report;
mod scenario;
mod stats;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail};
use clap::{Parser, Subcommand};
use convoy_runtime::testing::{RedisServer, ServerKind};
use tracing_subscriber::prelude::*;

use crate::report::{Report, Section};
use crate::scenario::Env;
use crate::scenario::balance::BalanceArgs;
use crate::scenario::cluster::ClusterArgs;
use crate::scenario::failover::{FailoverArgs, LeaseArgs};
use crate::scenario::idle::IdleArgs;
use crate::scenario::latency::LatencyArgs;
use crate::scenario::pg_outbox::PgOutboxArgs;
use crate::scenario::throughput::ThroughputArgs;

/// Benchmark convoy against a plain Redis consumer group.
#[derive(Parser, Debug)]
#[command(name = "convoy-bench", version, about)]
struct Cli {
    /// What to measure.
    #[command(subcommand)]
    scenario: Scenario,
    /// Print the results as JSON instead of tables.
    #[arg(long, global = true)]
    json: bool,
    /// Also write the results as JSON to this file (for
    /// `convoy-bench/results/` and `compare`), besides printing them.
    #[arg(long, global = true, value_name = "FILE")]
    out: Option<PathBuf>,
    /// Measure against this Redis instead of starting a redis-server. The
    /// database in the URL is flushed before every case: point it at a
    /// scratch database.
    #[arg(long, global = true, env = "CONVOY_BENCH_REDIS_URL")]
    redis_url: Option<String>,
    /// Allow flushing the database of --redis-url even when it holds keys.
    #[arg(long, global = true)]
    allow_flush: bool,
    /// The server the benchmark starts (without --redis-url), the cluster
    /// scenario's nodes too: `redis` (redis-server), `valkey`
    /// (valkey-server: $CONVOY_VALKEY_SERVER, else on PATH; `bash
    /// .ci/valkey.sh` installs it) or `redis8` (Redis 8:
    /// $CONVOY_REDIS8_SERVER; `bash .ci/redis8.sh` installs it). Default: $CONVOY_TEST_SERVER, else
    /// redis.
    #[arg(long, global = true, value_parser = ["redis", "valkey", "redis8"], conflicts_with = "redis_url")]
    server: Option<String>,
    /// Worker threads of the benchmark's tokio runtime, which runs convoy's
    /// engines and the baseline consumers alike. Default: tokio's (one per
    /// CPU). See docs/performance.md for what a runtime sized to the cores
    /// the engine really has changes.
    #[arg(long, global = true, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=1024))]
    worker_threads: Option<u16>,
}

impl Cli {
    /// The server to start.
    fn server_kind(&self) -> Result<ServerKind> {
        match self.server.as_deref() {
            Some("valkey") => Ok(ServerKind::Valkey),
            Some("redis8") => Ok(ServerKind::Redis8),
            Some(_) => Ok(ServerKind::Redis),
            None => ServerKind::from_env().map_err(|e| anyhow!("{e}")),
        }
    }
}

// Parsed once at start: the size of the largest variant (`All`, every
// scenario's options) costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
enum Scenario {
    /// N pre-published events over K keys, E engines: events/s, Redis calls
    /// per event, per-key order.
    Throughput(ThroughputArgs),
    /// Steady light load: publish-to-handle p50/p99/max.
    Latency(LatencyArgs),
    /// An idle engine owning P drained partitions: Redis calls/s, CPU,
    /// pick-up latency.
    Idle(IdleArgs),
    /// kill -9 an engine owning partitions: time until its keys resume.
    Failover {
        #[command(flatten)]
        args: FailoverArgs,
        #[command(flatten)]
        lease: LeaseArgs,
    },
    /// Instances starting later: partitions owned per instance over time.
    Balance {
        #[command(flatten)]
        args: BalanceArgs,
        #[command(flatten)]
        lease: LeaseArgs,
    },
    /// The same events on one Redis and on a Redis Cluster started here:
    /// events/s of each and the commands per master.
    Cluster(ClusterArgs),
    /// The PostgreSQL outbox against a hand-written one: commit-to-published
    /// events/s and commit-to-handled p50/p99 (starts its own PostgreSQL;
    /// not part of `all`).
    PgOutbox(PgOutboxArgs),
    /// Every Redis-only scenario, one after the other (`pg-outbox` runs on
    /// its own).
    All {
        #[command(flatten)]
        throughput: ThroughputArgs,
        #[command(flatten)]
        latency: LatencyArgs,
        #[command(flatten)]
        idle: IdleArgs,
        #[command(flatten)]
        failover: FailoverArgs,
        #[command(flatten)]
        balance: BalanceArgs,
        #[command(flatten)]
        cluster: ClusterArgs,
        #[command(flatten)]
        lease: LeaseArgs,
    },
    /// Compares two result files (`--json` or `--out`): the convoy/baseline
    /// ratios of every case in both, and how much they changed (starts no
    /// server).
    Compare(CompareArgs),
    /// Runs one engine until SIGTERM (the failover scenario's child).
    #[command(hide = true)]
    Engine(EngineArgs),
}

/// Options of `compare`.
#[derive(clap::Args, Debug)]
struct CompareArgs {
    /// The older result file (JSON).
    old: PathBuf,
    /// The newer result file (JSON).
    new: PathBuf,
}

/// Options of the hidden child engine.
#[derive(clap::Args, Debug)]
struct EngineArgs {
    /// The engine's instance id.
    #[arg(long)]
    instance: String,
    #[command(flatten)]
    lease: LeaseArgs,
    /// Exit on its own after this many seconds (in case the parent died).
    #[arg(long, default_value_t = 300)]
    max_secs: u64,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::registry()
        .with(
            convoy_runtime::log::quiet_redis(
                tracing_subscriber::fmt::layer().with_writer(std::io::stderr),
            )
            .with_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error")),
            ),
        )
        .init();
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = cli.worker_threads {
        runtime.worker_threads(usize::from(n));
    }
    let runtime = runtime
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    if let Scenario::Compare(args) = &cli.scenario {
        if cli.out.is_some() {
            bail!("--out writes a measured result; compare measures nothing");
        }
        print!("{}", compare::compare_files(&args.old, &args.new)?);
        return Ok(());
    }
    if let Some(out) = &cli.out {
        check_writable(out)?;
    }
    if let Scenario::Engine(args) = &cli.scenario {
        let url = cli
            .redis_url
            .as_deref()
            .ok_or_else(|| anyhow!("the engine subcommand needs --redis-url"))?;
        return runtime.block_on(child_engine(url, args));
    }
    let command = provenance::command_line();
    let date = provenance::now_utc();
    let commit = provenance::current_commit();
    // Started outside the runtime: it blocks while redis-server boots.
    let (server, url) = match &cli.redis_url {
        Some(url) => (None, url.clone()),
        None => {
            let server = RedisServer::builder()
                .server(cli.server_kind()?)
                .start()
                .map_err(|e| anyhow!("{e}"))?;
            let url = server.url();
            (Some(server), url)
        }
    };
    let where_ = match &server {
        Some(s) => format!("own {}-server on 127.0.0.1:{}", s.kind().name(), s.port()),
        None => convoy_runtime::config::redact_url(&url),
    };
    let mut report = runtime.block_on(run(&cli, &url, where_))?;
    report.commit = commit;
    report.date = date;
    report.command = command;
    let json = serde_json::to_string_pretty(&report).context("cannot encode the report")?;
    if cli.json {
        println!("{json}");
    } else {
        print!("{}", report.to_text());
    }
    if let Some(out) = &cli.out {
        std::fs::write(out, format!("{json}\n"))
            .with_context(|| format!("cannot write the result to {}", out.display()))?;
        eprintln!("result written to {}", out.display());
    }
    drop(runtime);
    drop(server);
    Ok(())
}

async fn run(cli: &Cli, url: &str, where_: String) -> Result<Report> {
    let mut env = Env::connect(url).await?;
    if cli.redis_url.is_some() && !cli.allow_flush {
        let keys = harness::dbsize(&mut env.admin).await?;
        if keys > 0 {
            bail!(
                "the database of --redis-url holds {keys} keys and the benchmark flushes it before every case; use an empty database or pass --allow-flush"
            );
        }
    }
    let redis_version = stats::redis_version(&mut env.admin).await?;
    let load_before = load_average();
    let mut sections = Vec::new();
    let mut timed = |section: Result<Section>, start: Instant| -> Result<()> {
        let mut s = section?;
        s.seconds = start.elapsed().as_secs_f64();
        sections.push(s);
        Ok(())
    };
    match &cli.scenario {
        Scenario::Throughput(a) => {
            let t = Instant::now();
            timed(scenario::throughput::run(&mut env, a).await, t)?;
        }
        Scenario::Latency(a) => {
            let t = Instant::now();
            timed(scenario::latency::run(&mut env, a).await, t)?;
        }
        Scenario::Idle(a) => {
            let t = Instant::now();
            timed(scenario::idle::run(&mut env, a).await, t)?;
        }
        Scenario::Failover { args, lease } => {
            let t = Instant::now();
            timed(scenario::failover::run(&mut env, args, *lease).await, t)?;
        }
        Scenario::Balance { args, lease } => {
            let t = Instant::now();
            timed(scenario::balance::run(&mut env, args, *lease).await, t)?;
        }
        Scenario::Cluster(a) => {
            let t = Instant::now();
            timed(
                scenario::cluster::run(&mut env, a, cli.server_kind()?).await,
                t,
            )?;
        }
        Scenario::PgOutbox(a) => {
            let t = Instant::now();
            timed(scenario::pg_outbox::run(&mut env, a).await, t)?;
        }
        Scenario::All {
            throughput,
            latency,
            idle,
            failover,
            balance,
            cluster,
            lease,
        } => {
            let t = Instant::now();
            timed(scenario::throughput::run(&mut env, throughput).await, t)?;
            let t = Instant::now();
            timed(scenario::latency::run(&mut env, latency).await, t)?;
            let t = Instant::now();
            timed(scenario::idle::run(&mut env, idle).await, t)?;
            let t = Instant::now();
            timed(scenario::failover::run(&mut env, failover, *lease).await, t)?;
            let t = Instant::now();
            timed(scenario::balance::run(&mut env, balance, *lease).await, t)?;
            let t = Instant::now();
            timed(
                scenario::cluster::run(&mut env, cluster, cli.server_kind()?).await,
                t,
            )?;
        }
        Scenario::Engine(_) | Scenario::Compare(_) => {
            bail!("the engine and compare subcommands run on their own")
        }
    }
    env.reset().await?;
    Ok(Report {
        commit: String::new(),
        date: String::new(),
        command: String::new(),
        server: redis_version,
        redis: where_,
        cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        load_before,
        load_after: load_average(),
        sections,
    })
}

/// Fails before a run whose result could not be written to `out`: its
/// directory must exist, and `out` must not be a directory.
fn check_writable(out: &Path) -> Result<()> {
    if out.is_dir() {
        bail!("--out {}: is a directory", out.display());
    }
    let dir = out
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if !dir.is_dir() {
        bail!(
            "--out {}: the directory {} does not exist",
            out.display(),
            dir.display()
        );
    }
    Ok(())
}

/// The 1, 5 and 15 minute load averages (`/proc/loadavg`).
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

/// The failover scenario's child: one engine running the benchmark's
/// handler until SIGTERM or `max_secs`.
async fn child_engine(url: &str, args: &EngineArgs) -> Result<()> {
    let domain = harness::engine_domain(
        url,
        args.lease.timing(),
        &args.instance,
        model::ProbeState::new(),
    )?;
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("cannot listen for SIGTERM")?;
    let max = Duration::from_secs(args.max_secs);
    domain
        .engine()
        .run_until(async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::time::sleep(max) => {}
            }
        })
        .await
        .map_err(|e| anyhow!("child engine failed: {e}"))
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    use super::Cli;

    #[test]
    fn the_command_line_is_consistent() {
        // `all` flattens every scenario's options: a name used twice would
        // only show up here (clap checks in debug builds: `cargo test`).
        Cli::command().debug_assert();
    }
}
