//! What the operator page's tests share: a `ledger` domain whose handler
//! fails on poison events (so partitions halt), a real `redis-server`,
//! and requests to the page's router.
#![allow(dead_code, missing_docs, unreachable_pub)]

use std::collections::BTreeMap;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use convoy_runtime::redis::admin::Admin;
use convoy_runtime::redis::keys;
use convoy_web::{OperatorPage, Settings};
use http_body_util::BodyExt;
use redis::AsyncCommands;
use tower::ServiceExt;

#[path = "../../../tests/support/halting_ledger.rs"]
mod halting_ledger;

// Not every test binary uses all of them.
#[allow(unused_imports)]
pub use convoy_runtime::testing::wait_until;
#[allow(unused_imports)]
pub use halting_ledger::{Posted, SHARDS, Setup, WAIT, ids, posted};

/// The ledger domain over a new `redis-server`; its handler takes no time.
pub fn setup() -> Setup {
    halting_ledger::setup(Duration::ZERO)
}

impl Setup {
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
