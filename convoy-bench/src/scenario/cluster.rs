//! Cluster: the same N events over K keys on one Redis and on a Redis
//! Cluster of M masters (started here); events/s on each, and how the
//! commands spread over the masters. On a 2-core machine the cluster's
//! masters share the cores with each other and with the engine, so the
//! figure to read is the per-node balance, not a speed-up.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail};
use convoy_runtime::redis::keys;
use convoy_runtime::testing::{RedisCluster, ServerKind};
use redis::Value;
use redis::aio::MultiplexedConnection;
use tokio_util::sync::CancellationToken;

use super::{Env, admin_config, progress};
use crate::baseline;
use crate::harness::{self, Tuning};
use crate::model::{self, ProbeState};
use crate::report::{Cell, Row, Section, Table, case_label, format_num};
use crate::stats::{self, CommandStats, CpuMark, CpuUse};

/// Options of the cluster scenario.
#[derive(clap::Args, Debug, Clone)]
pub struct ClusterArgs {
    /// Events per case, pre-published before the consumers start.
    #[arg(long, default_value_t = 100_000)]
    pub cluster_events: usize,
    /// Keys K the events are spread over.
    #[arg(long, default_value_t = 1024)]
    pub cluster_keys: usize,
    /// Masters of the cluster.
    #[arg(long, default_value_t = 3)]
    pub masters: usize,
    /// Replicas of each master.
    #[arg(long, default_value_t = 0)]
    pub cluster_replicas: usize,
    /// What convoy waits for replicas on (comma separated, each a case on
    /// the cluster): `none`, `publish` (`wait_replicas = 1`) or `acks`
    /// (`wait_replicas = 1`, `wait_acks = true`); the last two need
    /// `--cluster-replicas 1` or more.
    #[arg(long, value_delimiter = ',', default_values_t = [String::from("none")])]
    pub cluster_wait: Vec<String>,
    /// Engine instances (the baseline runs as many consumers).
    #[arg(long, default_value_t = 1)]
    pub cluster_instances: usize,
    /// `max_unacked` values convoy runs with (comma separated).
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 100])]
    pub cluster_max_unacked: Vec<usize>,
    /// Longest one side of one case may run before it is stopped and its
    /// rate taken from what it handled.
    #[arg(long, default_value_t = 120)]
    pub cluster_timeout_secs: u64,
}

/// One Redis node the benchmark reads counters from.
struct Node {
    /// `127.0.0.1:port`.
    addr: String,
    url: String,
    conn: MultiplexedConnection,
}

impl Node {
    async fn connect(url: &str) -> Result<Node> {
        let client = redis::Client::open(url).context("invalid node URL")?;
        let conn = client
            .get_multiplexed_async_connection_with_config(&admin_config())
            .await
            .with_context(|| format!("cannot connect to {url}"))?;
        let addr = url
            .trim_start_matches("redis://")
            .trim_end_matches('/')
            .to_owned();
        Ok(Node {
            addr,
            url: url.to_owned(),
            conn,
        })
    }
}

/// Where one side runs: one Redis, or the cluster's masters.
struct Target {
    /// `one node` or `cluster (3 masters)`.
    name: String,
    /// What engines and publishers connect to.
    url: String,
    /// The masters (one for a single Redis).
    nodes: Vec<Node>,
    /// The node of the baseline's stream.
    baseline_node: usize,
    /// Shards of the benchmark category held by each node.
    shards: Vec<usize>,
}

impl Target {
    async fn reset(&mut self) -> Result<()> {
        for n in &mut self.nodes {
            let () = redis::cmd("FLUSHALL")
                .query_async(&mut n.conn)
                .await
                .with_context(|| format!("FLUSHALL on {} failed", n.addr))?;
        }
        Ok(())
    }

    async fn counters(&mut self) -> Result<Vec<(CommandStats, CpuMark)>> {
        let mut out = Vec::with_capacity(self.nodes.len());
        for n in &mut self.nodes {
            out.push((
                CommandStats::read(&mut n.conn).await?,
                CpuMark::now(&mut n.conn).await?,
            ));
        }
        Ok(out)
    }

    /// Per node since `before`: commands and CPU.
    async fn since(&mut self, before: &[(CommandStats, CpuMark)]) -> Result<Vec<NodeLoad>> {
        let mut out = Vec::with_capacity(self.nodes.len());
        for (i, (n, (stats, cpu))) in self.nodes.iter_mut().zip(before).enumerate() {
            let now = CommandStats::read(&mut n.conn).await?;
            let used = cpu.since(&mut n.conn).await?;
            let keys = harness::dbsize(&mut n.conn).await?;
            out.push(NodeLoad {
                node: i,
                stats: now.since(stats),
                cpu: used,
                keys,
            });
        }
        Ok(out)
    }
}

