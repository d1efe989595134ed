//! The convoy operator page: every partition's state, live and searchable
//! in the browser, with the command line's head actions (skip,
//! dead-letter, retry, retry all halted, replay), each confirmed on the
//! page, fenced exactly like `convoy skip` and audited with the operator's
//! identity.
//!
//! It is an axum [`Router`] over a [`convoy_runtime::redis::admin::Admin`]:
//! `convoy serve` runs it, and an application can mount it in its own
//! axum server. Pages are rendered on the server (maud, every value
//! HTML-escaped); the one script, embedded in the binary, refreshes the
//! live parts of a page on server-sent events at a bounded rate.
//!
//! # Example
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use convoy_runtime::redis::admin::Admin;
//! use convoy_web::{OperatorPage, Settings};
//!
//! let admin = Admin::connect("redis://127.0.0.1:6379/").await?;
//! let page = OperatorPage::new(admin, Settings::default());
//! // Its lag chart and sorted listing need the background task.
//! let shutdown = tokio_util::sync::CancellationToken::new();
//! tokio::spawn(page.clone().run_background(shutdown.clone()));
//! let app = axum::Router::new().nest("/convoy", page.router());
//! # let _ = app;
//! # Ok(())
//! # }
//! ```
//!
//! Mounted under a prefix, set [`Settings::base_path`] to it, so the
//! page's links and forms point there.
//!
//! # Safety
//!
//! - [`OperatorPage::serve`] (and `convoy serve`) refuses a non-loopback address unless [`Auth`] is
//!   configured (a bearer token, or basic credentials, read from a file or
//!   the environment by [`Auth::from_sources`], never from the command
//!   line).
//! - Without authentication, only clients on this machine are answered,
//!   by their connection's address (a router mounted in an application
//!   must then be served with
//!   `into_make_service_with_connect_info::<SocketAddr>()`, or every
//!   request is refused), and only requests whose `Host` is a loopback
//!   name (or one of [`Settings::allowed_hosts`]): a page on another site
//!   cannot reach it through DNS rebinding.
//! - Every `POST` carries the process's CSRF token in a hidden field and a
//!   `SameSite=Strict` cookie (both must match), and a cross-site
//!   `Origin` or `Sec-Fetch-Site` is refused.
//! - [`Settings::read_only`] hides every action and answers them `405`.
//! - Responses carry a strict `Content-Security-Policy` (`script-src
//!   'self'`, no inline script or style), `X-Frame-Options: DENY`,
//!   `Referrer-Policy: same-origin`, `nosniff`.
//! - The Redis URL is never shown; [`Settings::secrets`] are removed from
//!   every error text.
//! - Payloads can be hidden ([`Settings::hide_payloads`]): they may hold
//!   personal data.

mod assets;
mod auth;
mod chart;
mod live;
mod state;
mod views;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use convoy_runtime::outbox::OutboxStore;
use convoy_runtime::redis::admin::Admin;
use tokio_util::sync::CancellationToken;

pub use auth::{Auth, BASIC_ENV, TOKEN_ENV};

/// What the page does and allows.
#[derive(Clone)]
pub struct Settings {
    /// Hide every action and refuse them (HTTP 405).
    pub read_only: bool,
    /// Show `(hidden)` instead of payloads (they may hold personal data).
    pub hide_payloads: bool,
    /// Who may use the page.
    pub auth: Auth,
    /// The operator recorded in audit records when the request names
    /// none (no authentication, or a bearer token); a basic user's name
    /// otherwise. `" (web)"` is appended.
    pub operator: String,
    /// The path the router is mounted under (`""`, or like `/convoy`).
    pub base_path: String,
    /// `Host` values accepted without authentication, besides loopback
    /// names (`localhost`, `127.0.0.1`, `[::1]`, any port).
    pub allowed_hosts: Vec<String>,
    /// How often a page's live parts refresh (at least one second).
    pub live_interval: Duration,
    /// How many pages may listen for live updates at once.
    pub max_live_clients: usize,
    /// How often the lag of every handler is sampled (a few commands per
    /// category and shard).
    pub sample_interval: Duration,
    /// How many lag samples are kept per handler (the chart's span is
    /// this times the interval).
    pub samples_kept: usize,
    /// How often the background snapshot of every partition's status
    /// (for sorting by lag and filtering by state) starts again.
    pub snapshot_interval: Duration,
    /// At most this many partitions read per second by the snapshot
    /// (its cost on Redis).
    pub snapshot_keys_per_second: usize,
    /// Rows per page of a listing.
    pub page_size: usize,
    /// The outbox to show the backlog of, with its name.
    pub outbox: Option<(String, Arc<dyn OutboxStore>)>,
    /// Text never rendered (passwords of the Redis URL, found with
    /// [`convoy_runtime::config::url_secrets`]): replaced by `***` in
    /// errors.
    pub secrets: Vec<String>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            read_only: false,
            hide_payloads: false,
            auth: Auth::None,
            operator: std::env::var("USER")
                .ok()
                .filter(|u| !u.is_empty())
                .unwrap_or_else(|| "unknown".to_owned()),
            base_path: String::new(),
            allowed_hosts: Vec::new(),
            live_interval: Duration::from_secs(2),
            max_live_clients: 32,
            sample_interval: Duration::from_secs(5),
            samples_kept: 120,
            snapshot_interval: Duration::from_secs(30),
            snapshot_keys_per_second: 20_000,
            page_size: 50,
            outbox: None,
            secrets: Vec::new(),
        }
    }
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("read_only", &self.read_only)
            .field("hide_payloads", &self.hide_payloads)
            .field("auth", &self.auth)
            .field("operator", &self.operator)
            .field("base_path", &self.base_path)
            .field("live_interval", &self.live_interval)
            .field("sample_interval", &self.sample_interval)
            .field("snapshot_interval", &self.snapshot_interval)
            .field("outbox", &self.outbox.as_ref().map(|(name, _)| name))
            .finish_non_exhaustive()
    }
}

