//! Connections to Redis, one server or a cluster: one shared connection for
//! commands and scripts (reconnecting on one server, following the topology
//! on a cluster), and dedicated connections for blocking reads.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use redis::aio::{
    ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection,
};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::Slot;
use redis::{ErrorKind, RedisError, ServerErrorKind, Value};
use tokio::sync::OnceCell;

use crate::tracing;
use convoy_core::config::{cluster_nodes, redact_url};
use convoy_core::error::Error;

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
}

/// A cluster client for the seed `nodes`, with the server CA `ca_pem`.
fn cluster_client(
    nodes: &[String],
    ca_pem: Option<Vec<u8>>,
    response_timeout: Duration,
) -> redis::RedisResult<ClusterClient> {
    let builder = ClusterClientBuilder::new(nodes.to_vec())
        .connection_timeout(response_timeout.min(Duration::from_secs(5)))
        .response_timeout(response_timeout)
        .retries(6)
        .max_retry_wait(1_000)
        .min_retry_wait(50);
    with_cluster_ca(builder, ca_pem).build()
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
    /// A connection to a cluster, rebuilt when it wedges.
    Cluster(Recovering),
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

/// Failures in a row (timeouts, dropped or refused connections) after
/// which a cluster connection is rebuilt, if a new one answers.
const REBUILD_AFTER: u32 = 3;

/// The least time between two attempts to rebuild a cluster connection.
const REBUILD_EVERY: Duration = Duration::from_secs(1);

/// A cluster connection that is rebuilt when it keeps failing while the
/// cluster answers a new one. redis-rs's cluster connection can wedge for
/// good after every connection of the process was killed at once (it logs
/// `async cluster client recovery: beginning reconnect to initial nodes`
/// and every command times out from then on, while the cluster is
/// healthy): after [`REBUILD_AFTER`] failures in a row, a new connection is
/// made from the seed nodes and, if it answers `PING`, replaces the old one
/// for every clone of this handle. Clones share the connection.
#[derive(Clone)]
pub(crate) struct Recovering {
    inner: Arc<RecoveringInner>,
}

struct RecoveringInner {
    client: ClusterClient,
    /// The URL with its password hidden (for logs).
    url: String,
    current: RwLock<ClusterConnection>,
    /// Failures in a row.
    failures: AtomicU32,
    /// When the last rebuild was tried (one attempt at a time).
    rebuilt: tokio::sync::Mutex<Option<Instant>>,
    /// How long a new connection may take to answer.
    timeout: Duration,
}

impl Recovering {
    async fn connect(
        client: ClusterClient,
        url: String,
        timeout: Duration,
    ) -> redis::RedisResult<Self> {
        let conn = client.get_async_connection().await?;
        Ok(Recovering {
            inner: Arc::new(RecoveringInner {
                client,
                url,
                current: RwLock::new(conn),
                failures: AtomicU32::new(0),
                rebuilt: tokio::sync::Mutex::new(None),
                timeout,
            }),
        })
    }

    fn current(&self) -> ClusterConnection {
        match self.inner.current.read() {
            Ok(c) => c.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Counts a call's outcome: a success ends a run of failures; a
    /// failure of the connection itself extends it and, past
    /// [`REBUILD_AFTER`], rebuilds the connection.
    async fn observe(&self, failed: Option<&RedisError>) {
        let Some(e) = failed else {
            self.inner.failures.store(0, Ordering::Relaxed);
            return;
        };
        let wedging = e.is_timeout()
            || e.is_io_error()
            || e.is_connection_dropped()
            || e.is_connection_refusal()
            || e.kind() == ErrorKind::ClusterConnectionNotFound;
        if !wedging {
            return;
        }
        let n = self.inner.failures.fetch_add(1, Ordering::Relaxed) + 1;
        if n >= REBUILD_AFTER {
            self.rebuild(n).await;
        }
    }

    /// Makes a new connection from the seed nodes and, if it answers,
    /// puts it in place of the current one. One attempt at a time, at
    /// most one per [`REBUILD_EVERY`].
    async fn rebuild(&self, failures: u32) {
        let Ok(mut last) = self.inner.rebuilt.try_lock() else {
            return;
        };
        if last.is_some_and(|at| at.elapsed() < REBUILD_EVERY) {
            return;
        }
        *last = Some(Instant::now());
        let inner = &self.inner;
        let fresh = tokio::time::timeout(inner.timeout, async {
            let mut c = inner.client.get_async_connection().await?;
            redis::cmd("PING").query_async::<String>(&mut c).await?;
            Ok::<_, RedisError>(c)
        })
        .await;
        match fresh {
            Ok(Ok(c)) => {
                match inner.current.write() {
                    Ok(mut g) => *g = c,
                    Err(poisoned) => *poisoned.into_inner() = c,
                }
                inner.failures.store(0, Ordering::Relaxed);
                convoy_core::metrics::reconnected();
                tracing::warn!(url = %inner.url, failures, "rebuilt the Redis Cluster connection: it failed {failures} times in a row while a new one answers");
            }
            Ok(Err(e)) => {
                tracing::debug!(url = %inner.url, error = %e, "the Redis Cluster does not answer a new connection either; keeping the current one");
            }
            Err(_) => {
                tracing::debug!(url = %inner.url, "the Redis Cluster does not answer a new connection in time; keeping the current one");
            }
        }
    }
}

impl ConnectionLike for Recovering {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> redis::RedisFuture<'a, Value> {
        Box::pin(async move {
            let mut c = self.current();
            let r = c.req_packed_command(cmd).await;
            self.observe(r.as_ref().err()).await;
            r
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let mut c = self.current();
            let r = c.req_packed_commands(pipeline, offset, count).await;
            self.observe(r.as_ref().err()).await;
            r
        })
    }

    fn get_db(&self) -> i64 {
        0
    }
}

impl Conn {
    /// Whether this is a cluster connection.
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self, Conn::Cluster(_))
    }
}

