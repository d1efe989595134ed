//! The Redis broker.

use crate::error::Error;

/// The Redis Streams broker (work in progress).
#[derive(Debug)]
pub struct RedisBroker {
    _url: String,
}

impl RedisBroker {
    /// A broker for `url`.
    pub fn from_url(url: &str) -> Result<Self, Error> {
        Err(Error::Config {
            file: "<code>".into(),
            message: format!("the redis broker is not available yet ({})", crate::config::redact_url(url)),
        })
    }
}

impl crate::broker::Broker for RedisBroker {
    fn name(&self) -> &str {
        "redis"
    }
    fn capabilities(&self) -> crate::broker::Capabilities {
        crate::broker::Capabilities::STREAM_PARTITIONING
    }
    fn publish<'a>(
        &'a self,
        _producer: &'a str,
        _batch: &'a [crate::broker::Publication],
    ) -> crate::handler::BoxFuture<'a, Result<(), crate::broker::PublishError>> {
        Box::pin(async { Ok(()) })
    }
    fn run(
        self: std::sync::Arc<Self>,
        _plan: std::sync::Arc<crate::engine::ConsumerPlan>,
        _shutdown: tokio_util::sync::CancellationToken,
    ) -> crate::handler::BoxFuture<'static, Result<(), Error>> {
        Box::pin(async { Ok(()) })
    }
}