/// Why the page cannot start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WebError {
    /// A non-loopback address without authentication.
    #[error(
        "refusing to listen on {addr} without authentication: the page can act on every partition; listen on a loopback address (127.0.0.1, the default), or configure a token (--token-file or $CONVOY_WEB_TOKEN) or basic credentials (--basic-file or $CONVOY_WEB_BASIC)"
    )]
    Unauthenticated {
        /// The address asked for.
        addr: SocketAddr,
    },
    /// The credentials could not be read.
    #[error("{0}")]
    Credentials(String),
    /// Binding or serving failed.
    #[error("cannot serve on {addr}")]
    Io {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// Refuses a non-loopback `addr` when `auth` is [`Auth::None`].
pub fn check_listen(addr: &SocketAddr, auth: &Auth) -> Result<(), WebError> {
    if addr.ip().is_loopback() || !matches!(auth, Auth::None) {
        Ok(())
    } else {
        Err(WebError::Unauthenticated { addr: *addr })
    }
}

/// The operator page: cheap to clone (one shared state).
#[derive(Clone)]
pub struct OperatorPage {
    state: Arc<state::State>,
}

impl std::fmt::Debug for OperatorPage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OperatorPage")
            .field("settings", &self.state.settings)
            .finish_non_exhaustive()
    }
}

impl OperatorPage {
    /// The page over `admin`.
    pub fn new(admin: Admin, mut settings: Settings) -> Self {
        settings.live_interval = settings.live_interval.max(Duration::from_secs(1));
        settings.sample_interval = settings.sample_interval.max(Duration::from_secs(1));
        settings.samples_kept = settings.samples_kept.clamp(2, 10_000);
        settings.page_size = settings.page_size.clamp(1, 500);
        settings.snapshot_keys_per_second = settings.snapshot_keys_per_second.max(100);
        settings.base_path = settings.base_path.trim_end_matches('/').to_owned();
        OperatorPage {
            state: Arc::new(state::State::new(admin, settings)),
        }
    }

    /// The routes, to serve or mount (see [`Settings::base_path`]).
    pub fn router(&self) -> Router {
        views::router(self.state.clone())
    }

    /// Samples every handler's lag for the charts and keeps a snapshot of
    /// every partition's status for sorting and filtering, until
    /// `shutdown`; at the rates of [`Settings`].
    pub async fn run_background(self, shutdown: CancellationToken) {
        live::run(self.state.clone(), shutdown).await;
    }

    /// Takes one snapshot of every category now (what the background
    /// task does every [`Settings::snapshot_interval`]).
    pub async fn refresh_snapshot(&self) {
        live::snapshot_all(&self.state, &CancellationToken::new()).await;
    }

    /// Takes one lag sample of every handler now.
    pub async fn sample_now(&self) {
        live::sample(&self.state).await;
    }

    /// Serves the page on `addr` until `shutdown`, with the background
    /// task; refuses a non-loopback address without authentication
    /// ([`check_listen`]). Calls `bound` with the address bound (the port
    /// chosen for port 0).
    pub async fn serve(
        self,
        addr: SocketAddr,
        shutdown: CancellationToken,
        bound: impl FnOnce(SocketAddr),
    ) -> Result<(), WebError> {
        check_listen(&addr, &self.state.settings.auth)?;
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| WebError::Io { addr, source })?;
        let local = listener
            .local_addr()
            .map_err(|source| WebError::Io { addr, source })?;
        bound(local);
        let background = tokio::spawn(self.clone().run_background(shutdown.clone()));
        let stop = shutdown.clone();
        let stopping = self.state.stopping.clone();
        let served = axum::serve(
            listener,
            self.router()
                .into_make_service_with_connect_info::<SocketAddr>(),
        )
        .with_graceful_shutdown(async move {
            stop.cancelled().await;
            // Open tabs' live-update streams end now: a graceful shutdown
            // waits for every connection.
            stopping.cancel();
        })
        .await
        .map_err(|source| WebError::Io { addr, source });
        shutdown.cancel();
        let _ = background.await;
        served
    }
}