/// How long a command that Redis refused before running it (a cluster's
/// `MOVED`, `ASK`, `TRYAGAIN`, `CLUSTERDOWN`, a replica's `READONLY`, a
/// server still `LOADING`) is sent again, within one operation, beyond the
/// retries redis-rs makes itself: a slot migration or a failover costs a
/// retry, not an error.
pub(crate) const REFUSED_RETRY: Duration = Duration::from_secs(5);

/// Whether Redis refuses commands with an error of this kind without
/// running them, so they can be sent again whatever they do.
fn refused_before_running(kind: Option<ServerErrorKind>) -> bool {
    matches!(
        kind,
        Some(
            ServerErrorKind::Moved
                | ServerErrorKind::Ask
                | ServerErrorKind::TryAgain
                | ServerErrorKind::ClusterDown
                | ServerErrorKind::MasterDown
                | ServerErrorKind::ReadOnly
                | ServerErrorKind::BusyLoading
        )
    )
}

/// Whether `e` refused a command Redis did not run (see
/// [`REFUSED_RETRY`]).
pub(crate) fn refused(e: &RedisError) -> bool {
    match e.kind() {
        ErrorKind::Server(kind) => refused_before_running(Some(kind)),
        _ => false,
    }
}

/// Whether an error reply in a pipeline's results ([`Value::ServerError`])
/// refused its command without running it (see [`REFUSED_RETRY`]).
pub(crate) fn refused_reply(e: &redis::ServerError) -> bool {
    refused_before_running(e.kind())
}

/// Paces the sending again of a command Redis refused without running it
/// (see [`REFUSED_RETRY`]): a short back-off, for that long in all.
pub(crate) struct Refusals {
    start: Instant,
    wait: Duration,
}

impl Refusals {
    /// From now on.
    pub(crate) fn new() -> Self {
        Refusals {
            start: Instant::now(),
            wait: Duration::from_millis(20),
        }
    }

