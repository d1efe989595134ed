//! Connections to Redis, one server or a cluster: one shared connection for
//! commands and scripts (reconnecting on one server, following the topology
//! on a cluster), and dedicated connections for blocking reads.

use std::time::Duration;

use std::collections::HashMap;

use redis::Value;
use redis::aio::{
    ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection,
};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::Slot;
use tokio::sync::OnceCell;

use crate::config::{cluster_nodes, redact_url};
use crate::error::Error;

/// How long a blocking read waits before it checks for shutdown.
pub(crate) const BLOCK: Duration = Duration::from_millis(1000);

/// A client for a `redis://` or `rediss://` URL; with `ca_pem`, the server's
/// certificate is checked against that CA (PEM) rather than the system's.
/// A URL that cannot work is a configuration error, its message starting
/// with `what` (how the caller names the URL). TLS needs the `tls` feature.
pub(crate) fn open_client(
    url: &str,
    ca_pem: Option<Vec<u8>>,
    what: &str,
) -> Result<redis::Client, Error> {
    let shown = redact_url(url);
    let (client, problem) = match ca_pem {
        None => {
            no_tls_without_the_feature(url, what, &shown)?;
            (redis::Client::open(url), "is not a usable Redis URL")
        }
        Some(root_cert) => (
            with_ca(url, root_cert, what, &shown)?,
            "with a CA certificate is not usable",
        ),
    };
    client.map_err(|e| Error::Config {
        file: "<code>".into(),
        message: format!("{what}{shown:?} {problem}: {e}"),
    })
}

/// What to do about TLS without the `tls` feature.
#[cfg(not(feature = "tls"))]
const NO_TLS: &str = "needs TLS, and convoy-runtime was built without its `tls` feature; enable it: convoy-runtime = { version = \"...\", features = [\"tls\"] }";

#[cfg(not(feature = "tls"))]
fn no_tls_without_the_feature(url: &str, what: &str, shown: &str) -> Result<(), Error> {
    if url.starts_with("rediss://") {
        return Err(Error::Config {
            file: "<code>".into(),
            message: format!("{what}{shown:?} {NO_TLS}"),
        });
    }
    Ok(())
}

#[cfg(feature = "tls")]
fn no_tls_without_the_feature(_: &str, _: &str, _: &str) -> Result<(), Error> {
    Ok(())
}

#[cfg(feature = "tls")]
fn with_ca(
    url: &str,
    root_cert: Vec<u8>,
    _: &str,
    _: &str,
) -> Result<redis::RedisResult<redis::Client>, Error> {
    Ok(redis::Client::build_with_tls(
        url,
        redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(root_cert),
        },
    ))
}

#[cfg(not(feature = "tls"))]
fn with_ca(
    _: &str,
    _: Vec<u8>,
    what: &str,
    shown: &str,
) -> Result<redis::RedisResult<redis::Client>, Error> {
    Err(Error::Config {
        file: "<code>".into(),
        message: format!("{what}{shown:?} with a CA certificate (tls_ca_file) {NO_TLS}"),
    })
}

/// How a broker reaches Redis: one server, or the nodes of a cluster.
#[derive(Clone)]
pub(crate) enum Client {
    /// One server (`redis://`, `rediss://`, `unix://`).
    Single(redis::Client),
    /// A Redis Cluster (`redis+cluster://h1:p1,h2:p2/`): the client
    /// follows MOVED and ASK redirections and node failovers itself.
    Cluster {
        /// The seed nodes' URLs (each with the URL's credentials and TLS).
        nodes: Vec<String>,
        /// The server CA for `rediss+cluster://` with a CA of one's own.
        ca_pem: Option<Vec<u8>>,
    },
}

impl Client {
    /// A client for `url`: `redis+cluster://` and `rediss+cluster://` name
    /// a cluster by one or more of its nodes, any other URL one server.
    pub(crate) fn open(url: &str, ca_pem: Option<Vec<u8>>, what: &str) -> Result<Client, Error> {
        match cluster_nodes(url) {
            None => open_client(url, ca_pem, what).map(Client::Single),
            Some(nodes) => {
                let shown = redact_url(url);
                let nodes = nodes.map_err(|problem| Error::Config {
                    file: "<code>".into(),
                    message: format!("{what}{shown:?} {problem}"),
                })?;
                // Each node's URL must be usable on its own (TLS feature,
                // credentials): checked here, not at the first connect.
                for n in &nodes {
                    open_client(n, ca_pem.clone(), what)?;
                }
                Ok(Client::Cluster { nodes, ca_pem })
            }
        }
    }

