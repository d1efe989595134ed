//! A `ledger` domain whose handler halts its partition on poison events,
//! over a real `redis-server`: what the command line's tests
//! (`convoy-cli/tests/cli.rs`) and the operator page's
//! (`convoy-web/tests/common/mod.rs`) act on. Included by `#[path]` from
//! both crates.
#![allow(dead_code, missing_docs, unreachable_pub)]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use convoy_runtime::redis::keys;
use convoy_runtime::testing::RedisServer;
use convoy_runtime::{Aggregate, Config, Domain, Event, HandlerError, event_handler};
use redis::AsyncCommands;
use serde::{Deserialize, Serialize};

pub const WAIT: Duration = Duration::from_secs(60);

/// `ledger`'s shard count (not the default: the command line, configured
/// with none, must use the one the engine recorded).
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
    /// Free text (a hostile payload, say); left out of the payload when
    /// empty.
    #[serde(default, skip_serializing_if = "String::is_empty")]
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
    /// How long each event takes after it is recorded.
    pub work: Duration,
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
        if !self.work.is_zero() {
            tokio::time::sleep(self.work).await;
        }
        Ok(())
    }
}

/// Fast timings, as in the runtime's own tests.
pub fn config(url: &str) -> Config {
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

/// A `redis-server` and the domain (instance `e0`) whose handler takes
/// `work` per event; poison on, the dependency up.
pub fn setup(work: Duration) -> Setup {
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
            work,
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

    /// The unit of work's hash of `key`'s partition.
    pub fn unit(&self, key: &str) -> String {
        keys::unit(keys::shard_of(key, SHARDS), &self.group, "ledger", key)
    }

    pub async fn unit_state(&self, key: &str) -> BTreeMap<String, String> {
        self.redis()
            .await
            .hgetall(self.unit(key))
            .await
            .expect("hgetall")
    }

    /// The entry `key`'s partition halted on, if it is halted.
    pub async fn halted_on(&self, key: &str) -> Option<String> {
        let s = self.unit_state(key).await;
        (s.get("halted").map(String::as_str) == Some("1"))
            .then(|| s.get("halt_entry").cloned().unwrap_or_default())
    }
}

/// The ids the handler records for `seqs` of `key`.
pub fn ids(key: &str, seqs: &[u64]) -> Vec<String> {
    seqs.iter().map(|s| format!("{key}#{s}")).collect()
}