    /// Waits before the refused command is sent again; `false` (without
    /// waiting) once [`REFUSED_RETRY`] is spent.
    pub(crate) async fn again(&mut self, refusal: &(dyn std::fmt::Display + Sync)) -> bool {
        if self.start.elapsed() + self.wait >= REFUSED_RETRY {
            return false;
        }
        tracing::debug!(error = %refusal, "Redis refused a command before running it; sending it again");
        tokio::time::sleep(self.wait).await;
        self.wait = (self.wait * 2).min(Duration::from_millis(250));
        true
    }
}

/// Runs `cmds` (each with the key it routes by) and returns their replies in
/// order: one pipeline on a single server; on a cluster, one pipeline per
/// hash slot, sent at once (a cluster refuses a pipeline spanning slots).
/// Not atomic either way; an error reply fails the whole call. The
/// commands must be safe to run twice: a slot's pipeline that a migration
/// or failover redirects is sent again command by command.
pub(crate) async fn query_by_slot(
    conn: &mut Conn,
    cmds: Vec<(String, redis::Cmd)>,
) -> redis::RedisResult<Vec<Value>> {
    by_slot(conn, cmds, false).await.into_iter().collect()
}

/// [`query_by_slot`], with each command's own outcome: a slot whose
/// pipeline failed, or did not answer `within`, fails its commands only,
/// so a caller can go on with the shards that answered at once (a
/// heartbeat during one master's failover must not wait for it).
pub(crate) async fn query_each_slot(
    conn: &mut Conn,
    cmds: Vec<(String, redis::Cmd)>,
    within: Duration,
) -> Vec<redis::RedisResult<Value>> {
    by_slot_within(conn, cmds, false, Some(within)).await
}

/// [`query_by_slot`], but with each command's error reply in its place
/// ([`Value::ServerError`]) rather than failing them all: for reads of keys
/// that may be missing or hold another type (`XINFO GROUPS` of a stream not
/// created yet).
pub(crate) async fn read_by_slot(
    conn: &mut Conn,
    cmds: Vec<(String, redis::Cmd)>,
) -> redis::RedisResult<Vec<Value>> {
    by_slot(conn, cmds, true).await.into_iter().collect()
}

async fn by_slot(
    conn: &mut Conn,
    cmds: Vec<(String, redis::Cmd)>,
    keep_errors: bool,
) -> Vec<redis::RedisResult<Value>> {
    by_slot_within(conn, cmds, keep_errors, None).await
}

async fn by_slot_within(
    conn: &mut Conn,
    cmds: Vec<(String, redis::Cmd)>,
    keep_errors: bool,
    within: Option<Duration>,
) -> Vec<redis::RedisResult<Value>> {
    let n = cmds.len();
    let cluster = conn.is_cluster();
    let mut slots: HashMap<Option<Slot>, (Vec<redis::Cmd>, Vec<usize>)> = HashMap::new();
    for (i, (key, c)) in cmds.into_iter().enumerate() {
        let slot = cluster.then(|| Slot::for_key(key.as_bytes()));
        let (slot_cmds, at) = slots.entry(slot).or_default();
        slot_cmds.push(c);
        at.push(i);
    }
    let runs = slots.into_values().map(|(slot_cmds, at)| {
        let mut c = conn.clone();
        async move {
            let sent = one_slot(&mut c, slot_cmds, keep_errors, cluster);
            let replies = match within {
                None => sent.await,
                Some(limit) => match tokio::time::timeout(limit, sent).await {
                    Ok(r) => r,
                    Err(_) => Err(RedisError::from(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("no reply within {limit:?}"),
                    ))),
                },
            };
            (at, replies)
        }
    });
    let mut out: Vec<redis::RedisResult<Value>> = vec![Ok(Value::Nil); n];
    for (at, replies) in futures::future::join_all(runs).await {
        match replies {
            Ok(replies) => {
                for (i, v) in at.into_iter().zip(replies) {
                    out[i] = Ok(v);
                }
            }
            Err(e) => {
                for i in at {
                    out[i] = Err(e.clone());
                }
            }
        }
    }
    out
}

