//! The optional Prometheus endpoint serves convoy's metrics, the handler
//! time as a histogram with the buckets given (a summary cannot be summed
//! across instances).

use std::io::{Read, Write};
use std::sync::{Arc, Mutex};

use convoy_runtime::{Aggregate, Domain, Event, HandlerError, event_handler};
use serde::{Deserialize, Serialize};

#[derive(Aggregate)]
#[aggregate(category = "pings")]
struct Pings;

#[derive(Event, Serialize, Deserialize)]
#[event(part_of = Pings)]
struct Ping {
    n: u32,
}

struct Counter {
    seen: Arc<Mutex<u32>>,
}

#[event_handler(part_of = Pings)]
impl Counter {
    #[handle]
    async fn ping(&self, _p: Ping) -> Result<(), HandlerError> {
        *self.seen.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        Ok(())
    }
}

#[tokio::test]
async fn prometheus_endpoint_serves_convoy_metrics() {
    let port = convoy_runtime::testing::free_port().expect("port");
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    convoy_runtime::metrics::install_prometheus_with_buckets(addr, &[0.5, 30.0]).expect("install");
    let seen = Arc::new(Mutex::new(0));
    let d = Domain::builder()
        .handler(Counter { seen: seen.clone() })
        .init()
        .expect("init");
    let mut uow = d.unit_of_work();
    for n in 0..3 {
        uow.raise(Ping { n }).expect("raise");
    }
    uow.commit().await.expect("commit");
    d.engine().run_until_idle().await.expect("run");
    assert_eq!(*seen.lock().unwrap_or_else(|e| e.into_inner()), 3);
    let body = tokio::task::spawn_blocking(move || {
        let mut s = std::net::TcpStream::connect(addr).expect("connect");
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            .expect("write");
        let mut body = String::new();
        s.read_to_string(&mut body).expect("read");
        body
    })
    .await
    .expect("scrape");
    assert!(
        body.contains("convoy_events_handled_total{handler=\"metrics_prometheus::Counter\"} 3"),
        "{body}"
    );
    assert!(
        body.contains("# TYPE convoy_handle_seconds histogram"),
        "{body}"
    );
    for le in ["0.5", "30", "+Inf"] {
        let bucket = format!(
            "convoy_handle_seconds_bucket{{handler=\"metrics_prometheus::Counter\",le=\"{le}\"}} 3"
        );
        assert!(body.contains(&bucket), "{bucket} not in {body}");
    }
    assert!(!body.contains("quantile"), "not a summary: {body}");
}
