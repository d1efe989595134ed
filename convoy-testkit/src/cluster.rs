//! A local Redis Cluster: real `redis-server` (or `valkey-server`, see
//! [`ServerKind`]) processes in cluster mode on free ports, joined by
//! `redis-cli --cluster create`.
//!
//! Besides stopping, killing, freezing and restarting single nodes (through
//! [`RedisCluster::node_mut`]), the cluster injects the faults of a real
//! deployment:
//!
//! - [`kill_clients`](RedisCluster::kill_clients): `CLIENT KILL` of every
//!   client connection on every node at once;
//! - [`migrate_slot`](RedisCluster::migrate_slot): a live, paced slot
//!   migration (`IMPORTING` / `MIGRATING` / `MIGRATE` key by key /
//!   `SETSLOT NODE`), from another thread while the application runs;
//! - [`failover`](RedisCluster::failover): a graceful `CLUSTER FAILOVER`;
//! - [`kill_master`](RedisCluster::kill_master): `kill -9` of a master and
//!   the automatic failover to its replica;
//! - [`cut_replication`](RedisCluster::cut_replication) then
//!   [`lose_master`](RedisCluster::lose_master): the master's replica is
//!   cut off (frozen and its replication link killed), so writes made after
//!   the cut exist only on the master, which is then killed and replaced by
//!   that replica: a deterministic loss of acknowledged writes.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::TestingError;
use super::process::free_port;
use super::server::{RedisServer, ServerKind};

/// How long [`RedisCluster::start`] waits for `cluster_state:ok`.
const FORM_TIMEOUT: Duration = Duration::from_secs(30);
/// How long [`RedisCluster::cli`] waits for `redis-cli` (a frozen node
/// never answers).
const CLI_TIMEOUT: Duration = Duration::from_secs(10);
/// How long [`RedisCluster::wait_ok`] waits for one node's `CLUSTER INFO`.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// Connect, read and write timeout of the kit's own connections to a node.
const NODE_TIMEOUT: Duration = Duration::from_secs(2);
/// How long [`RedisCluster::kill_clients`] waits for one node (a frozen
/// one never answers).
const KILL_TIMEOUT: Duration = Duration::from_secs(1);
/// The `timeout` argument of each `MIGRATE`, in milliseconds.
const MIGRATE_TIMEOUT_MS: u64 = 5000;
/// How many times one key's `MIGRATE` is tried before the migration fails.
const MIGRATE_ATTEMPTS: usize = 10;
/// How many connections the kit's own commands try when one is lost.
const QUERY_ATTEMPTS: usize = 5;
/// How many times a node is started with new ports when one is taken.
const NODE_ATTEMPTS: usize = 5;
/// The user (and password) a cut-off replica is told to log in to its
/// master as: no such user exists, so the master refuses it.
const CUT_OFF_USER: &str = "convoy-testkit-cut-off";
/// Every how long [`RedisCluster::lose_master`] repeats
/// `CLUSTER FAILOVER TAKEOVER` until the replica is a master.
const TAKEOVER_RETRY: Duration = Duration::from_secs(2);

/// Options for a [`RedisCluster`]; made by [`RedisCluster::builder`].
#[derive(Debug, Clone)]
pub struct RedisClusterBuilder {
    masters: usize,
    replicas: usize,
    kind: Option<ServerKind>,
    fsync_always: bool,
    node_timeout_ms: u64,
    full_coverage: bool,
}

impl RedisClusterBuilder {
    /// Runs every node as `kind` rather than the server `CONVOY_TEST_SERVER`
    /// names ([`ServerKind::from_env`]).
    pub fn server(mut self, kind: ServerKind) -> Self {
        self.kind = Some(kind);
        self
    }

    /// `appendfsync always` on every node, so a write a node acknowledged
    /// survives its `kill -9` (off by default: the append-only file is on,
    /// with `appendfsync everysec`).
    pub fn fsync_always(mut self, on: bool) -> Self {
        self.fsync_always = on;
        self
    }

    /// `cluster-node-timeout` in milliseconds (default 2000): how long a
    /// node may not answer before the others count it as failed, and so
    /// roughly how long an automatic failover takes.
    pub fn node_timeout_ms(mut self, ms: u64) -> Self {
        self.node_timeout_ms = ms;
        self
    }

    /// `cluster-require-full-coverage` on every node (default `true`, as
    /// Redis's own default). With `true`, once a master is counted as
    /// failed every node refuses every command on keys (`CLUSTERDOWN`)
    /// until its replica is promoted; with `false` the other masters go on
    /// serving their slots meanwhile.
    pub fn require_full_coverage(mut self, on: bool) -> Self {
        self.full_coverage = on;
        self
    }

