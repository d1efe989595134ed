//! What the operator page's tests share: a `ledger` domain whose handler
//! fails on poison events (so partitions halt), a real `redis-server`,
//! and requests to the page's router.
#![allow(dead_code, missing_docs, unreachable_pub)]

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use convoy_runtime::redis::admin::Admin;
use convoy_runtime::redis::keys;
use convoy_runtime::testing::RedisServer;
use convoy_runtime::{Aggregate, Config, Domain, Event, HandlerError, event_handler};
use convoy_web::{OperatorPage, Settings};
use http_body_util::BodyExt;
use redis::AsyncCommands;
use serde::{Deserialize, Serialize};
use tower::ServiceExt;

pub const WAIT: Duration = Duration::from_secs(60);

/// `ledger`'s shard count (not the default).
pub const SHARDS: u32 = 7;

#[derive(Aggregate)]
#[aggregate(category = "ledger")]
pub struct Ledger;

/// One posting; `seq` counts per client from 0.
#[derive(Event, Serialize, Deserialize, Debug, Clone)]
#[event(part_of = Ledger)]
pub struct Posted {
    pub client_id: String,
    pub seq: u64,
    /// The handler fails on it while poison is switched on.
    pub poison: bool,
    pub note: String,
}

pub fn posted(client: &str, seq: u64, poison: bool) -> Posted {
    Posted {
        client_id: client.to_owned(),
        seq,
        poison,
        note: String::new(),
    }
}

/// What the handler ran, per key, in order (`c1#3`).
pub type Seen = Arc<Mutex<BTreeMap<String, Vec<String>>>>;

pub struct Recorder {
    pub seen: Seen,
    pub poison: Arc<AtomicBool>,
    /// The handler's dependency is down: every event fails transiently.
    pub down: Arc<AtomicBool>,
}

#[event_handler(part_of = Ledger, sequential_by = "client_id")]
impl Recorder {
    #[handle]
    async fn posted(&self, e: Posted) -> Result<(), HandlerError> {
        let id = format!("{}#{}", e.client_id, e.seq);
        if self.down.load(Ordering::SeqCst) {
            return Err(HandlerError::transient(std::io::Error::other(format!(
                "dependency down while handling {id}"
            ))));
        }
        if e.poison && self.poison.load(Ordering::SeqCst) {
            return Err(HandlerError::msg(format!("poison event {id}")));
        }
        self.seen
            .lock()
            .expect("lock")
            .entry(e.client_id.clone())
            .or_default()
            .push(id);
        Ok(())
    }
}

fn config(url: &str) -> Config {
    let mut c = Config::default();
    c.broker.url = url.to_owned();
    c.broker.shards = SHARDS;
    c.server.partitioning.lease_ttl_ms = 2000;
    c.server.partitioning.heartbeat_interval_seconds = Some(0.3);
    c.server.retry.max_retries = 2;
    c.server.retry.initial_backoff_ms = 20;
    c.server.retry.max_backoff_ms = 100;
    c
}

pub struct Setup {
    pub server: RedisServer,
    pub url: String,
    pub domain: Domain,
    pub seen: Seen,
    pub poison: Arc<AtomicBool>,
    pub down: Arc<AtomicBool>,
    pub group: String,
}

pub fn setup() -> Setup {
    let server = RedisServer::start().expect("start redis-server (apt-get install redis-server)");
    let url = server.url();
    let seen = Seen::default();
    let poison = Arc::new(AtomicBool::new(true));
    let down = Arc::new(AtomicBool::new(false));
    let domain = Domain::builder()
        .config(config(&url))
        .instance_id("e0")
        .handler(Recorder {
            seen: seen.clone(),
            poison: poison.clone(),
            down: down.clone(),
        })
        .init()
        .expect("domain init");
    let group = domain
        .registry()
        .handlers()
        .iter()
        .find(|h| h.name.ends_with("::Recorder"))
        .map(|h| h.name.to_owned())
        .expect("Recorder is registered");
    Setup {
        server,
        url,
        domain,
        seen,
        poison,
        down,
        group,
    }
}

impl Setup {
    pub fn seen(&self, key: &str) -> Vec<String> {
        self.seen
            .lock()
            .expect("lock")
            .get(key)
            .cloned()
            .unwrap_or_default()
    }

    pub async fn publish(&self, events: &[Posted]) {
        let mut uow = self.domain.unit_of_work();
        for e in events {
            uow.raise(e.clone()).expect("raise");
        }
        uow.commit().await.expect("commit");
    }

    pub async fn redis(&self) -> redis::aio::MultiplexedConnection {
        self.server.connection().await.expect("connection")
    }

