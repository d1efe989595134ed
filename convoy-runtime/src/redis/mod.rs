//! The Redis Streams broker.
//!
//! It advertises `STREAM_PARTITIONING`: the outbox processor routes each
//! partitioned event to `{category}:{key}` and records the key in the
//! category's index, and each handler consumes every partition under an
//! ownership lease with a fencing token, so two events with one key are
//! never handled at once, anywhere. See [`keys`] for the key layout.
//!
//! # Consumers
//!
//! For a handler on a partitioned category, one coordinator per engine
//! instance (module `partitioned`):
//!
//! - discovers partitions from the index (never SCAN/KEYS) every heartbeat
//!   and when a wake-up names an unknown key;
//! - takes leases up to its fair share (partitions / live instances) and
//!   releases the surplus, letting each worker finish its event first;
//! - renews all its leases in one script call per heartbeat;
//! - runs one worker task per owned unit: reclaim earlier generations'
//!   pending entries, then fenced batch reads (primary lane before backfill),
//!   the local lease deadline checked before every event, one fenced ack per
//!   event, retries in place, halt on poison, reaping when idle;
//! - sleeps on wake-ups written by the publisher (`{category}:__wake__`)
//!   rather than polling idle partitions.
//!
//! Events of a category that carry no key, and categories no handler
//! partitions, go through an ordinary consumer group on `{category}`
//! (module `plain`) with retries and then `{category}:dlq`.

pub mod admin;
pub mod keys;
mod partitioned;
mod plain;
mod publish;
mod reply;
pub(crate) mod scripts;
mod state;
pub use state::RedisStateStore;
mod wake;

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use tokio::sync::OnceCell;
use tokio_util::sync::CancellationToken;

use crate::broker::{Broker, Capabilities, Publication, PublishError};
use crate::config::redact_url;
use crate::engine::ConsumerPlan;
use crate::error::Error;
use crate::handler::BoxFuture;

/// How long a blocking read waits before it checks for shutdown.
pub(crate) const BLOCK: Duration = Duration::from_millis(1000);

/// The Redis Streams broker. Cheap to share; connects on first use.
pub struct RedisBroker {
    pub(crate) client: redis::Client,
    url: String,
    response_timeout: Duration,
    conn: OnceCell<ConnectionManager>,
}

impl std::fmt::Debug for RedisBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBroker")
            .field("url", &redact_url(&self.url))
            .finish_non_exhaustive()
    }
}

impl RedisBroker {
    /// A broker for a `redis://` or `rediss://` URL (user, password and
    /// database in the URL work). Nothing is connected yet.
    pub fn from_url(url: &str) -> Result<Self, Error> {
        let client = redis::Client::open(url).map_err(|e| Error::Config {
            file: "<code>".into(),
            message: format!(
                "[broker] url {:?} is not a usable Redis URL: {e}",
                redact_url(url)
            ),
        })?;
        Ok(RedisBroker {
            client,
            url: url.to_owned(),
            response_timeout: Duration::from_secs(5),
            conn: OnceCell::new(),
        })
    }

    /// A broker for a `rediss://` URL whose server certificate is signed by
    /// the CA in `ca_pem` (PEM) rather than one in the system trust store.
    pub fn from_url_with_ca(url: &str, ca_pem: Vec<u8>) -> Result<Self, Error> {
        let certs = redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(ca_pem),
        };
        let client = redis::Client::build_with_tls(url, certs).map_err(|e| Error::Config {
            file: "<code>".into(),
            message: format!(
                "[broker] url {:?} with a CA certificate is not usable: {e}",
                redact_url(url)
            ),
        })?;
        Ok(RedisBroker {
            client,
            url: url.to_owned(),
            response_timeout: Duration::from_secs(5),
            conn: OnceCell::new(),
        })
    }

    /// How long one command may take before it fails (default 5 s).
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// The URL with its password hidden.
    pub fn url(&self) -> String {
        redact_url(&self.url)
    }

    /// The shared, reconnecting connection.
    pub(crate) async fn conn(&self) -> Result<ConnectionManager, Error> {
        self.conn
            .get_or_try_init(|| async {
                let config = ConnectionManagerConfig::new()
                    .set_response_timeout(Some(self.response_timeout))
                    .set_connection_timeout(Some(self.response_timeout))
                    .set_number_of_retries(4)
                    .set_max_delay(Duration::from_secs(2));
                ConnectionManager::new_with_config(self.client.clone(), config).await
            })
            .await
            .cloned()
            .map_err(|e| Error::redis(format!("cannot connect to {}", self.url()), e))
    }

    /// A dedicated connection for blocking reads.
    pub(crate) async fn blocking_conn(&self) -> Result<MultiplexedConnection, Error> {
        let cfg = redis::AsyncConnectionConfig::new()
            .set_response_timeout(Some(BLOCK + self.response_timeout))
            .set_connection_timeout(Some(self.response_timeout));
        self.client
            .get_multiplexed_async_connection_with_config(&cfg)
            .await
            .map_err(|e| Error::redis(format!("cannot connect to {}", self.url()), e))
    }
}

impl Broker for RedisBroker {
    fn name(&self) -> &str {
        "redis"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::STREAM_PARTITIONING
    }

    fn state_store(&self) -> Option<Arc<dyn crate::process_manager::StateStore>> {
        Some(Arc::new(state::RedisStateStore::new(self)))
    }

    fn publish<'a>(
        &'a self,
        producer: &'a str,
        batch: &'a [Publication],
    ) -> BoxFuture<'a, Result<(), PublishError>> {
        Box::pin(publish::publish(self, producer, batch))
    }

    fn run(
        self: Arc<Self>,
        plan: Arc<ConsumerPlan>,
        shutdown: CancellationToken,
    ) -> BoxFuture<'static, Result<(), Error>> {
        Box::pin(async move {
            let mut tasks = tokio::task::JoinSet::new();
            for index in 0..plan.subscriptions.len() {
                let sub = &plan.subscriptions[index];
                if sub.reads_partitions {
                    let c = partitioned::Coordinator::new(self.clone(), plan.clone(), index);
                    tasks.spawn(c.run(shutdown.clone()));
                }
                if sub.reads_base {
                    let p = plain::PlainConsumer::new(self.clone(), plan.clone(), index);
                    tasks.spawn(p.run(shutdown.clone()));
                }
            }
            while let Some(r) = tasks.join_next().await {
                if let Err(e) = r {
                    tracing::error!(error = %crate::error::chain(&e), "a consumer task failed");
                }
            }
            Ok(())
        })
    }
}

/// Milliseconds since the Unix epoch, as Redis-side timestamps.
pub(crate) fn now_ms() -> u64 {
    crate::envelope::now_ms()
}
