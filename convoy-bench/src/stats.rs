//! Measurements: Redis `INFO commandstats` and `INFO cpu` deltas, this
//! process's CPU time from `/proc/self/stat`, lease ownership, and
//! percentiles.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::{Context as _, Result, anyhow, bail};
use futures::StreamExt as _;
use redis::aio::MultiplexedConnection;
use serde::Serialize;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Commands the benchmark itself sends while measuring; left out of every
/// delta. `MGET` is not among them: convoy's fence check is an `MGET` in
/// every fenced script, so the benchmark counts its own (lease sampling,
/// [`lease_owners`]) and subtracts them instead.
const MEASUREMENT_COMMANDS: &[&str] = &[
    "info",
    "flushdb",
    "dbsize",
    "ping",
    "monitor",
    "client|id",
    "client|kill",
];

/// Commands that run a script; the commands a script calls are counted
/// separately by Redis as well.
const SCRIPT_COMMANDS: &[&str] = &["evalsha", "eval", "evalsha_ro", "eval_ro", "fcall"];

/// Whether `name` (lower case, as in commandstats) runs a script.
pub fn is_script(name: &str) -> bool {
    SCRIPT_COMMANDS.contains(&name)
}

/// Calls and server time of one command.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct CommandCost {
    /// How many times it ran (also from inside scripts).
    pub calls: u64,
    /// Server time spent in it, in µs (a script's time includes the
    /// commands it called).
    pub usec: u64,
}

/// `MGET`s the benchmark itself has sent (lease sampling), so far.
static OWN_MGETS: AtomicU64 = AtomicU64::new(0);

/// Sends the benchmark's own `MGET` of `keys`, counted in [`OWN_MGETS`].
async fn own_mget(
    conn: &mut MultiplexedConnection,
    keys: &[String],
) -> Result<Vec<Option<String>>> {
    OWN_MGETS.fetch_add(1, Ordering::Relaxed);
    redis::cmd("MGET")
        .arg(keys)
        .query_async(conn)
        .await
        .context("MGET of lease keys failed")
}

/// A snapshot (or a delta) of `INFO commandstats`, by lower-case command
/// name (`xack`, `evalsha`, `client|setinfo`).
#[derive(Debug, Clone, Default)]
pub struct CommandStats(
    pub BTreeMap<String, CommandCost>,
    /// How many `MGET`s the benchmark had sent itself when this was read
    /// ([`OWN_MGETS`]); 0 in a parsed text or a delta.
    u64,
);

impl CommandStats {
    /// Reads the current counters.
    pub async fn read(conn: &mut MultiplexedConnection) -> Result<Self> {
        let text: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(conn)
            .await
            .context("INFO commandstats failed")?;
        let mut stats = Self::parse(&text);
        // Read after the reply: an MGET the benchmark sent before this
        // INFO ran is counted on both sides.
        stats.1 = OWN_MGETS.load(Ordering::Relaxed);
        Ok(stats)
    }

    /// Parses the `INFO commandstats` text.
    pub fn parse(text: &str) -> Self {
        let mut map = BTreeMap::new();
        for line in text.lines() {
            let Some(rest) = line.trim().strip_prefix("cmdstat_") else {
                continue;
            };
            let Some((name, fields)) = rest.split_once(':') else {
                continue;
            };
            let mut cost = CommandCost::default();
            for kv in fields.split(',') {
                match kv.split_once('=') {
                    Some(("calls", v)) => cost.calls = v.parse().unwrap_or(0),
                    Some(("usec", v)) => cost.usec = v.parse().unwrap_or(0),
                    _ => {}
                }
            }
            map.insert(name.to_ascii_lowercase(), cost);
        }
        CommandStats(map, 0)
    }

    /// `self - before`, without the benchmark's own measurement commands
    /// (its own `MGET`s subtracted from the `MGET` calls; their time, a
    /// few µs per sample, stays in).
    pub fn since(&self, before: &CommandStats) -> CommandStats {
        let mut out = BTreeMap::new();
        for (name, now) in &self.0 {
            if MEASUREMENT_COMMANDS.contains(&name.as_str()) {
                continue;
            }
            let then = before.0.get(name).copied().unwrap_or_default();
            let mut d = CommandCost {
                calls: now.calls.saturating_sub(then.calls),
                usec: now.usec.saturating_sub(then.usec),
            };
            if name == "mget" {
                d.calls = d.calls.saturating_sub(self.1.saturating_sub(before.1));
            }
            if d.calls > 0 {
                out.insert(name.clone(), d);
            }
        }
        CommandStats(out, 0)
    }

    /// Every command call, scripts and the commands they called included.
    pub fn total_calls(&self) -> u64 {
        self.0.values().map(|c| c.calls).sum()
    }