/// One slot's commands: one pipeline, sent again while Redis refuses it
/// without running it. On a cluster, a pipeline still refused by a
/// redirection (a slot migrating key by key answers `ASK` for the keys
/// already moved and runs the others, which one pipeline cannot follow) is
/// sent again command by command, each following its own redirection.
async fn one_slot(
    conn: &mut Conn,
    cmds: Vec<redis::Cmd>,
    keep_errors: bool,
    cluster: bool,
) -> redis::RedisResult<Vec<Value>> {
    let mut pipe = redis::pipe();
    if keep_errors {
        pipe.ignore_errors();
    }
    for c in &cmds {
        pipe.add_command(c.clone());
    }
    let mut refusals = Refusals::new();
    let e = loop {
        match pipe.query_async::<Vec<Value>>(conn).await {
            Ok(replies) => return Ok(replies),
            Err(e) if refused(&e) && !cluster => {
                if !refusals.again(&e).await {
                    return Err(e);
                }
            }
            Err(e) if refused(&e) => break e,
            Err(e) => return Err(e),
        }
    };
    tracing::debug!(error = %e, "a pipeline was redirected; sending its commands one by one");
    let runs = cmds.iter().map(|cmd| {
        let mut c = conn.clone();
        async move { one_command(&mut c, cmd, keep_errors).await }
    });
    futures::future::join_all(runs).await.into_iter().collect()
}

/// One command, sent again while Redis refuses it without running it; with
/// `keep_errors`, any other error reply is returned as the value.
async fn one_command(
    conn: &mut Conn,
    cmd: &redis::Cmd,
    keep_errors: bool,
) -> redis::RedisResult<Value> {
    let mut refusals = Refusals::new();
    loop {
        // redis-rs reports a refusal it gave up following as an error, an
        // error reply of a command it did not follow as a value.
        let v = match conn.req_packed_command(cmd).await {
            Ok(v) => v,
            Err(e) if refused(&e) => {
                if !refusals.again(&e).await {
                    return Err(e);
                }
                continue;
            }
            Err(e) => return Err(e),
        };
        let refusal = match &v {
            Value::ServerError(e) if refused_before_running(e.kind()) => e.to_string(),
            Value::ServerError(_) if !keep_errors => return v.extract_error(),
            _ => return Ok(v),
        };
        if !refusals.again(&refusal).await {
            return if keep_errors {
                Ok(v)
            } else {
                v.extract_error()
            };
        }
    }
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

    /// The same server and settings on a connection of its own, not
    /// connected yet: it connects on first use, from the runtime it is
    /// first used on, where its reader task then runs.
    pub(crate) fn separate(&self) -> Self {
        self.with_response_timeout(self.response_timeout)
    }

    /// Whether this names a cluster.
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self.client, Client::Cluster { .. })
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
                    Client::Cluster { nodes, ca_pem } => {
                        let mut conn = self
                            .cluster(nodes, ca_pem.clone(), self.response_timeout)
                            .await?;
                        self.check_server_version(&mut conn).await?;
                        Ok(conn)
                    }
                }
            })
            .await
            .cloned()
    }

    async fn cluster(
        &self,
        nodes: &[String],
        ca_pem: Option<Vec<u8>>,
        response_timeout: Duration,
    ) -> Result<Conn, Error> {
        let client =
            cluster_client(nodes, ca_pem, response_timeout).map_err(|e| self.connect_error(e))?;
        let timeout = self.response_timeout.max(Duration::from_secs(1));
        Recovering::connect(client, self.url(), timeout)
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
            Client::Cluster { nodes, ca_pem } => {
                self.cluster(nodes, ca_pem.clone(), BLOCK + self.response_timeout)
                    .await
            }
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