    pub async fn halted_on(&self, key: &str) -> Option<String> {
        let unit = keys::unit(keys::shard_of(key, SHARDS), &self.group, "ledger", key);
        let s: BTreeMap<String, String> = self.redis().await.hgetall(unit).await.expect("hgetall");
        (s.get("halted").map(String::as_str) == Some("1"))
            .then(|| s.get("halt_entry").cloned().unwrap_or_default())
    }

    /// The audit records of `key`'s shard, oldest first, as field maps.
    pub async fn audit(&self, key: &str) -> Vec<BTreeMap<String, String>> {
        let reply: redis::streams::StreamRangeReply = self
            .redis()
            .await
            .xrange_all(keys::audit(keys::shard_of(key, SHARDS)))
            .await
            .expect("audit");
        reply
            .ids
            .iter()
            .map(|e| {
                e.map
                    .keys()
                    .map(|k| (k.clone(), e.get::<String>(k).unwrap_or_default()))
                    .collect()
            })
            .collect()
    }

    /// The operator page over this Redis, its snapshot and a lag sample
    /// taken.
    pub async fn page(&self, settings: Settings) -> OperatorPage {
        let admin = Admin::connect(&self.url).await.expect("admin");
        let page = OperatorPage::new(admin, settings);
        page.refresh_snapshot().await;
        page.sample_now().await;
        page
    }
}

/// Settings of a test page: operator `tester`.
pub fn settings() -> Settings {
    Settings {
        operator: "tester".to_owned(),
        ..Settings::default()
    }
}

/// A reply of the router.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: axum::http::HeaderMap,
    pub body: String,
}

impl Reply {
    pub fn ok(self) -> Self {
        assert_eq!(self.status, StatusCode::OK, "{}", self.body);
        self
    }

    /// The value of the hidden field `name` of the page's form.
    pub fn field(&self, name: &str) -> String {
        let at = format!("name=\"{name}\" value=\"");
        let start = self
            .body
            .find(&at)
            .unwrap_or_else(|| panic!("no field {name} in {}", self.body))
            + at.len();
        let end = self.body[start..].find('"').expect("end of value") + start;
        // As a browser decodes it.
        self.body[start..end]
            .replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&quot;", "\"")
            .replace("&#39;", "'")
            .replace("&amp;", "&")
    }

    /// The CSRF cookie the page set (`convoy_csrf=...`).
    pub fn cookie(&self) -> String {
        self.headers
            .get(header::SET_COOKIE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .expect("a cookie")
            .to_owned()
    }
}

/// Percent-encodes a form or query value.
pub fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// `req` as a client on this machine sends it (the page without
/// authentication answers only loopback peers).
pub fn from_loopback(mut req: Request<Body>) -> Request<Body> {
    req.extensions_mut()
        .insert(axum::extract::ConnectInfo(std::net::SocketAddr::from((
            [127, 0, 0, 1],
            50_000,
        ))));
    req
}

async fn send(router: &Router, req: Request<Body>) -> Reply {
    let r = router
        .clone()
        .oneshot(from_loopback(req))
        .await
        .expect("infallible");
    let status = r.status();
    let headers = r.headers().clone();
    let bytes = r.into_body().collect().await.expect("body").to_bytes();
    Reply {
        status,
        headers,
        body: String::from_utf8_lossy(&bytes).into_owned(),
    }
}

/// `GET path` from a loopback client.
pub async fn get(router: &Router, path: &str) -> Reply {
    let req = Request::get(path)
        .header(header::HOST, "127.0.0.1:8080")
        .body(Body::empty())
        .expect("request");
    send(router, req).await
}

/// `POST path` of `form`, with `cookie` when given.
pub async fn post(
    router: &Router,
    path: &str,
    form: &[(&str, &str)],
    cookie: Option<&str>,
) -> Reply {
    let body = form
        .iter()
        .map(|(k, v)| format!("{}={}", enc(k), enc(v)))
        .collect::<Vec<_>>()
        .join("&");
    let mut req = Request::post(path)
        .header(header::HOST, "127.0.0.1:8080")
        .header(header::ORIGIN, "http://127.0.0.1:8080")
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
    if let Some(c) = cookie {
        req = req.header(header::COOKIE, c);
    }
    send(router, req.body(Body::from(body)).expect("request")).await
}

/// Polls `f` until it is true; panics naming `what` after `timeout`.
pub async fn wait_until<F, Fut>(timeout: Duration, what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    while !f().await {
        assert!(
            start.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub fn ids(key: &str, seqs: &[u64]) -> Vec<String> {
    seqs.iter().map(|s| format!("{key}#{s}")).collect()
}