    /// Script invocations (`EVALSHA`, `EVAL`, `FCALL`).
    pub fn script_calls(&self) -> u64 {
        self.0
            .iter()
            .filter(|(n, _)| SCRIPT_COMMANDS.contains(&n.as_str()))
            .map(|(_, c)| c.calls)
            .sum()
    }

    /// Round trips clients made, from the counters alone: with scripts,
    /// the script runs (convoy does every per-event step in one script; its
    /// few direct commands, such as the wake-up read and the heartbeat, are
    /// left out); without, every call (the baseline sends no script).
    /// [`RequestCounter`] counts them exactly, at a cost.
    pub fn round_trips(&self) -> u64 {
        match self.script_calls() {
            0 => self.total_calls(),
            n => n,
        }
    }

    /// The `n` commands with the most calls, each as `name calls/unit`.
    pub fn top_per(&self, n: usize, units: f64) -> Vec<String> {
        self.top(n)
            .into_iter()
            .map(|(name, c)| format!("{name} {}", per_unit(c.calls as f64 / units.max(1e-9))))
            .collect()
    }

    /// The `n` commands with the most server time, each as
    /// `name µs/unit` (a script's time includes the commands it called).
    pub fn top_usec_per(&self, n: usize, units: f64) -> Vec<String> {
        let mut v: Vec<(&String, &CommandCost)> = self.0.iter().collect();
        v.sort_by(|a, b| b.1.usec.cmp(&a.1.usec).then(a.0.cmp(b.0)));
        v.into_iter()
            .take(n)
            .map(|(name, c)| format!("{name} {}", per_unit(c.usec as f64 / units.max(1e-9))))
            .collect()
    }

    /// The `n` commands with the most calls.
    pub fn top(&self, n: usize) -> Vec<(String, CommandCost)> {
        let mut v: Vec<(String, CommandCost)> =
            self.0.iter().map(|(k, c)| (k.clone(), *c)).collect();
        v.sort_by(|a, b| b.1.calls.cmp(&a.1.calls).then(a.0.cmp(&b.0)));
        v.truncate(n);
        v
    }
}

/// Counts the commands clients send, exactly, through `MONITOR` (commands
/// run inside scripts are left out, and so are the benchmark's own). It
/// slows Redis down, so it is only used where traffic is light.
#[derive(Debug)]
pub struct RequestCounter {
    stop: CancellationToken,
    task: JoinHandle<BTreeMap<String, u64>>,
}

impl RequestCounter {
    /// Starts monitoring.
    pub async fn start(client: &redis::Client) -> Result<Self> {
        let monitor = client.get_async_monitor().await.context("MONITOR failed")?;
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        let task = tokio::spawn(async move {
            let mut counts = BTreeMap::new();
            let mut lines = monitor.into_on_message::<String>();
            loop {
                tokio::select! {
                    _ = stopped.cancelled() => break,
                    line = lines.next() => match line {
                        Some(line) => {
                            // Convoy sends MGET only from scripts, so a
                            // client's MGET is the benchmark's own.
                            if let Some(cmd) = client_command(&line)
                                && !MEASUREMENT_COMMANDS.contains(&cmd.as_str())
                                && cmd != "mget"
                            {
                                *counts.entry(cmd).or_insert(0) += 1;
                            }
                        }
                        None => break,
                    },
                }
            }
            counts
        });
        Ok(RequestCounter { stop, task })
    }

    /// Stops monitoring; commands seen per lower-case name.
    pub async fn finish(self) -> Result<BTreeMap<String, u64>> {
        self.stop.cancel();
        self.task.await.context("the MONITOR reader panicked")
    }
}

/// The command of one `MONITOR` line when a client sent it (not a script):
/// `1700000000.123456 [0 127.0.0.1:5555] "evalsha" ...` gives `evalsha`;
/// `... [0 lua] "get" ...` gives nothing.
fn client_command(line: &str) -> Option<String> {
    let open = line.find('[')?;
    let close = open + line[open..].find(']')?;
    let origin = line[open + 1..close].split_whitespace().nth(1)?;
    if origin == "lua" {
        return None;
    }
    let rest = line[close + 1..].trim_start().strip_prefix('"')?;
    let name = &rest[..rest.find('"')?];
    Some(name.to_ascii_lowercase())
}

