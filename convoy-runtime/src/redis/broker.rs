//! The Redis broker: publishing through the publish script, consuming with
//! one partitioned coordinator and/or one ordinary consumer group per
//! subscription.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::connection::{Client, Connection};
use super::partitioned::Coordinator;
use super::plain::PlainConsumer;
use super::scripts::publish::Publish;
use super::state::RedisStateStore;
use crate::broker::{Broker, Capabilities, ConsumerPlan, Producer, Publication, PublishError};
use crate::error::{Error, chain};
use crate::future::BoxFuture;
use crate::process_manager::StateStore;

/// The Redis Streams broker. Cheap to share; connects on first use.
pub struct RedisBroker {
    redis: Arc<Connection>,
}

impl std::fmt::Debug for RedisBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisBroker")
            .field("url", &self.redis.url())
            .finish_non_exhaustive()
    }
}

impl RedisBroker {
    /// A broker for a `redis://` or `rediss://` URL (user, password and
    /// database in the URL work), or for a Redis Cluster named by one or
    /// more of its nodes: `redis+cluster://[user:password@]h1:p1,h2:p2/`
    /// (`rediss+cluster://` for TLS). Nothing is connected yet.
    pub fn from_url(url: &str) -> Result<Self, Error> {
        Self::open(url, None)
    }

    /// A broker for a `rediss://` URL whose server certificate is signed by
    /// the CA in `ca_pem` (PEM) rather than one in the system trust store.
    pub fn from_url_with_ca(url: &str, ca_pem: Vec<u8>) -> Result<Self, Error> {
        Self::open(url, Some(ca_pem))
    }

    fn open(url: &str, ca_pem: Option<Vec<u8>>) -> Result<Self, Error> {
        let client = Client::open(url, ca_pem, "[broker] url ")?;
        Ok(RedisBroker {
            redis: Arc::new(Connection::new(client, url)),
        })
    }

    /// How long one command may take before it fails (default 5 s).
    pub fn response_timeout(self, timeout: Duration) -> Self {
        RedisBroker {
            redis: Arc::new(self.redis.with_response_timeout(timeout)),
        }
    }

    /// The URL with its password hidden.
    pub fn url(&self) -> String {
        self.redis.url()
    }

    /// The connections.
    pub(crate) fn connection(&self) -> &Arc<Connection> {
        &self.redis
    }
}

impl Broker for RedisBroker {
    fn name(&self) -> &str {
        "redis"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::STREAM_PARTITIONING
    }

    fn state_store(&self) -> Option<Arc<dyn StateStore>> {
        Some(Arc::new(RedisStateStore::new(self.redis.clone())))
    }

    fn describe(&self) -> String {
        format!("redis at {}", self.redis.url())
    }

    fn ping(&self) -> BoxFuture<'_, Result<(), Error>> {
        Box::pin(async move {
            let mut conn = self.redis.shared().await?;
            let _: String = redis::cmd("PING")
                .query_async(&mut conn)
                .await
                .map_err(|e| Error::redis("PING failed", e))?;
            Ok(())
        })
    }

    fn publish<'a>(
        &'a self,
        producer: &'a Producer,
        batch: &'a [Publication],
    ) -> BoxFuture<'a, Result<(), PublishError>> {
        Box::pin(async move {
            if batch.is_empty() {
                return Ok(());
            }
            // The script writes the whole batch or nothing.
            let fail = |error: Error| PublishError {
                published: 0,
                error,
            };
            let mut conn = self.redis.shared().await.map_err(fail)?;
            Publish { producer, batch }
                .run(&mut conn)
                .await
                .map_err(fail)?;
            Ok(())
        })
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
                    let c = Coordinator::new(self.redis.clone(), plan.clone(), index);
                    tasks.spawn(c.run(shutdown.clone()));
                }
                if sub.reads_base {
                    let p = PlainConsumer::new(self.redis.clone(), plan.clone(), index);
                    tasks.spawn(p.run(shutdown.clone()));
                }
            }
            while let Some(r) = tasks.join_next().await {
                if let Err(e) = r {
                    tracing::error!(error = %chain(&e), "a consumer task failed");
                }
            }
            Ok(())
        })
    }
}
