//! Connections to Redis: one shared, reconnecting connection for commands
//! and scripts, and dedicated connections for blocking reads.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use tokio::sync::OnceCell;

use crate::config::redact_url;
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

/// A Redis server's client, and its connections (made on first use).
pub(crate) struct Connection {
    pub(crate) client: redis::Client,
    url: String,
    response_timeout: Duration,
    shared: OnceCell<ConnectionManager>,
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
    pub(crate) fn new(client: redis::Client, url: &str) -> Self {
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

    /// The shared, reconnecting connection.
    pub(crate) async fn shared(&self) -> Result<ConnectionManager, Error> {
        self.shared
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
    pub(crate) async fn blocking(&self) -> Result<MultiplexedConnection, Error> {
        let cfg = redis::AsyncConnectionConfig::new()
            .set_response_timeout(Some(BLOCK + self.response_timeout))
            .set_connection_timeout(Some(self.response_timeout));
        self.client
            .get_multiplexed_async_connection_with_config(&cfg)
            .await
            .map_err(|e| Error::redis(format!("cannot connect to {}", self.url()), e))
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
