//! A local Redis Cluster: real `redis-server` (or `valkey-server`, see
//! [`ServerKind`]) processes in cluster mode on free ports, joined by
//! `redis-cli --cluster create`.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::TestingError;
use super::process::free_port;
use super::server::{RedisServer, ServerKind};

/// How long [`RedisCluster::start`] waits for `cluster_state:ok`.
const FORM_TIMEOUT: Duration = Duration::from_secs(30);

/// A Redis Cluster of `masters` masters, each with `replicas` replicas,
/// every node a [`RedisServer`] of its own (so each can be stopped,
/// killed, frozen or restarted). Dropping it stops every node.
///
/// The cluster bus of each node listens on a second free port
/// (`--cluster-port`), so node ports need not be below 55536.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    masters: usize,
}

impl RedisCluster {
    /// Starts `masters` masters with `replicas` replicas each, forms the
    /// cluster (slots spread evenly over the masters) and waits until every
    /// node reports `cluster_state:ok`.
    pub fn start(masters: usize, replicas: usize) -> Result<RedisCluster, TestingError> {
        RedisCluster::start_on(ServerKind::from_env()?, masters, replicas)
    }

    /// [`RedisCluster::start`] with every node running `kind` (rather than
    /// the server `CONVOY_TEST_SERVER` names).
    pub fn start_on(
        kind: ServerKind,
        masters: usize,
        replicas: usize,
    ) -> Result<RedisCluster, TestingError> {
        if masters < 3 {
            return Err(TestingError::Cluster {
                reason: format!("a Redis Cluster needs at least 3 masters, not {masters}"),
            });
        }
        let mut nodes = Vec::with_capacity(masters * (1 + replicas));
        for _ in 0..masters * (1 + replicas) {
            let bus = free_port()?;
            nodes.push(
                RedisServer::builder()
                    .server(kind)
                    .arg("--cluster-enabled")
                    .arg("yes")
                    .arg("--cluster-config-file")
                    .arg("nodes.conf")
                    .arg("--cluster-port")
                    .arg(bus.to_string())
                    .arg("--cluster-node-timeout")
                    .arg("2000")
                    .arg("--appendonly")
                    .arg("yes")
                    .start()?,
            );
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
        let cluster = RedisCluster { nodes, masters };
        cluster.wait_ok(FORM_TIMEOUT)?;
        cluster.wait_replicas_synced(FORM_TIMEOUT)?;
        Ok(cluster)
    }

    /// Waits until every replica's link to its master is up (its first
    /// full sync done), so a `WAIT` or a failover right after start works.
    pub fn wait_replicas_synced(&self, timeout: Duration) -> Result<(), TestingError> {
        let start = Instant::now();
        for i in 0..self.nodes.len() {
            loop {
                let info = self.cli(i, &["INFO", "replication"])?;
                if info.contains("role:master") || info.contains("master_link_status:up") {
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
    pub fn cli(&self, i: usize, args: &[&str]) -> Result<String, TestingError> {
        let out = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.nodes[i].port().to_string()])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|source| TestingError::Spawn {
                program: "redis-cli".into(),
                source,
            })?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
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

    /// Waits until every running node reports `cluster_state:ok`.
    pub fn wait_ok(&self, timeout: Duration) -> Result<(), TestingError> {
        let start = Instant::now();
        loop {
            let mut ok = true;
            for i in 0..self.nodes.len() {
                let info = self.cli(i, &["CLUSTER", "INFO"])?;
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