/// A rate for a breakdown cell: two decimals below 100.
pub fn per_unit(v: f64) -> String {
    if v >= 100.0 {
        crate::report::format_num(v)
    } else if v >= 0.01 || v == 0.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

/// `used_cpu_user + used_cpu_sys` of the Redis server, in seconds.
pub async fn redis_cpu_s(conn: &mut MultiplexedConnection) -> Result<f64> {
    let text: String = redis::cmd("INFO")
        .arg("cpu")
        .query_async(conn)
        .await
        .context("INFO cpu failed")?;
    let mut total = 0.0;
    for line in text.lines() {
        if let Some((k, v)) = line.trim().split_once(':')
            && (k == "used_cpu_user" || k == "used_cpu_sys")
        {
            total += v.parse::<f64>().unwrap_or(0.0);
        }
    }
    Ok(total)
}

/// `used_memory` of `INFO memory`: bytes the Redis allocator holds for
/// data and buffers.
pub async fn used_memory(conn: &mut MultiplexedConnection) -> Result<u64> {
    let text: String = redis::cmd("INFO")
        .arg("memory")
        .query_async(conn)
        .await
        .context("INFO memory failed")?;
    text.lines()
        .find_map(|l| l.trim().strip_prefix("used_memory:"))
        .ok_or_else(|| anyhow!("INFO memory has no used_memory"))?
        .parse()
        .context("used_memory is not a number")
}

/// `MEMORY USAGE key SAMPLES 0`: the bytes of one key (its name, value and
/// entry in the keyspace, every element counted); `None` when it does not
/// exist.
pub async fn memory_usage(conn: &mut MultiplexedConnection, key: &str) -> Result<Option<u64>> {
    redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(key)
        .arg("SAMPLES")
        .arg(0)
        .query_async(conn)
        .await
        .with_context(|| format!("MEMORY USAGE {key} failed"))
}

/// The server and its version (`Redis 7.0.15`, `Valkey 9.1.2`).
pub async fn redis_version(conn: &mut MultiplexedConnection) -> Result<String> {
    let text: String = redis::cmd("INFO")
        .arg("server")
        .query_async(conn)
        .await
        .context("INFO server failed")?;
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(name)?.strip_prefix(':'))
            .map(str::to_owned)
    };
    Ok(match field("valkey_version") {
        Some(v) => format!("Valkey {v}"),
        None => format!(
            "Redis {}",
            field("redis_version").unwrap_or_else(|| "unknown".to_owned())
        ),
    })
}

/// This process's CPU time (user + system, every thread), in seconds, from
/// `/proc/self/stat`.
pub fn process_cpu_s() -> Result<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").context("reading /proc/self/stat")?;
    // The command name is in parentheses and may hold spaces: fields are
    // counted after the last `)`. utime and stime are fields 14 and 15.
    let after = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .ok_or_else(|| anyhow!("unexpected /proc/self/stat format"))?;
    let fields: Vec<&str> = after.split_whitespace().collect();
    if fields.len() < 13 {
        bail!("unexpected /proc/self/stat format: {} fields", fields.len());
    }
    let utime: f64 = fields[11].parse().context("utime")?;
    let stime: f64 = fields[12].parse().context("stime")?;
    let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .filter(|t| *t > 0)
        .unwrap_or(100) as f64;
    Ok((utime + stime) / ticks)
}

/// CPU use of this process and of the Redis server over a window.
#[derive(Debug, Clone, Copy)]
pub struct CpuMark {
    process_s: f64,
    redis_s: f64,
    at: std::time::Instant,
}

/// CPU used over a window, as a share of one core (1.0 = one core busy).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct CpuUse {
    /// This process (the engines, or the baseline consumers).
    pub process: f64,
    /// The Redis server.
    pub redis: f64,
}

impl CpuMark {
    /// Marks the start of a window.
    pub async fn now(conn: &mut MultiplexedConnection) -> Result<Self> {
        Ok(CpuMark {
            process_s: process_cpu_s()?,
            redis_s: redis_cpu_s(conn).await?,
            at: std::time::Instant::now(),
        })
    }

    /// CPU used since the mark.
    pub async fn since(&self, conn: &mut MultiplexedConnection) -> Result<CpuUse> {
        let now = CpuMark::now(conn).await?;
        let wall = now.at.duration_since(self.at).as_secs_f64().max(1e-9);
        Ok(CpuUse {
            process: (now.process_s - self.process_s) / wall,
            redis: (now.redis_s - self.redis_s) / wall,
        })
    }
}

/// The lease key of the benchmark handler's unit `key` (in the key's
/// shard, `{s}convoy:lease:{group}:bench:{key}`).
pub fn lease_key(group: &str, key: &str) -> String {
    use convoy_runtime::redis::keys;
    let shards = crate::harness::shards();
    keys::lease(
        keys::shard_of(key, shards),
        group,
        crate::model::CATEGORY,
        key,
    )
}