    /// One node of the cluster. Its bus port is taken with its client
    /// port: when either turns out to be taken (another test's server
    /// bound it between our look and our bind), both are picked again.
    fn start_node(&self, kind: ServerKind) -> Result<RedisServer, TestingError> {
        let mut last = None;
        for _ in 0..NODE_ATTEMPTS {
            let bus = free_port()?;
            let mut node = RedisServer::builder()
                .server(kind)
                .arg("--cluster-enabled")
                .arg("yes")
                .arg("--cluster-config-file")
                .arg("nodes.conf")
                .arg("--cluster-port")
                .arg(bus.to_string())
                .arg("--cluster-node-timeout")
                .arg(self.node_timeout_ms.to_string())
                .arg("--cluster-require-full-coverage")
                .arg(if self.full_coverage { "yes" } else { "no" });
            node = if self.fsync_always {
                node.append_only(true)
            } else {
                node.arg("--appendonly").arg("yes")
            };
            match node.start() {
                Err(e @ TestingError::PortTaken { .. }) => last = Some(e),
                other => return other,
            }
        }
        Err(last.unwrap_or(TestingError::Cluster {
            reason: "no free ports for a node".into(),
        }))
    }

    /// Starts the nodes, forms the cluster (slots spread evenly over the
    /// masters) and waits until every node reports `cluster_state:ok` and
    /// every replica is in sync with its master.
    pub fn start(self) -> Result<RedisCluster, TestingError> {
        let kind = match self.kind {
            Some(kind) => kind,
            None => ServerKind::from_env()?,
        };
        let (masters, replicas) = (self.masters, self.replicas);
        if masters < 3 {
            return Err(TestingError::Cluster {
                reason: format!("a Redis Cluster needs at least 3 masters, not {masters}"),
            });
        }
        let mut nodes = Vec::with_capacity(masters * (1 + replicas));
        for _ in 0..masters * (1 + replicas) {
            nodes.push(self.start_node(kind)?);
        }
        let mut create = Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for n in &nodes {
            create.arg(format!("127.0.0.1:{}", n.port()));
        }
        create
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdin(Stdio::null());
        let out = create.output().map_err(|source| TestingError::Spawn {
            program: "redis-cli".into(),
            source,
        })?;
        if !out.status.success() {
            return Err(TestingError::Cluster {
                reason: format!(
                    "redis-cli --cluster create failed:\n{}{}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                ),
            });
        }
        let mut cluster = RedisCluster {
            nodes,
            masters,
            ids: Vec::new(),
        };
        for i in 0..cluster.nodes.len() {
            let id = cluster.cli(i, &["CLUSTER", "MYID"])?.trim().to_string();
            if id.is_empty() {
                return Err(TestingError::Cluster {
                    reason: format!("node {i} did not answer CLUSTER MYID"),
                });
            }
            cluster.ids.push(id);
        }
        cluster.wait_ok(FORM_TIMEOUT)?;
        cluster.wait_replicas_synced(FORM_TIMEOUT)?;
        Ok(cluster)
    }
}

/// A Redis Cluster of `masters` masters, each with `replicas` replicas,
/// every node a [`RedisServer`] of its own (so each can be stopped,
/// killed, frozen or restarted). Dropping it stops every node.
///
/// The cluster bus of each node listens on a second free port
/// (`--cluster-port`), so node ports need not be below 55536.
///
/// Nodes are named by their index in [`nodes`](Self::nodes), which never
/// changes; which of them are masters does (failovers, see
/// [`current_masters`](Self::current_masters)). The methods taking `&self`
/// may run on another thread while the test goes on (the cluster is
/// `Sync`: share it with [`std::thread::scope`] or an `Arc`), for example a
/// long [`migrate_slot`](Self::migrate_slot).
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    masters: usize,
    /// Each node's cluster node id (kept in its `nodes.conf` across
    /// restarts).
    ids: Vec<String>,
}

/// What [`RedisCluster::migrate_slot`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotMigration {
    /// The slot that moved.
    pub slot: u16,
    /// The node that served it before (an index into
    /// [`RedisCluster::nodes`]).
    pub from: usize,
    /// The node that serves it now.
    pub to: usize,
    /// How many keys were moved (including keys created in the slot on the
    /// source while the migration ran).
    pub keys: usize,
}