/// One node's share of one side's run.
#[derive(Debug, Clone)]
struct NodeLoad {
    node: usize,
    stats: CommandStats,
    /// CPU over the run (`redis` = this node).
    cpu: CpuUse,
    /// Keys it held at the end.
    keys: u64,
}

impl NodeLoad {
    fn usec(&self) -> u64 {
        self.stats
            .0
            .iter()
            .filter(|(n, _)| !stats::is_script(n))
            .map(|(_, c)| c.usec)
            .sum::<u64>()
    }
}

/// What one side of one case measured.
struct Side {
    handled: u64,
    seconds: f64,
    timed_out: bool,
    publish_s: f64,
    nodes: Vec<NodeLoad>,
    /// This process's CPU over the run (engines or consumers).
    process_cpu: f64,
    order: String,
    order_ok: bool,
}

impl Side {
    fn rate(&self) -> f64 {
        self.handled as f64 / self.seconds.max(1e-9)
    }

    fn calls(&self) -> u64 {
        self.nodes.iter().map(|n| n.stats.total_calls()).sum()
    }

    fn per_event(&self, v: f64) -> f64 {
        v / self.handled.max(1) as f64
    }

    /// Redis CPU summed over the nodes, µs per event.
    fn redis_cpu_us(&self) -> f64 {
        let s: f64 = self.nodes.iter().map(|n| n.cpu.redis).sum();
        self.per_event(s * self.seconds * 1e6)
    }

    /// The busiest node's share of the commands.
    fn busiest_share(&self) -> f64 {
        let total = self.calls().max(1) as f64;
        self.nodes
            .iter()
            .map(|n| n.stats.total_calls() as f64 / total)
            .fold(0.0, f64::max)
    }
}

/// Runs both targets, convoy once per `max_unacked` and the baseline once
/// per target.
pub async fn run(env: &mut Env, args: &ClusterArgs, kind: ServerKind) -> Result<Section> {
    if args.cluster_events == 0 || args.cluster_keys == 0 || args.cluster_instances == 0 {
        bail!("--cluster-events, --cluster-keys and --cluster-instances must be above 0");
    }
    if args.cluster_max_unacked.is_empty() || args.cluster_max_unacked.contains(&0) {
        bail!("--cluster-max-unacked needs values above 0");
    }
    for w in &args.cluster_wait {
        match w.as_str() {
            "none" => {}
            "publish" | "acks" if args.cluster_replicas > 0 => {}
            "publish" | "acks" => bail!("--cluster-wait {w} needs --cluster-replicas 1 or more"),
            other => bail!("--cluster-wait takes none, publish or acks, not {other:?}"),
        }
    }
    let masters = args.masters;
    let replicas = args.cluster_replicas;
    progress(
        "cluster",
        format!("starting a cluster of {masters} masters"),
    );
    let cluster =
        tokio::task::spawn_blocking(move || RedisCluster::start_on(kind, masters, replicas))
            .await
            .context("starting the cluster panicked")?
            .map_err(|e| anyhow!("cannot start the Redis Cluster: {e}"))?;
    let result = measure(env, args, &cluster).await;
    tokio::task::spawn_blocking(move || drop(cluster))
        .await
        .context("stopping the cluster panicked")?;
    result
}

