//! `convoy serve`: refuses a non-loopback address without credentials
//! (before connecting to Redis), refuses a short token; serves the page
//! on a loopback address against a real `redis-server`, which answers a
//! token-less request 401 once a token is configured.

mod common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::run_convoy;
use convoy_runtime::testing::RedisServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test]
async fn a_public_address_needs_credentials() {
    let dir = std::env::temp_dir();
    let r = run_convoy(
        &dir,
        &[
            "serve",
            "--listen",
            "0.0.0.0:0",
            "--redis-url",
            "redis://127.0.0.1:1/",
        ],
        &[],
    )
    .await;
    assert_eq!(r.code, 64, "{r:?}");
    assert!(r.stderr.contains("without authentication"), "{r:?}");
    assert!(r.stderr.contains("CONVOY_WEB_TOKEN"), "{r:?}");
    let r = run_convoy(
        &dir,
        &[
            "serve",
            "--listen",
            "0.0.0.0:0",
            "--redis-url",
            "redis://127.0.0.1:1/",
        ],
        &[("CONVOY_WEB_TOKEN", "short")],
    )
    .await;
    assert_eq!(r.code, 64, "{r:?}");
    assert!(r.stderr.contains("shorter than 16"), "{r:?}");
}

/// `GET path` over HTTP/1.1; the status line and the rest.
async fn http_get(port: u16, path: &str, auth: Option<&str>) -> String {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let auth = auth
        .map(|a| format!("Authorization: {a}\r\n"))
        .unwrap_or_default();
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{auth}Connection: close\r\n\r\n")
            .as_bytes(),
    )
    .await
    .expect("write");
    let mut out = String::new();
    s.read_to_string(&mut out).await.expect("read");
    out
}

#[tokio::test]
async fn serves_the_page_with_a_token() {
    let server = RedisServer::start().expect("start redis-server");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let token = "0123456789abcdef0123";
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_convoy"))
        .args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--read-only",
        ])
        .args(["--redis-url", &server.url()])
        .env("CONVOY_WEB_TOKEN", token)
        .env_remove("CONVOY_REDIS_URL")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("convoy serve");
    let start = Instant::now();
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "convoy serve did not listen"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let r = http_get(port, "/", None).await;
    assert!(r.starts_with("HTTP/1.1 401"), "{r}");
    let r = http_get(port, "/", Some(&format!("Bearer {token}"))).await;
    assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    assert!(
        r.contains("read-only") && r.contains("content-security-policy"),
        "{r}"
    );
    assert!(!r.contains(&server.url()), "{r}");
    let r = http_get(
        port,
        "/c/ledger/confirm?op=skip&key=k",
        Some(&format!("Bearer {token}")),
    )
    .await;
    assert!(r.starts_with("HTTP/1.1 405"), "{r}");
    child.kill().await.expect("kill");
}

/// SIGTERM with a tab holding its live-update connection: `convoy serve`
/// ends the stream and exits within 5 s (an orchestrator's grace period).
#[tokio::test]
async fn sigterm_stops_serve_with_a_live_update_connection_open() {
    let server = RedisServer::start().expect("start redis-server");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_convoy"))
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .args(["--redis-url", &server.url()])
        .env_remove("CONVOY_REDIS_URL")
        .env_remove("CONVOY_WEB_TOKEN")
        .env_remove("CONVOY_WEB_BASIC")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("convoy serve");
    let start = Instant::now();
    let mut live = loop {
        if let Ok(s) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
            break s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "convoy serve did not listen"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    live.write_all(
        format!(
            "GET /events HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAccept: text/event-stream\r\n\r\n"
        )
        .as_bytes(),
    )
    .await
    .expect("write");
    let mut head = vec![0u8; 512];
    let n = tokio::time::timeout(Duration::from_secs(10), live.read(&mut head))
        .await
        .expect("the stream answers")
        .expect("read");
    let head = String::from_utf8_lossy(&head[..n]).into_owned();
    assert!(
        head.starts_with("HTTP/1.1 200") && head.contains("text/event-stream"),
        "{head}"
    );
    let pid = child.id().expect("pid").to_string();
    let sent = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill -TERM");
    assert!(sent.success());
    let stopped = Instant::now();
    let status = tokio::time::timeout(Duration::from_secs(5), child.wait())
        .await
        .unwrap_or_else(|_| panic!("convoy serve still running 5 s after SIGTERM"))
        .expect("wait");
    assert!(status.success(), "{status:?} after {:?}", stopped.elapsed());
    drop(live);
}