    fn cluster(&self, response_timeout: Duration) -> Option<redis::RedisResult<ClusterClient>> {
        let Client::Cluster { nodes, ca_pem } = self else {
            return None;
        };
        let builder = ClusterClientBuilder::new(nodes.clone())
            .connection_timeout(response_timeout.min(Duration::from_secs(5)))
            .response_timeout(response_timeout)
            .retries(6)
            .max_retry_wait(1_000)
            .min_retry_wait(50);
        Some(with_cluster_ca(builder, ca_pem.clone()).build())
    }
}

#[cfg(feature = "tls")]
fn with_cluster_ca(b: ClusterClientBuilder, ca_pem: Option<Vec<u8>>) -> ClusterClientBuilder {
    match ca_pem {
        Some(root_cert) => b.certs(redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(root_cert),
        }),
        None => b,
    }
}

#[cfg(not(feature = "tls"))]
fn with_cluster_ca(b: ClusterClientBuilder, _: Option<Vec<u8>>) -> ClusterClientBuilder {
    // `Client::open` refused a CA without the feature.
    b
}

/// A connection: to one server (shared and reconnecting, or dedicated), or
/// to a cluster. Commands and scripts work the same on each; a pipeline on a
/// cluster must stay in one hash slot (see [`query_by_slot`]).
#[derive(Clone)]
pub(crate) enum Conn {
    /// The shared, reconnecting connection to one server.
    Shared(ConnectionManager),
    /// A dedicated connection to one server (blocking reads).
    Node(MultiplexedConnection),
    /// A connection to a cluster.
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> redis::RedisFuture<'a, Value> {
        match self {
            Conn::Shared(c) => c.req_packed_command(cmd),
            Conn::Node(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Shared(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Node(c) => c.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Shared(c) => c.get_db(),
            Conn::Node(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

impl Conn {
    /// Whether this is a cluster connection.
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self, Conn::Cluster(_))
    }
}

/// Runs `cmds` (each with the key it routes by) and returns their replies in
/// order: one pipeline on a single server; on a cluster, one pipeline per
/// hash slot, sent at once (a cluster refuses a pipeline spanning slots).
/// Not atomic either way; an error reply fails the whole call.
pub(crate) async fn query_by_slot(
    conn: &mut Conn,
    cmds: Vec<(String, redis::Cmd)>,
) -> redis::RedisResult<Vec<Value>> {
    by_slot(conn, cmds, false).await
}

/// [`query_by_slot`], but with each command's error reply in its place
/// ([`Value::ServerError`]) rather than failing them all: for reads of keys
/// that may be missing or hold another type (`XINFO GROUPS` of a stream not
/// created yet).
pub(crate) async fn read_by_slot(
    conn: &mut Conn,
    cmds: Vec<(String, redis::Cmd)>,
) -> redis::RedisResult<Vec<Value>> {
    by_slot(conn, cmds, true).await
}

async fn by_slot(
    conn: &mut Conn,
    cmds: Vec<(String, redis::Cmd)>,
    keep_errors: bool,
) -> redis::RedisResult<Vec<Value>> {
    let n = cmds.len();
    let cluster = conn.is_cluster();
    let mut slots: HashMap<Option<Slot>, (redis::Pipeline, Vec<usize>)> = HashMap::new();
    for (i, (key, c)) in cmds.into_iter().enumerate() {
        let slot = cluster.then(|| Slot::for_key(key.as_bytes()));
        let (pipe, at) = slots.entry(slot).or_insert_with(|| {
            let mut p = redis::pipe();
            if keep_errors {
                p.ignore_errors();
            }
            (p, Vec::new())
        });
        pipe.add_command(c);
        at.push(i);
    }
    let runs = slots.into_values().map(|(pipe, at)| {
        let mut c = conn.clone();
        async move {
            let replies: Vec<Value> = pipe.query_async(&mut c).await?;
            Ok::<_, redis::RedisError>((at, replies))
        }
    });
    let mut out = vec![Value::Nil; n];
    for r in futures::future::join_all(runs).await {
        let (at, replies) = r?;
        for (i, v) in at.into_iter().zip(replies) {
            out[i] = v;
        }
    }
    Ok(out)
}

/// A Redis server's or cluster's client, and its connections (made on first
/// use).
pub(crate) struct Connection {
    pub(crate) client: Client,
    url: String,
    response_timeout: Duration,
    shared: OnceCell<Conn>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("url", &self.url())
            .finish_non_exhaustive()
    }
}

impl Connection {
    /// For a client; nothing is connected yet.
    pub(crate) fn new(client: Client, url: &str) -> Self {
        Connection {
            client,
            url: url.to_owned(),
            response_timeout: Duration::from_secs(5),
            shared: OnceCell::new(),
        }
    }

    /// The same server, not connected yet, with another response timeout
    /// (how long one command may take before it fails).
    pub(crate) fn with_response_timeout(&self, timeout: Duration) -> Self {
        Connection {
            client: self.client.clone(),
            url: self.url.clone(),
            response_timeout: timeout,
            shared: OnceCell::new(),
        }
    }

    /// The URL with its password hidden.
    pub(crate) fn url(&self) -> String {
        redact_url(&self.url)
    }

    fn connect_error(&self, e: redis::RedisError) -> Error {
        Error::redis(format!("cannot connect to {}", self.url()), e)
    }

    /// The shared connection: reconnecting on one server, following the
    /// topology on a cluster.
    pub(crate) async fn shared(&self) -> Result<Conn, Error> {
        self.shared
            .get_or_try_init(|| async {
                match &self.client {
                    Client::Single(client) => {
                        let config = ConnectionManagerConfig::new()
                            .set_response_timeout(Some(self.response_timeout))
                            .set_connection_timeout(Some(self.response_timeout))
                            .set_number_of_retries(4)
                            .set_max_delay(Duration::from_secs(2));
                        let mut c = ConnectionManager::new_with_config(client.clone(), config)
                            .await
                            .map_err(|e| self.connect_error(e))?;
                        self.refuse_a_cluster_node(&mut c).await?;
                        let mut conn = Conn::Shared(c);
                        self.check_server_version(&mut conn).await?;
                        Ok(conn)
                    }
                    Client::Cluster { .. } => {
                        let mut conn = self.cluster(self.response_timeout).await?;
                        self.check_server_version(&mut conn).await?;
                        Ok(conn)
                    }
                }
            })
            .await
            .cloned()
    }

    async fn cluster(&self, response_timeout: Duration) -> Result<Conn, Error> {
        let Some(client) = self.client.cluster(response_timeout) else {
            return Err(Error::Config {
                file: "<code>".into(),
                message: format!("{} is not a cluster URL", self.url()),
            });
        };
        let client = client.map_err(|e| self.connect_error(e))?;
        client
            .get_async_connection()
            .await
            .map(Conn::Cluster)
            .map_err(|e| self.connect_error(e))
    }

    /// A single-node URL that names a node of a Redis Cluster would fail
    /// with CROSSSLOT and MOVED errors forever: refused at connect, with
    /// the URL form to use.
    async fn refuse_a_cluster_node(&self, c: &mut ConnectionManager) -> Result<(), Error> {
        let info: String = match redis::cmd("INFO").arg("cluster").query_async(c).await {
            Ok(i) => i,
            // An ACL user may not run INFO; the first cluster error says
            // enough then.
            Err(_) => return Ok(()),
        };
        if info.lines().any(|l| l.trim() == "cluster_enabled:1") {
            return Err(Error::Config {
                file: "<code>".into(),
                message: format!(
                    "{} is a node of a Redis Cluster, and a single-node URL cannot use a cluster; name the cluster with redis+cluster://host1:port1,host2:port2/ (rediss+cluster:// for TLS)",
                    self.url()
                ),
            });
        }
        Ok(())
    }

    /// A server older than convoy needs is refused at connect, naming its
    /// version and the floor, rather than failing at the first script
    /// that uses a newer command.
    async fn check_server_version(&self, c: &mut Conn) -> Result<(), Error> {
        // One node's text, or (on a cluster) every master's, by node.
        let reply: redis::Value = match redis::cmd("INFO").arg("server").query_async(c).await {
            Ok(v) => v,
            // An ACL user may not run INFO; a missing command then says
            // enough at its first use.
            Err(_) => return Ok(()),
        };
        let texts: Vec<String> = match reply {
            redis::Value::Map(nodes) => nodes
                .into_iter()
                .filter_map(|(_, v)| redis::from_redis_value::<String>(v).ok())
                .collect(),
            other => redis::from_redis_value::<String>(other)
                .into_iter()
                .collect(),
        };
        texts.iter().try_for_each(|t| check_version(t)).map_err(|found| Error::Config {
            file: "<server>".into(),
            message: format!(
                "{} runs {found}, older than convoy needs: Redis {}.{} or later (or Valkey 7.2 or later) for Lua scripting, streams with XAUTOCLAIM and SET with both NX and GET; upgrade the server",
                self.url(),
                MIN_REDIS.0,
                MIN_REDIS.1
            ),
        })
    }

    /// A dedicated connection for blocking reads (on a cluster, a cluster
    /// connection of its own, so a blocked read holds up nothing else).
    pub(crate) async fn blocking(&self) -> Result<Conn, Error> {
        match &self.client {
            Client::Single(client) => {
                let cfg = redis::AsyncConnectionConfig::new()
                    .set_response_timeout(Some(BLOCK + self.response_timeout))
                    .set_connection_timeout(Some(self.response_timeout));
                client
                    .get_multiplexed_async_connection_with_config(&cfg)
                    .await
                    .map(Conn::Node)
                    .map_err(|e| self.connect_error(e))
            }
            Client::Cluster { .. } => self.cluster(BLOCK + self.response_timeout).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(not(feature = "tls"))]
    #[test]
    fn rediss_without_the_tls_feature_names_it() {
        let e = open_client("rediss://u:pw@h:1/", None, "[broker] url ")
            .expect_err("no TLS")
            .to_string();
        assert!(e.contains("`tls` feature"), "{e}");
        assert!(!e.contains("pw"), "{e}");
        let e = open_client("redis://h:1/", Some(Vec::new()), "[broker] url ")
            .expect_err("no TLS")
            .to_string();
        assert!(e.contains("tls_ca_file"), "{e}");
    }

    #[test]
    fn plain_urls_open() {
        open_client("redis://h:1/", None, "").expect("no TLS needed");
    }
}

/// The oldest Redis convoy runs on (`SET key value NX GET`: 7.0). Valkey
/// reports the Redis version it is compatible with (7.2.4 for every Valkey
/// so far) as `redis_version`.
pub(crate) const MIN_REDIS: (u32, u32) = (7, 0);

/// Checks `INFO server` text against [`MIN_REDIS`]; `Err` names the server
/// and version found. Text without a version passes (an unknown server
/// fails at its first missing command instead).
pub(crate) fn check_version(info: &str) -> Result<(), String> {
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.trim().strip_prefix(name)?.strip_prefix(':'))
            .map(str::trim)
    };
    let Some(version) = field("redis_version") else {
        return Ok(());
    };
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let found = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    if found >= MIN_REDIS {
        return Ok(());
    }
    Err(match field("valkey_version") {
        Some(v) => format!("Valkey {v}"),
        None => format!("Redis {version}"),
    })
}

#[cfg(test)]
mod version_tests {
    use super::check_version;

    #[test]
    fn a_server_older_than_redis_7_is_refused_by_name_and_version() {
        assert!(check_version("# Server\r\nredis_version:7.0.15\r\n").is_ok());
        assert!(check_version("redis_version:7.2.4\r\nvalkey_version:9.1.2\r\n").is_ok());
        assert!(check_version("redis_version:8.2.1\r\n").is_ok());
        assert_eq!(
            check_version("# Server\r\nredis_version:6.2.14\r\nredis_mode:standalone\r\n"),
            Err("Redis 6.2.14".to_owned())
        );
        assert_eq!(
            check_version("redis_version:5.0.7\r\n"),
            Err("Redis 5.0.7".to_owned())
        );
        assert!(check_version("no version here").is_ok());
    }
}