impl RedisCluster {
    /// Starts `masters` masters with `replicas` replicas each, forms the
    /// cluster (slots spread evenly over the masters) and waits until every
    /// node reports `cluster_state:ok`.
    pub fn start(masters: usize, replicas: usize) -> Result<RedisCluster, TestingError> {
        RedisCluster::builder(masters, replicas).start()
    }

    /// [`RedisCluster::start`] with every node running `kind` (rather than
    /// the server `CONVOY_TEST_SERVER` names).
    pub fn start_on(
        kind: ServerKind,
        masters: usize,
        replicas: usize,
    ) -> Result<RedisCluster, TestingError> {
        RedisCluster::builder(masters, replicas)
            .server(kind)
            .start()
    }

    /// Options for a cluster of `masters` masters with `replicas` replicas
    /// each; finish with [`start`](RedisClusterBuilder::start).
    pub fn builder(masters: usize, replicas: usize) -> RedisClusterBuilder {
        RedisClusterBuilder {
            masters,
            replicas,
            kind: None,
            fsync_always: false,
            node_timeout_ms: 2000,
            full_coverage: true,
        }
    }

    /// Waits until every replica's link to its master is up (its first
    /// full sync done), so a `WAIT` or a failover right after start works.
    /// Nodes that are not running are skipped.
    pub fn wait_replicas_synced(&self, timeout: Duration) -> Result<(), TestingError> {
        let start = Instant::now();
        for i in 0..self.nodes.len() {
            loop {
                let info = self.cli_within(i, &["INFO", "replication"], PROBE_TIMEOUT)?;
                if info.is_empty()
                    || info.contains("role:master")
                    || info.contains("master_link_status:up")
                {
                    break;
                }
                if start.elapsed() > timeout {
                    return Err(TestingError::Cluster {
                        reason: format!(
                            "replica {i} did not sync with its master within {timeout:?}"
                        ),
                    });
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(())
    }

    /// Every node (masters first, as created; roles change on failover).
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// Node `i`, to stop, kill, freeze or restart it.
    pub fn node_mut(&mut self, i: usize) -> &mut RedisServer {
        &mut self.nodes[i]
    }

    /// How many masters the cluster was created with.
    pub fn masters(&self) -> usize {
        self.masters
    }

    /// Node `i`'s cluster node id (the id `CLUSTER NODES` and
    /// `CLUSTER SETSLOT` use; it survives restarts).
    pub fn node_id(&self, i: usize) -> &str {
        &self.ids[i]
    }

    /// The index of the node listening on `port`, if any.
    pub fn node_on_port(&self, port: u16) -> Option<usize> {
        self.nodes.iter().position(|n| n.port() == port)
    }

    /// `redis+cluster://127.0.0.1:p1,127.0.0.1:p2,.../`: every node as a
    /// seed.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect();
        format!("redis+cluster://{}/", hosts.join(","))
    }

    /// `redis://` URLs of the nodes, one each.
    pub fn node_urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// Runs `redis-cli` against node `i` and returns what it printed.
    ///
    /// A node that is not running prints nothing (`redis-cli` reports the
    /// refused connection on its standard error); so does a node that does
    /// not answer within 10 seconds (a frozen one), after which `redis-cli`
    /// is killed.
    pub fn cli(&self, i: usize, args: &[&str]) -> Result<String, TestingError> {
        self.cli_within(i, args, CLI_TIMEOUT)
    }

    /// [`cli`](Self::cli) with its own timeout, run again (up to
    /// `QUERY_ATTEMPTS` times) when the server closed `redis-cli`'s
    /// connection before it printed anything: a
    /// [`kill_clients`](Self::kill_clients) meanwhile, not an answer. (The
    /// kit's commands are idempotent, so one that ran before its connection
    /// was killed may run again.)
    fn cli_within(
        &self,
        i: usize,
        args: &[&str],
        timeout: Duration,
    ) -> Result<String, TestingError> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let (out, err) = self.cli_once(i, args, timeout)?;
            let killed = out.is_empty()
                && (err.contains("Server closed the connection")
                    || err.contains("Connection reset by peer"));
            if !killed || attempt >= QUERY_ATTEMPTS {
                return Ok(out);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// One `redis-cli` run: what it printed on its standard output and on
    /// its standard error.
    fn cli_once(
        &self,
        i: usize,
        args: &[&str],
        timeout: Duration,
    ) -> Result<(String, String), TestingError> {
        let mut child = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.nodes[i].port().to_string()])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| TestingError::Spawn {
                program: "redis-cli".into(),
                source,
            })?;
        let (Some(mut stdout), Some(mut stderr)) = (child.stdout.take(), child.stderr.take())
        else {
            return Ok((String::new(), String::new()));
        };
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            // redis-cli writes at most a line of errors: it cannot fill the
            // pipe while its output is being read.
            let mut out = Vec::new();
            let mut err = Vec::new();
            let _ = stdout.read_to_end(&mut out);
            let _ = stderr.read_to_end(&mut err);
            let _ = tx.send((out, err));
        });
        let (out, err) = match rx.recv_timeout(timeout) {
            Ok(both) => both,
            Err(_) => {
                let _ = child.kill();
                (Vec::new(), Vec::new())
            }
        };
        let pid = child.id();
        child
            .wait()
            .map_err(|source| TestingError::Wait { pid, source })?;
        Ok((
            String::from_utf8_lossy(&out).into_owned(),
            String::from_utf8_lossy(&err).into_owned(),
        ))
    }

    /// A connection of the kit's own to node `i`, whose commands fail after
    /// two seconds (a frozen node never answers).
    fn connect(&self, i: usize) -> Result<redis::Connection, TestingError> {
        self.connect_with(i, NODE_TIMEOUT)
    }

    fn connect_with(&self, i: usize, timeout: Duration) -> Result<redis::Connection, TestingError> {
        let client = self.nodes[i].client()?;
        let conn = client
            .get_connection_with_timeout(NODE_TIMEOUT)
            .map_err(TestingError::redis("connecting to a cluster node"))?;
        conn.set_read_timeout(Some(timeout))
            .and_then(|()| conn.set_write_timeout(Some(timeout)))
            .map_err(TestingError::redis("setting a node connection's timeouts"))?;
        Ok(conn)
    }

    /// [`connect_with`](Self::connect_with), tried again when the
    /// connection is lost while it is being set up: a
    /// [`kill_clients`](Self::kill_clients) can land in the handshake of a
    /// connection that replaces a killed one.
    fn reconnect(&self, i: usize, timeout: Duration) -> Result<redis::Connection, TestingError> {
        retry_lost(|| self.connect_with(i, timeout))
    }

    /// Runs `cmd` on node `i` on a fresh connection of the kit's own,
    /// again on a new connection when the connection is lost (a
    /// [`kill_clients`](Self::kill_clients) meanwhile).
    fn query<T: redis::FromRedisValue>(
        &self,
        i: usize,
        cmd: &redis::Cmd,
        action: &'static str,
    ) -> Result<T, TestingError> {
        retry_lost(|| {
            self.connect(i)
                .and_then(|mut conn| cmd.query(&mut conn).map_err(TestingError::redis(action)))
        })
    }

    /// The nodes that are masters now (by index), from `ROLE`.
    pub fn current_masters(&self) -> Result<Vec<usize>, TestingError> {
        let mut v = Vec::new();
        for i in 0..self.nodes.len() {
            if self.cli(i, &["ROLE"])?.lines().next() == Some("master") {
                v.push(i);
            }
        }
        Ok(v)
    }

    /// The running nodes that are replicas of node `master` now (by index),
    /// from each node's `ROLE`. A replica keeps naming its master while the
    /// master is down, so this works on a killed master too (until a
    /// failover). Frozen nodes are not found.
    pub fn replicas_of(&self, master: usize) -> Result<Vec<usize>, TestingError> {
        let port = self.nodes[master].port().to_string();
        let mut v = Vec::new();
        for i in 0..self.nodes.len() {
            if i == master {
                continue;
            }
            let role = self.cli_within(i, &["ROLE"], PROBE_TIMEOUT)?;
            let mut lines = role.lines();
            if lines.next() == Some("slave") && lines.nth(1) == Some(port.as_str()) {
                v.push(i);
            }
        }
        Ok(v)
    }

    /// The hash slot of `key` (CRC16 of the key, or of its `{hash tag}`,
    /// modulo 16384), as `CLUSTER KEYSLOT` computes it.
    pub fn key_slot(key: &[u8]) -> u16 {
        let tagged = key
            .iter()
            .position(|b| *b == b'{')
            .and_then(|open| {
                let rest = &key[open + 1..];
                let close = rest.iter().position(|b| *b == b'}')?;
                (close > 0).then(|| &rest[..close])
            })
            .unwrap_or(key);
        crc16_xmodem(tagged) % 16384
    }

    /// The master serving `slot` now: among the running masters, the one
    /// that claims the slot with the newest config epoch (a restarted old
    /// master may still claim slots it lost until it hears otherwise).
    pub fn master_of_slot(&self, slot: u16) -> Result<usize, TestingError> {
        let mut best: Option<(u64, usize)> = None;
        for i in 0..self.nodes.len() {
            let nodes = self.cli_within(i, &["CLUSTER", "NODES"], PROBE_TIMEOUT)?;
            let Some(me) = nodes.lines().find(|l| l.contains("myself")) else {
                continue;
            };
            let fields: Vec<&str> = me.split_whitespace().collect();
            if fields.len() < 8 || !fields[2].split(',').any(|f| f == "master") {
                continue;
            }
            let epoch: u64 = fields[6].parse().unwrap_or(0);
            let serves = fields[8..].iter().any(|range| {
                if range.starts_with('[') {
                    return false;
                }
                match range.split_once('-') {
                    Some((a, b)) => {
                        matches!((a.parse::<u16>(), b.parse::<u16>()), (Ok(a), Ok(b)) if a <= slot && slot <= b)
                    }
                    None => range.parse::<u16>() == Ok(slot),
                }
            });
            if serves && best.is_none_or(|(e, _)| epoch > e) {
                best = Some((epoch, i));
            }
        }
        best.map(|(_, i)| i).ok_or_else(|| TestingError::Cluster {
            reason: format!("no running master claims slot {slot}"),
        })
    }

    /// The master serving `key` now ([`key_slot`](Self::key_slot), then
    /// [`master_of_slot`](Self::master_of_slot)).
    pub fn master_of_key(&self, key: &str) -> Result<usize, TestingError> {
        self.master_of_slot(Self::key_slot(key.as_bytes()))
    }

    /// Kills every client connection on every running node at once:
    /// `CLIENT KILL TYPE normal SKIPME yes` and `CLIENT KILL TYPE pubsub
    /// SKIPME yes` (replication links and the cluster bus are not clients
    /// of these types). Nodes that are down or frozen (no answer within a
    /// second) are skipped. Returns how many connections were killed.
    pub fn kill_clients(&self) -> Result<usize, TestingError> {
        let mut killed = 0;
        for i in 0..self.nodes.len() {
            let Ok(mut conn) = self.connect_with(i, KILL_TIMEOUT) else {
                continue;
            };
            for kind in ["normal", "pubsub"] {
                let n: redis::RedisResult<usize> = redis::cmd("CLIENT")
                    .arg("KILL")
                    .arg("TYPE")
                    .arg(kind)
                    .arg("SKIPME")
                    .arg("yes")
                    .query(&mut conn);
                // A frozen node times out: skip it.
                match n {
                    Ok(n) => killed += n,
                    Err(_) => break,
                }
            }
        }
        Ok(killed)
    }

    /// Moves `slot` to master `to` with the protocol of a live resharding,
    /// while clients go on using the cluster:
    ///
    /// 1. `CLUSTER SETSLOT slot IMPORTING <source>` on `to`, `CLUSTER
    ///    SETSLOT slot MIGRATING <to>` on the slot's current master;
    /// 2. until `CLUSTER GETKEYSINSLOT slot 1` on the source returns no key:
    ///    `MIGRATE` that key (`REPLACE`; retried on `IOERR` and on a lost
    ///    connection, so a [`kill_clients`](Self::kill_clients) meanwhile
    ///    does not stop it), then sleep
    ///    `pause_per_key` (so a slot with `n` keys takes at least `n *
    ///    pause_per_key`; keys the application creates in the slot meanwhile
    ///    are moved too);
    /// 3. `CLUSTER SETSLOT slot NODE <to>` on `to`, then on the source, then
    ///    on every other running master.
    ///
    /// Meanwhile clients get `ASK` for keys already moved and `TRYAGAIN`
    /// for commands over keys on both sides. If the slot is already `to`'s
    /// it returns at once with `keys: 0`. A failure leaves the slot
    /// half-migrated (`redis-cli --cluster fix` repairs it).
    pub fn migrate_slot(
        &self,
        slot: u16,
        to: usize,
        pause_per_key: Duration,
    ) -> Result<SlotMigration, TestingError> {
        let fail = |reason: String| TestingError::Cluster {
            reason: format!("migrating slot {slot} to node {to}: {reason}"),
        };
        let from = self.master_of_slot(slot)?;
        if from == to {
            return Ok(SlotMigration {
                slot,
                from,
                to,
                keys: 0,
            });
        }
        if self.cli(to, &["ROLE"])?.lines().next() != Some("master") {
            return Err(fail(format!("node {to} is not a master")));
        }
        let setslot = |node: usize, state: &str, id: &str| -> Result<(), TestingError> {
            let mut cmd = redis::cmd("CLUSTER");
            cmd.arg("SETSLOT").arg(slot).arg(state).arg(id);
            self.query::<()>(node, &cmd, "running CLUSTER SETSLOT")
        };
        setslot(to, "IMPORTING", &self.ids[from])?;
        setslot(from, "MIGRATING", &self.ids[to])?;
        // MIGRATE answers once the target has the key: allow for its own
        // timeout.
        let migrate_timeout = Duration::from_millis(MIGRATE_TIMEOUT_MS) + NODE_TIMEOUT;
        let mut source = self.reconnect(from, migrate_timeout)?;
        let target_port = self.nodes[to].port();
        let mut keys = 0;
        loop {
            let mut getkeys = redis::cmd("CLUSTER");
            getkeys.arg("GETKEYSINSLOT").arg(slot).arg(1);
            let mut attempt = 0;
            let batch: Vec<Vec<u8>> = loop {
                attempt += 1;
                match getkeys.query(&mut source) {
                    Ok(batch) => break batch,
                    Err(e) if attempt < MIGRATE_ATTEMPTS && connection_lost(&e) => {
                        std::thread::sleep(Duration::from_millis(100));
                        source = self.reconnect(from, migrate_timeout)?;
                    }
                    Err(e) => {
                        return Err(fail(format!("CLUSTER GETKEYSINSLOT failed: {e}")));
                    }
                }
            };
            let Some(key) = batch.into_iter().next() else {
                break;
            };
            let mut attempt = 0;
            loop {
                attempt += 1;
                let reply: redis::RedisResult<String> = redis::cmd("MIGRATE")
                    .arg("127.0.0.1")
                    .arg(target_port)
                    .arg("")
                    .arg(0)
                    .arg(MIGRATE_TIMEOUT_MS)
                    .arg("REPLACE")
                    .arg("KEYS")
                    .arg(&key)
                    .query(&mut source);
                match reply {
                    // NOKEY: it was deleted (or expired) meanwhile.
                    Ok(_) => break,
                    Err(e) if attempt < MIGRATE_ATTEMPTS => {
                        // IOERR (the target was slow, or the source's
                        // connection to it was killed), or our own
                        // connection lost: MIGRATE is atomic on the source,
                        // so trying again is safe.
                        std::thread::sleep(Duration::from_millis(100));
                        if connection_lost(&e) || e.is_timeout() {
                            source = self.reconnect(from, migrate_timeout)?;
                        }
                    }
                    Err(e) => {
                        return Err(fail(format!(
                            "MIGRATE of key {:?} failed {attempt} times: {e}",
                            String::from_utf8_lossy(&key)
                        )));
                    }
                }
            }
            keys += 1;
            if !pause_per_key.is_zero() {
                std::thread::sleep(pause_per_key);
            }
        }
        let target_id = self.ids[to].clone();
        setslot(to, "NODE", &target_id)?;
        setslot(from, "NODE", &target_id)?;
        for other in self.current_masters()? {
            if other != to && other != from {
                // The new owner's config epoch reaches it through the
                // cluster bus anyway; telling it now only saves a redirect.
                let _ = setslot(other, "NODE", &target_id);
            }
        }
        Ok(SlotMigration {
            slot,
            from,
            to,
            keys,
        })
    }

    /// Cuts master `master` off from its replica, so that writes made from
    /// now on reach the master only: the replica is told to log in to its
    /// master as a user that does not exist (`CONFIG SET masteruser`,
    /// `masterauth`), then its replication link is killed on the master
    /// (`CLIENT KILL TYPE replica`), so each attempt to reconnect is
    /// refused at `AUTH`, before any sync. The replica stays up and answers
    /// clients (a frozen one would stall every cluster client that checks
    /// its connections, which is another fault). Returns the replica's
    /// index, for [`lose_master`](Self::lose_master) or
    /// [`heal_replication`](Self::heal_replication).
    ///
    /// Waits first until the replica's link is up, so everything written
    /// before the call reaches it.
    pub fn cut_replication(&mut self, master: usize) -> Result<usize, TestingError> {
        let replica = *self
            .replicas_of(master)?
            .first()
            .ok_or_else(|| TestingError::Cluster {
                reason: format!("node {master} has no running replica to cut off"),
            })?;
        let start = Instant::now();
        while !self
            .cli(replica, &["INFO", "replication"])?
            .contains("master_link_status:up")
        {
            if start.elapsed() > FORM_TIMEOUT {
                return Err(TestingError::Cluster {
                    reason: format!("replica {replica} of node {master} never synced"),
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        // Let what was written so far reach the replica: WAIT on a fresh
        // connection waits for the master's whole replication offset.
        let mut wait = redis::cmd("WAIT");
        wait.arg(1).arg(1000);
        self.query::<i64>(master, &wait, "waiting for the replica")?;
        self.replication_login(replica, CUT_OFF_USER, "refusing the replica its master")?;
        let mut kill = redis::cmd("CLIENT");
        kill.arg("KILL").arg("TYPE").arg("replica");
        let killed: usize = self.query(master, &kill, "killing the replication link")?;
        if killed == 0 {
            return Err(TestingError::Cluster {
                reason: format!("node {master} had no replication link to kill"),
            });
        }
        Ok(replica)
    }

    /// Lets replica `replica`, cut off by
    /// [`cut_replication`](Self::cut_replication), log in to its master
    /// again: it re-syncs.
    pub fn heal_replication(&self, replica: usize) -> Result<(), TestingError> {
        self.replication_login(replica, "", "letting the replica log in again")
    }

    /// Sets the user and password replica `replica` logs in to its master
    /// with (`masteruser`, `masterauth`; `""` for none).
    fn replication_login(
        &self,
        replica: usize,
        user: &str,
        action: &'static str,
    ) -> Result<(), TestingError> {
        let mut set = redis::cmd("CONFIG");
        set.arg("SET")
            .arg("masteruser")
            .arg(user)
            .arg("masterauth")
            .arg(user);
        self.query::<()>(replica, &set, action)
    }

    /// Loses master `master` to its replica `replica`: `kill -9` of the
    /// master, then `CLUSTER FAILOVER TAKEOVER` on the replica (no election
    /// and no data-age check) until it is a master, and waits for
    /// `cluster_state:ok`. Whatever the replica had not received (it was
    /// cut off by [`cut_replication`](Self::cut_replication)) is gone; the
    /// new master's replication login is restored.
    ///
    /// The old master stays down; [`restart_node`](Self::restart_node)
    /// brings it back as the new master's replica (it then discards its own
    /// data in a full sync).
    pub fn lose_master(&mut self, master: usize, replica: usize) -> Result<(), TestingError> {
        self.nodes[master].kill()?;
        let start = Instant::now();
        let mut asked: Option<Instant> = None;
        while self.cli(replica, &["ROLE"])?.lines().next() != Some("master") {
            if start.elapsed() > FORM_TIMEOUT {
                return Err(TestingError::Cluster {
                    reason: format!(
                        "node {replica} did not become a master after CLUSTER FAILOVER TAKEOVER within {FORM_TIMEOUT:?}"
                    ),
                });
            }
            if asked.is_none_or(|at| at.elapsed() > TAKEOVER_RETRY) {
                asked = Some(Instant::now());
                let reply = self.cli(replica, &["CLUSTER", "FAILOVER", "TAKEOVER"])?;
                let reply = reply.trim();
                if !reply.is_empty() && !reply.eq_ignore_ascii_case("OK") {
                    return Err(TestingError::Cluster {
                        reason: format!("CLUSTER FAILOVER TAKEOVER on node {replica}: {reply}"),
                    });
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.heal_replication(replica)?;
        self.wait_ok(FORM_TIMEOUT)
    }

    /// Crashes master `master` with `kill -9` and waits until one of its
    /// replicas has taken over by itself (the cluster's own failure
    /// detection and election, about `cluster-node-timeout` plus a second)
    /// and the cluster is ok. Returns the new master's index. The old
    /// master stays down ([`restart_node`](Self::restart_node)).
    pub fn kill_master(&mut self, master: usize) -> Result<usize, TestingError> {
        let replicas = self.replicas_of(master)?;
        if replicas.is_empty() {
            return Err(TestingError::Cluster {
                reason: format!("node {master} has no running replica to take over"),
            });
        }
        self.nodes[master].kill()?;
        let start = Instant::now();
        loop {
            for &r in &replicas {
                if self.cli_within(r, &["ROLE"], PROBE_TIMEOUT)?.lines().next() == Some("master") {
                    self.wait_ok(FORM_TIMEOUT)?;
                    return Ok(r);
                }
            }
            if start.elapsed() > FORM_TIMEOUT {
                return Err(TestingError::Cluster {
                    reason: format!(
                        "no replica of node {master} ({replicas:?}) took over within {FORM_TIMEOUT:?}"
                    ),
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Restarts node `i` (stopped or killed; a running one is stopped
    /// first) on its port and directory, and waits until the cluster is ok
    /// and every replica is in sync. A master that was replaced meanwhile
    /// comes back as a replica of its successor.
    pub fn restart_node(&mut self, i: usize) -> Result<(), TestingError> {
        self.nodes[i].restart()?;
        self.wait_ok(FORM_TIMEOUT)?;
        self.wait_replicas_synced(FORM_TIMEOUT)
    }

    /// Promotes replica `i` with `CLUSTER FAILOVER` (its master becomes
    /// its replica) and waits until it is a master and the cluster is ok.
    pub fn failover(&self, i: usize) -> Result<(), TestingError> {
        let start = Instant::now();
        let late = |what: &str| TestingError::Cluster {
            reason: format!("node {i} {what} within {FORM_TIMEOUT:?}"),
        };
        // A replica takes over only once it is in sync with its master.
        while !self
            .cli(i, &["INFO", "replication"])?
            .contains("master_link_status:up")
        {
            if start.elapsed() > FORM_TIMEOUT {
                return Err(late("never synced with its master"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let mut asked: Option<Instant> = None;
        while self.cli(i, &["ROLE"])?.lines().next() != Some("master") {
            if start.elapsed() > FORM_TIMEOUT {
                return Err(late("did not become a master after CLUSTER FAILOVER"));
            }
            // The master must agree; ask again if it has not yet.
            if asked.is_none_or(|at| at.elapsed() > Duration::from_secs(5)) {
                asked = Some(Instant::now());
                let reply = self.cli(i, &["CLUSTER", "FAILOVER"])?;
                if !reply.trim().eq_ignore_ascii_case("OK") {
                    return Err(TestingError::Cluster {
                        reason: format!("CLUSTER FAILOVER on node {i}: {}", reply.trim()),
                    });
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.wait_ok(FORM_TIMEOUT)
    }

    /// Waits until every running node reports `cluster_state:ok` (nodes
    /// that are down, or frozen, are skipped).
    pub fn wait_ok(&self, timeout: Duration) -> Result<(), TestingError> {
        let start = Instant::now();
        loop {
            let mut ok = true;
            for i in 0..self.nodes.len() {
                let info = self.cli_within(i, &["CLUSTER", "INFO"], PROBE_TIMEOUT)?;
                if !info.is_empty() && !info.contains("cluster_state:ok") {
                    ok = false;
                }
            }
            if ok {
                return Ok(());
            }
            if start.elapsed() > timeout {
                return Err(TestingError::Cluster {
                    reason: format!("cluster_state is not ok after {timeout:?}"),
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Runs `attempt` up to `QUERY_ATTEMPTS` times, 100 ms apart, while it
/// fails because its connection was lost.
fn retry_lost<T>(mut attempt: impl FnMut() -> Result<T, TestingError>) -> Result<T, TestingError> {
    let mut tries = 0;
    loop {
        tries += 1;
        match attempt() {
            Err(TestingError::Redis { source, .. })
                if tries < QUERY_ATTEMPTS && connection_lost(&source) =>
            {
                std::thread::sleep(Duration::from_millis(100));
            }
            other => return other,
        }
    }
}

/// Whether `e` means the connection (not the command) failed: refused,
/// dropped, or broken by a `CLIENT KILL`.
fn connection_lost(e: &redis::RedisError) -> bool {
    e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal()
}

/// CRC16-CCITT (XMODEM: polynomial 0x1021, initial value 0), the hash of
/// Redis Cluster's key slots.
fn crc16_xmodem(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in bytes {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_slots_match_the_redis_cluster_specification() {
        // The specification's check value, and slots redis-server computes.
        assert_eq!(crc16_xmodem(b"123456789"), 0x31c3);
        assert_eq!(RedisCluster::key_slot(b"foo"), 12182);
        assert_eq!(RedisCluster::key_slot(b"{user1000}.following"), 3443);
        assert_eq!(
            RedisCluster::key_slot(b"{user1000}.followers"),
            RedisCluster::key_slot(b"user1000")
        );
        // An empty tag hashes the whole key.
        assert_eq!(
            RedisCluster::key_slot(b"foo{}{bar}"),
            crc16_xmodem(b"foo{}{bar}") % 16384
        );
        assert_eq!(
            RedisCluster::key_slot(b"foo{{bar}}zap"),
            RedisCluster::key_slot(b"{bar")
        );
    }
}
