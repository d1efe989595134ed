//! The routes: shared state, the guard every request passes (host,
//! authentication, read-only, cross-site checks, security headers), the
//! page layout and the small helpers the views share. `read.rs` has the
//! views, `act.rs` the confirmations and actions.

mod act;
mod read;

use std::convert::Infallible;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State as AxState};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use convoy_runtime::redis::admin::AdminError;
use futures::StreamExt;
use maud::{DOCTYPE, Markup, html};

use crate::auth::{host_allowed, same};
use crate::state::State;

/// The name of the CSRF cookie.
const CSRF_COOKIE: &str = "convoy_csrf";

/// The Content-Security-Policy of every response: the page's own script
/// and stylesheet, nothing inline, no framing, forms only to itself.
pub(crate) const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// The routes over `state`.
pub(crate) fn router(state: Arc<State>) -> Router {
    Router::new()
        .route("/", get(read::overview))
        .route("/c/{category}", get(read::partitions))
        .route("/c/{category}/key", get(read::key))
        .route("/c/{category}/dlq", get(read::dead_letters))
        .route("/audit", get(read::audit))
        .route("/events", get(events))
        .route("/assets/app.css", get(css))
        .route("/assets/app.js", get(js))
        .route("/c/{category}/confirm", get(act::confirm_head))
        .route("/c/{category}/act", post(act::act_head))
        .route(
            "/c/{category}/confirm-retry-all",
            get(act::confirm_retry_all),
        )
        .route("/c/{category}/retry-all", post(act::retry_all))
        .route("/c/{category}/confirm-replay", get(act::confirm_replay))
        .route("/c/{category}/replay", post(act::replay))
        .route("/c/{category}/pause", post(act::pause))
        .route("/c/{category}/resume", post(act::pause))
        .fallback(not_found)
        .layer(middleware::from_fn_with_state(state.clone(), guard))
        .with_state(state)
}

/// The operator a request acts as (recorded in audit records).
#[derive(Debug, Clone)]
pub(crate) struct Operator(pub(crate) String);

/// Whether `path` is one of the actions (hidden and refused read-only).
fn is_action(path: &str) -> bool {
    path.starts_with("/c/")
        && [
            "/confirm",
            "/act",
            "/confirm-retry-all",
            "/retry-all",
            "/confirm-replay",
            "/replay",
            "/pause",
            "/resume",
        ]
        .iter()
        .any(|a| path.ends_with(a))
}