async fn measure(env: &mut Env, args: &ClusterArgs, cluster: &RedisCluster) -> Result<Section> {
    let shards = harness::shards();
    let base = Tuning::defaults();
    let mut section = Section::new("cluster");
    section.param("events per case (N)", args.cluster_events);
    section.param("keys (K)", args.cluster_keys);
    section.param(
        "targets",
        format!(
            "one node: the benchmark's redis-server; cluster: {} masters, {} replicas each (RedisCluster::start, appendonly turned off on every node like the single one), every node on this machine",
            args.masters, args.cluster_replicas
        ),
    );
    section.param(
        "convoy",
        format!(
            "N events over K keys pre-published through the outbox; {} in-process engine(s), {} shards, {}",
            args.cluster_instances,
            shards,
            base.describe_lease()
        ),
    );
    section.param(
        "baseline",
        format!(
            "the same envelopes XADDed to one plain stream, {} consumer(s), XREADGROUP COUNT {} + one multi-id XACK per batch; on the cluster the stream is one key, so it lives on one master",
            args.cluster_instances,
            baseline::BATCH
        ),
    );
    section.param(
        "convoy max_unacked (mu)",
        format!("{:?}", args.cluster_max_unacked),
    );
    let mut one = Target {
        name: "one node".into(),
        url: env.url.clone(),
        nodes: vec![Node::connect(&env.url).await?],
        baseline_node: 0,
        shards: vec![shards as usize],
    };
    let mut many = cluster_target(cluster, shards).await?;
    section.param(
        "shards per master",
        many.nodes
            .iter()
            .zip(&many.shards)
            .map(|(n, s)| format!("{}: {s}", n.addr))
            .collect::<Vec<_>>()
            .join(", "),
    );
    let timeout = Duration::from_secs(args.cluster_timeout_secs);
    let mut load_rows = Vec::new();
    let mut rates: BTreeMap<(usize, &str), f64> = BTreeMap::new();
    let mut baseline_rates: BTreeMap<&str, f64> = BTreeMap::new();
    for (tag, target) in [("one", &mut one), ("cluster", &mut many)] {
        progress("cluster", format!("{}: baseline", target.name));
        let b = baseline_side(target, args, timeout).await?;
        progress(
            "cluster",
            format!("{}: baseline {:.0} events/s", target.name, b.rate()),
        );
        baseline_rates.insert(tag, b.rate());
        push_load(&mut load_rows, target, "baseline", &b);
        for &mu in &args.cluster_max_unacked {
            for wait in &args.cluster_wait {
                // One node has no replica to wait for.
                if tag == "one" && wait != "none" {
                    continue;
                }
                let tuning = match wait.as_str() {
                    "publish" => base.with_max_unacked(mu).with_wait(1, false),
                    "acks" => base.with_max_unacked(mu).with_wait(1, true),
                    _ => base.with_max_unacked(mu),
                };
                let case = if wait == "none" {
                    format!("{} mu={mu}", target.name)
                } else {
                    format!("{} mu={mu} wait={wait}", target.name)
                };
                progress("cluster", format!("{case}: convoy"));
                let c = convoy_side(target, args, tuning, timeout).await?;
                progress(
                    "cluster",
                    format!("{case}: convoy {:.0} events/s", c.rate()),
                );
                if wait == "none" {
                    rates.insert((mu, tag), c.rate());
                }
                push_rows(
                    &mut section,
                    &case,
                    &c,
                    &b,
                    args.cluster_events,
                    tag == "cluster",
                );
                push_load(
                    &mut load_rows,
                    target,
                    &format!("convoy mu={mu} wait={wait}"),
                    &c,
                );
            }
        }
    }
    for &mu in &args.cluster_max_unacked {
        let (Some(c1), Some(cn), Some(b1), Some(bn)) = (
            rates.get(&(mu, "one")),
            rates.get(&(mu, "cluster")),
            baseline_rates.get("one"),
            baseline_rates.get("cluster"),
        ) else {
            continue;
        };
        section.rows.push(Row::new(
            format!("cluster / one node mu={mu}"),
            "events/s ratio",
            cn / c1,
            bn / b1,
        ));
    }
    section.tables.push(Table {
        title: "load per node: commands Redis ran (INFO commandstats of each master, commands inside scripts included) and their share, server time of the commands (usec, scripts' own time left out), the node's CPU over the run, and the keys it held after".into(),
        header: [
            "target", "side", "node", "shards", "commands", "of all", "server ms", "of all",
            "CPU s", "keys",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
        rows: load_rows,
    });
    section.note("events/s: N divided by the time from starting the consumers to the N-th handled event (startup and lease taking included).");
    section.note(format!("The machine has {} CPUs: the cluster's masters, the engine and the benchmark share them, so the cluster's events/s shows what the extra hops and per-slot routing cost here, not what more machines would give; the balance of commands over the masters is the figure that carries over.", std::thread::available_parallelism().map_or(1, |n| n.get())));
    section.note("busiest master's share: the most commands one node ran, as a share of all the nodes ran; 1/M would be even. convoy's per-shard keys follow the shards' hash slots; the category-wide keys outside any shard (the wake stream, the instances set) are on one master.");
    section.note("Redis CPU µs/event: used_cpu_user+sys summed over the nodes.");
    Ok(section)
}

/// The cluster's masters as a target, with the shards each holds.
async fn cluster_target(cluster: &RedisCluster, shards: u32) -> Result<Target> {
    let urls = cluster.node_urls();
    let masters = cluster
        .current_masters()
        .map_err(|e| anyhow!("cannot read the cluster's roles: {e}"))?;
    let mut nodes = Vec::new();
    for i in masters {
        let mut node = Node::connect(&urls[i]).await?;
        // Like the single node (no AOF): the kit starts cluster nodes with
        // an append-only file.
        let () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("appendonly")
            .arg("no")
            .query_async(&mut node.conn)
            .await
            .context("CONFIG SET appendonly no failed")?;
        nodes.push(node);
    }
    let ranges = slot_ranges(&mut nodes[0].conn).await?;
    let mut conn = nodes[0].conn.clone();
    let mut held = vec![0usize; nodes.len()];
    for s in 0..shards {
        let port = slot_master(&mut conn, &ranges, &keys::tag(s)).await?;
        held[master_index(&nodes, port)?] += 1;
    }
    let port = slot_master(&mut conn, &ranges, baseline::STREAM).await?;
    let baseline_node = master_index(&nodes, port)?;
    Ok(Target {
        name: format!("cluster ({} masters)", nodes.len()),
        url: cluster.url(),
        nodes,
        baseline_node,
        shards: held,
    })
}

/// The port of the master serving `key`'s hash slot.
async fn slot_master(
    conn: &mut MultiplexedConnection,
    ranges: &[(u16, u16, u16)],
    key: &str,
) -> Result<u16> {
    let slot: u16 = redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(key)
        .query_async(conn)
        .await
        .context("CLUSTER KEYSLOT failed")?;
    ranges
        .iter()
        .find(|(lo, hi, _)| (*lo..=*hi).contains(&slot))
        .map(|(_, _, port)| *port)
        .ok_or_else(|| anyhow!("no master serves slot {slot}"))
}

/// The position in `nodes` of the master on `port`.
fn master_index(nodes: &[Node], port: u16) -> Result<usize> {
    let suffix = format!(":{port}");
    nodes
        .iter()
        .position(|n| n.addr.ends_with(&suffix))
        .ok_or_else(|| anyhow!("slot owner :{port} is not a known master"))
}

/// `CLUSTER SLOTS`: (first slot, last slot, master port) per range.
async fn slot_ranges(conn: &mut MultiplexedConnection) -> Result<Vec<(u16, u16, u16)>> {
    let reply: Value = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query_async(conn)
        .await
        .context("CLUSTER SLOTS failed")?;
    let int = |v: &Value| match v {
        Value::Int(i) => u16::try_from(*i).ok(),
        _ => None,
    };
    let Value::Array(ranges) = reply else {
        bail!("unexpected CLUSTER SLOTS reply");
    };
    let mut out = Vec::new();
    for r in ranges {
        let Value::Array(parts) = r else { continue };
        let (Some(lo), Some(hi), Some(Value::Array(master))) = (
            parts.first().and_then(int),
            parts.get(1).and_then(int),
            parts.get(2),
        ) else {
            continue;
        };
        if let Some(port) = master.get(1).and_then(int) {
            out.push((lo, hi, port));
        }
    }
    if out.is_empty() {
        bail!("CLUSTER SLOTS named no slot range");
    }
    Ok(out)
}

fn push_rows(section: &mut Section, case: &str, c: &Side, b: &Side, n: usize, cluster: bool) {
    let label = case_label(
        case,
        [
            ("convoy", c.timed_out, c.handled),
            ("baseline", b.timed_out, b.handled),
        ],
        n,
    );
    let case = label.as_str();
    let rows = &mut section.rows;
    rows.push(Row::new(case, "events/s", c.rate(), b.rate()));
    rows.push(Row::new(
        case,
        "Redis calls/event",
        c.per_event(c.calls() as f64),
        b.per_event(b.calls() as f64),
    ));
    rows.push(Row::new(
        case,
        "Redis CPU µs/event",
        c.redis_cpu_us(),
        b.redis_cpu_us(),
    ));
    rows.push(Row::new(
        case,
        "consumer CPU µs/event",
        c.per_event(c.process_cpu * c.seconds * 1e6),
        b.per_event(b.process_cpu * b.seconds * 1e6),
    ));
    rows.push(Row::new(
        case,
        "publish events/s",
        n as f64 / c.publish_s.max(1e-9),
        n as f64 / b.publish_s.max(1e-9),
    ));
    if cluster {
        let nodes = c.nodes.len().max(1) as f64;
        let limit = 1.5 / nodes;
        let share = c.busiest_share();
        rows.push(
            Row::new(
                case,
                "busiest master's share of commands %",
                share * 100.0,
                b.busiest_share() * 100.0,
            )
            .target(
                format!("<= {:.0}% (1.5 x even)", limit * 100.0),
                share <= limit,
            ),
        );
    }
    rows.push(
        Row::new(
            case,
            "per-key order",
            Cell::Text(c.order.clone()),
            Cell::Text(b.order.clone()),
        )
        .target("no key goes backwards", c.order_ok),
    );
}

/// Rows of the per-node table for one side.
fn push_load(rows: &mut Vec<Vec<String>>, target: &Target, side: &str, s: &Side) {
    let calls = s.calls().max(1) as f64;
    let usec = s.nodes.iter().map(NodeLoad::usec).sum::<u64>().max(1) as f64;
    for n in &s.nodes {
        let node = &target.nodes[n.node];
        rows.push(vec![
            target.name.clone(),
            side.to_owned(),
            node.addr.clone(),
            target.shards[n.node].to_string(),
            format_num(n.stats.total_calls() as f64),
            format!("{:.1}%", n.stats.total_calls() as f64 * 100.0 / calls),
            format_num(n.usec() as f64 / 1000.0),
            format!("{:.1}%", n.usec() as f64 * 100.0 / usec),
            format!("{:.2}", n.cpu.redis * s.seconds),
            format_num(n.keys as f64),
        ]);
    }
}

async fn convoy_side(
    target: &mut Target,
    args: &ClusterArgs,
    tuning: Tuning,
    timeout: Duration,
) -> Result<Side> {
    let (n, k) = (args.cluster_events, args.cluster_keys);
    target.reset().await?;
    let state = ProbeState::new();
    let publisher = harness::publisher_tuned(&target.url, tuning)?;
    let events = model::spread(k, n);
    let t = Instant::now();
    harness::publish(&publisher, &events).await?;
    let publish_s = t.elapsed().as_secs_f64();
    drop(events);
    let before = target.counters().await?;
    let process = stats::process_cpu_s()?;
    let start = Instant::now();
    let engines = harness::start_engines(&target.url, tuning, "e", args.cluster_instances, &state)?;
    let done = harness::wait_for(timeout, Duration::from_millis(1), || {
        state.handled() >= n as u64
    })
    .await;
    let seconds = start.elapsed().as_secs_f64();
    let handled = state.handled();
    let process_cpu = (stats::process_cpu_s()? - process) / seconds.max(1e-9);
    let nodes = target.since(&before).await?;
    harness::stop_engines(engines).await?;
    let (order, order_ok) = super::throughput::check(&state, k, n);
    Ok(Side {
        handled,
        seconds,
        timed_out: !done,
        publish_s,
        nodes,
        process_cpu,
        order,
        order_ok,
    })
}

async fn baseline_side(target: &mut Target, args: &ClusterArgs, timeout: Duration) -> Result<Side> {
    let (n, k) = (args.cluster_events, args.cluster_keys);
    target.reset().await?;
    let state = ProbeState::new();
    let url = target.nodes[target.baseline_node].url.clone();
    let client = redis::Client::open(url.as_str()).context("invalid node URL")?;
    let mut conn = target.nodes[target.baseline_node].conn.clone();
    let events = model::spread(k, n);
    let t = Instant::now();
    baseline::prepublish(&mut conn, &events).await?;
    let publish_s = t.elapsed().as_secs_f64();
    drop(events);
    baseline::create_group(&mut conn, "0").await?;
    let before = target.counters().await?;
    let process = stats::process_cpu_s()?;
    let stop = CancellationToken::new();
    let start = Instant::now();
    let consumers = baseline::start_consumers(
        &client,
        "c",
        args.cluster_instances,
        Duration::from_millis(100),
        &state,
        &stop,
    )
    .await?;
    let done = harness::wait_for(timeout, Duration::from_millis(1), || {
        state.handled() >= n as u64
    })
    .await;
    let seconds = start.elapsed().as_secs_f64();
    let handled = state.handled();
    let process_cpu = (stats::process_cpu_s()? - process) / seconds.max(1e-9);
    let nodes = target.since(&before).await?;
    stop.cancel();
    baseline::join(consumers).await?;
    let (order, _) = super::throughput::check(&state, k, n);
    Ok(Side {
        handled,
        seconds,
        timed_out: !done,
        publish_s,
        nodes,
        process_cpu,
        order,
        order_ok: true,
    })
}