/// Lease owners of `keys` (fence token `{owner}:{generation}` in
/// [`lease_key`]): partitions per owner, and how many have no owner. One
/// `MGET` per 1000 keys, so on one Redis only (the keys are in different
/// hash slots).
pub async fn lease_owners(
    conn: &mut MultiplexedConnection,
    group: &str,
    keys: &[String],
) -> Result<(BTreeMap<String, usize>, usize)> {
    let mut owners = BTreeMap::new();
    let mut unowned = 0;
    for chunk in keys.chunks(1000) {
        let lease_keys: Vec<String> = chunk.iter().map(|k| lease_key(group, k)).collect();
        let tokens = own_mget(conn, &lease_keys).await?;
        for t in tokens {
            match t {
                Some(token) => {
                    let owner = token
                        .rsplit_once(':')
                        .map(|(o, _)| o.to_owned())
                        .unwrap_or(token);
                    *owners.entry(owner).or_insert(0) += 1;
                }
                None => unowned += 1,
            }
        }
    }
    Ok((owners, unowned))
}

/// The keys whose lease `owner` holds.
pub async fn keys_owned_by(
    conn: &mut MultiplexedConnection,
    group: &str,
    keys: &[String],
    owner: &str,
) -> Result<Vec<String>> {
    let prefix = format!("{owner}:");
    let mut out = Vec::new();
    for chunk in keys.chunks(1000) {
        let lease_keys: Vec<String> = chunk.iter().map(|k| lease_key(group, k)).collect();
        let tokens = own_mget(conn, &lease_keys).await?;
        for (k, t) in chunk.iter().zip(tokens) {
            if t.is_some_and(|t| t.starts_with(&prefix)) {
                out.push(k.clone());
            }
        }
    }
    Ok(out)
}

/// Latency percentiles, in ms.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Percentiles {
    /// Samples.
    pub count: usize,
    /// Median.
    pub p50_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Largest sample.
    pub max_ms: f64,
}

impl Percentiles {
    /// Percentiles of samples in ns (nearest rank).
    pub fn of_ns(samples: &mut [u64]) -> Self {
        if samples.is_empty() {
            return Percentiles::default();
        }
        samples.sort_unstable();
        let rank = |p: f64| {
            let idx = ((p * samples.len() as f64).ceil() as usize).clamp(1, samples.len()) - 1;
            samples[idx] as f64 / 1e6
        };
        Percentiles {
            count: samples.len(),
            p50_ms: rank(0.50),
            p99_ms: rank(0.99),
            max_ms: samples[samples.len() - 1] as f64 / 1e6,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_subtracts_commandstats() {
        let a = CommandStats::parse(
            "# Commandstats\r\ncmdstat_get:calls=2,usec=3,usec_per_call=1.50,rejected_calls=0,failed_calls=0\r\ncmdstat_info:calls=1,usec=9\r\n",
        );
        let b = CommandStats::parse(
            "cmdstat_get:calls=5,usec=10\r\ncmdstat_evalsha:calls=4,usec=40\r\ncmdstat_info:calls=7,usec=90\r\ncmdstat_xgroup|create:calls=1,usec=1\r\n",
        );
        let d = b.since(&a);
        assert_eq!(d.total_calls(), 3 + 4 + 1);
        assert_eq!(d.script_calls(), 4);
        assert_eq!(d.round_trips(), 4);
        assert_eq!(d.top(1)[0].0, "evalsha");
        assert!(!d.0.contains_key("info"));
    }

    #[test]
    fn only_the_benchmarks_own_mgets_are_left_out() {
        // Convoy's fence check runs MGET inside its scripts: those count.
        let mut a = CommandStats::parse("cmdstat_mget:calls=10,usec=20\r\n");
        let mut b = CommandStats::parse("cmdstat_mget:calls=25,usec=60\r\n");
        a.1 = 3;
        b.1 = 5;
        let d = b.since(&a);
        assert_eq!(d.0["mget"].calls, 15 - 2);
        assert_eq!(d.total_calls(), 13);
    }

    #[test]
    fn monitor_lines_name_client_commands_only() {
        assert_eq!(
            client_command(r#"1700000000.123456 [0 127.0.0.1:5555] "EVALSHA" "abc" "1""#)
                .as_deref(),
            Some("evalsha")
        );
        assert_eq!(
            client_command(r#"1700000000.123456 [0 lua] "get" "x""#),
            None
        );
        assert_eq!(
            client_command(r#"1700000000.123456 [3 unix:/tmp/r.sock] "xread" "COUNT""#).as_deref(),
            Some("xread")
        );
        assert_eq!(client_command("OK"), None);
    }

    #[test]
    fn percentiles_by_nearest_rank() {
        let mut v: Vec<u64> = (1..=100).map(|i| i * 1_000_000).collect();
        let p = Percentiles::of_ns(&mut v);
        assert_eq!(p.count, 100);
        assert_eq!(p.p50_ms, 50.0);
        assert_eq!(p.p99_ms, 99.0);
        assert_eq!(p.max_ms, 100.0);
    }
}