/// Every request: the `Host` check (without authentication),
/// authentication, read-only, cross-site checks of a POST; then every
/// response gets the security headers, and a failure its page.
async fn guard(AxState(state): AxState<Arc<State>>, mut req: Request, next: Next) -> Response {
    let s = &state.settings;
    // Without authentication, only this machine's clients: the peer's
    // address, not a header it chose, decides. A router mounted without
    // connection info refuses every request until authentication is
    // configured.
    let peer = req
        .extensions()
        .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0.ip());
    let headers = req.headers();
    let refused = if matches!(s.auth, crate::Auth::None) && !peer.is_some_and(|ip| ip.is_loopback())
    {
        Some(Failure::new(
            StatusCode::FORBIDDEN,
            match peer {
                Some(_) => {
                    "without authentication this page answers only clients on this machine (loopback); configure a token or basic credentials"
                }
                None => {
                    "without authentication this page answers only clients on this machine, and this server does not say who the client is: serve the router with `into_make_service_with_connect_info::<SocketAddr>()`, or configure a token or basic credentials"
                }
            },
        ))
    } else if matches!(s.auth, crate::Auth::None)
        && !headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .is_some_and(|h| host_allowed(h, &s.allowed_hosts))
    {
        Some(Failure::new(
            StatusCode::MISDIRECTED_REQUEST,
            "this page answers only to a loopback host name (localhost, 127.0.0.1, [::1]) without authentication",
        ))
    } else {
        None
    };
    let mut response = match refused {
        Some(f) => f.into_response(),
        None => match s.auth.check(headers) {
            None => {
                let mut r = Failure::new(StatusCode::UNAUTHORIZED, "authentication required")
                    .into_response();
                r.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Basic realm=\"convoy\", charset=\"UTF-8\""),
                );
                r
            }
            Some(user) => {
                let path = req.uri().path().to_owned();
                if s.read_only && is_action(&path) {
                    let mut r = Failure::new(
                        StatusCode::METHOD_NOT_ALLOWED,
                        "this page is read-only: no action can be taken from it",
                    )
                    .into_response();
                    r.headers_mut()
                        .insert(header::ALLOW, HeaderValue::from_static(""));
                    r
                } else if req.method() == Method::POST && cross_site(headers) {
                    Failure::new(
                        StatusCode::FORBIDDEN,
                        "a request from another site is refused",
                    )
                    .into_response()
                } else {
                    let name = if user.is_empty() {
                        s.operator.clone()
                    } else {
                        user
                    };
                    let name: String = name.chars().filter(|c| !c.is_control()).take(64).collect();
                    req.extensions_mut()
                        .insert(Operator(format!("{name} (web)")));
                    next.run(req).await
                }
            }
        },
    };
    if let Some(f) = response.extensions_mut().remove::<Failure>() {
        let status = f.status;
        let body = layout(
            &state,
            "Error",
            html! {
                h1 { (status.as_u16()) " " (status.canonical_reason().unwrap_or("")) }
                div class="box warn" { p class="err" { (state.scrub(&f.message)) } }
                p { a href=(state.url("/")) { "Overview" } }
            },
        );
        let mut r = (status, body).into_response();
        for (k, v) in response.headers() {
            if k == header::WWW_AUTHENTICATE || k == header::ALLOW {
                r.headers_mut().insert(k.clone(), v.clone());
            }
        }
        response = r;
    }
    let h = response.headers_mut();
    h.insert("content-security-policy", HeaderValue::from_static(CSP));
    h.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    h.insert("x-frame-options", HeaderValue::from_static("DENY"));
    // `no-referrer` would make browsers send `Origin: null` with the
    // page's own form posts, which the cross-site check refuses.
    h.insert("referrer-policy", HeaderValue::from_static("same-origin"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    let path = if s.base_path.is_empty() {
        "/"
    } else {
        &s.base_path
    };
    if let Ok(v) = HeaderValue::from_str(&format!(
        "{CSRF_COOKIE}={}; Path={path}; SameSite=Strict; HttpOnly",
        state.csrf
    )) {
        h.insert(header::SET_COOKIE, v);
    }
    response
}

/// A POST from another site: `Sec-Fetch-Site` says so, or `Origin` names
/// another host than `Host`.
fn cross_site(headers: &HeaderMap) -> bool {
    let get = |n: &str| headers.get(n).and_then(|v| v.to_str().ok());
    if get("sec-fetch-site").is_some_and(|s| s != "same-origin" && s != "none") {
        return true;
    }
    match (get("origin"), get("host")) {
        (Some("null"), _) => true,
        (Some(origin), Some(host)) => {
            origin
                .split_once("://")
                .map(|(_, rest)| rest.trim_end_matches('/'))
                != Some(host)
        }
        _ => false,
    }
}

/// Refuses a POST whose CSRF field or cookie is not the process's token.
pub(crate) fn check_csrf(state: &State, headers: &HeaderMap, field: &str) -> Result<(), Failure> {
    let cookie = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(k, _)| *k == CSRF_COOKIE)
        .map(|(_, v)| v.to_owned())
        .unwrap_or_default();
    if same(field, &state.csrf) && same(&cookie, &state.csrf) {
        Ok(())
    } else {
        Err(Failure::new(
            StatusCode::FORBIDDEN,
            "missing or wrong CSRF token: reload the page and confirm again; nothing was done",
        ))
    }
}

/// The hidden CSRF field of a form.
pub(crate) fn csrf_field(state: &State) -> Markup {
    html! { input type="hidden" name="csrf" value=(state.csrf); }
}

/// A failed request: its page is rendered by the guard (which knows the
/// layout).
#[derive(Debug, Clone)]
pub(crate) struct Failure {
    status: StatusCode,
    message: String,
}

impl Failure {
    pub(crate) fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Failure {
            status,
            message: message.into(),
        }
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        let mut r = self.status.into_response();
        r.extensions_mut().insert(self);
        r
    }
}

impl From<AdminError> for Failure {
    fn from(e: AdminError) -> Self {
        let status = if matches!(
            e,
            AdminError::BadCategory { .. }
                | AdminError::NoSuchDeadLetter { .. }
                | AdminError::UnknownCategory { .. }
                | AdminError::UnknownKey { .. }
        ) {
            StatusCode::NOT_FOUND
        } else if e.is_refusal() {
            StatusCode::CONFLICT
        } else if e.is_unreachable() {
            StatusCode::BAD_GATEWAY
        } else {
            StatusCode::INTERNAL_SERVER_ERROR
        };
        let mut message = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            let part = s.to_string();
            if !message.ends_with(&part) {
                message.push_str(": ");
                message.push_str(&part);
            }
            source = s.source();
        }
        Failure::new(status, message)
    }
}

/// What a view returns.
pub(crate) type View = Result<Response, Failure>;

/// A whole page.
pub(crate) fn layout(state: &State, title: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · convoy" }
                link rel="stylesheet" href=(state.url("/assets/app.css"));
                script src=(state.url("/assets/app.js")) defer {}
            }
            body data-base=(state.settings.base_path) {
                header {
                    a class="brand" href=(state.url("/")) { "convoy" }
                    a href=(state.url("/")) { "Overview" }
                    a href=(state.url("/audit")) { "Audit log" }
                    @if state.settings.read_only { span class="ro" { "read-only" } }
                }
                main { (body) }
            }
        }
    }
}

/// `markup` as an HTML response.
pub(crate) fn html_response(markup: Markup) -> Response {
    (
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        markup.into_string(),
    )
        .into_response()
}

async fn css() -> Response {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        crate::assets::CSS,
    )
        .into_response()
}

async fn js() -> Response {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        crate::assets::JS,
    )
        .into_response()
}

async fn not_found() -> Failure {
    Failure::new(StatusCode::NOT_FOUND, "no such page")
}

/// Server-sent `tick` events at the live interval, for at most
/// `max_live_clients` pages at once.
async fn events(AxState(state): AxState<Arc<State>>) -> Response {
    let Ok(permit) = state.live_clients.clone().try_acquire_owned() else {
        return Failure::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "too many pages listen for live updates",
        )
        .into_response();
    };
    let mut tick = tokio::time::interval(state.settings.live_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let stopping = state.stopping.clone();
    let stream = futures::stream::unfold((tick, permit), |(mut tick, permit)| async move {
        tick.tick().await;
        let e = Event::default()
            .event("tick")
            .data(crate::state::now_ms().to_string());
        Some((Ok::<_, Infallible>(e), (tick, permit)))
    })
    // The server is stopping: the stream ends, so the connection closes
    // and the page reconnects elsewhere (or shows that it cannot).
    .take_until(stopping.cancelled_owned());
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// Percent-encodes a query value.
pub(crate) fn enc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A handler's last `::` segment.
pub(crate) fn short(group: &str) -> &str {
    group.rsplit("::").next().unwrap_or(group)
}

pub(crate) use convoy_runtime::redis::admin::utc;

/// A duration in ms, short: `850ms`, `12s`, `3m05s`, `2h10m`.
pub(crate) fn age(ms: u64) -> String {
    match ms {
        0..1_000 => format!("{ms}ms"),
        1_000..60_000 => format!("{}s", ms / 1000),
        60_000..3_600_000 => format!("{}m{:02}s", ms / 60_000, ms / 1000 % 60),
        _ => format!("{}h{:02}m", ms / 3_600_000, ms / 60_000 % 60),
    }
}

/// `text` cut to `n` characters.
pub(crate) fn cut(text: &str, n: usize) -> String {
    if text.chars().count() <= n {
        text.to_owned()
    } else {
        let mut t: String = text.chars().take(n).collect();
        t.push('…');
        t
    }
}

/// A payload pretty-printed when it is JSON, as is otherwise.
pub(crate) fn pretty(payload: &str) -> String {
    serde_json::from_str::<serde_json::Value>(payload)
        .ok()
        .and_then(|v| serde_json::to_string_pretty(&v).ok())
        .unwrap_or_else(|| payload.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helpers() {
        assert_eq!(enc("a b/<é>"), "a%20b%2F%3C%C3%A9%3E");
        assert_eq!(short("app::Ledger"), "Ledger");
        assert_eq!(utc(0), "1970-01-01 00:00:00.000 UTC");
        assert_eq!(age(125_000), "2m05s");
        assert_eq!(cut("abcdef", 3), "abc…");
        assert_eq!(pretty("{\"a\":1}"), "{\n  \"a\": 1\n}");
        assert!(is_action("/c/order/act") && !is_action("/c/order/key"));
        let mut h = HeaderMap::new();
        h.insert("host", HeaderValue::from_static("127.0.0.1:80"));
        h.insert("origin", HeaderValue::from_static("http://127.0.0.1:80"));
        assert!(!cross_site(&h));
        h.insert("origin", HeaderValue::from_static("http://evil.example"));
        assert!(cross_site(&h));
    }
}
