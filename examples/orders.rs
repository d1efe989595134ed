//! An orders domain: several clients place and ship orders; a ledger
//! projector declared `sequential_by = "client_id"` sees each client's
//! events in the order they were raised.
//!
//! Run with (no services needed, inline broker):
//!
//! ```text
//! cargo run --example orders
//! ```
//!
//! or against a real Redis, with two engine instances sharing the clients:
//!
//! ```text
//! CONVOY_REDIS_URL=redis://127.0.0.1:6379/ cargo run --example orders
//! ```

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use convoy_runtime::{
    Aggregate, Command, Config, Context, Domain, Event, HandlerError, command_handler,
    event_handler,
};
use serde::{Deserialize, Serialize};
use tracing_subscriber::prelude::*;

/// The `order` stream category.
#[derive(Aggregate)]
#[aggregate(category = "order")]
struct Order;

/// A request to place an order; its handler answers with the order's id.
#[derive(Command, Serialize, Deserialize, Debug)]
#[command(part_of = Order, reply = String)]
struct PlaceOrder {
    order_id: String,
    client_id: String,
    total: u64,
}

/// An order was placed.
#[derive(Event, Serialize, Deserialize, Debug, Clone)]
#[event(part_of = Order)]
struct OrderPlaced {
    order_id: String,
    client_id: String,
    total: u64,
}

/// An order was shipped.
#[derive(Event, Serialize, Deserialize, Debug, Clone)]
#[event(part_of = Order)]
struct OrderShipped {
    order_id: String,
    client_id: String,
}

/// What the ledger saw: per client, `(instance, description)` in handling order.
type Seen = Arc<Mutex<BTreeMap<String, Vec<(String, String)>>>>;

/// Keeps a per-client ledger. Two events of one client are never handled at
/// once, and they arrive in the order they were raised. Its explicit name
/// is its consumer group's: moving the type to another module changes
/// nothing in Redis.
struct ClientLedger {
    instance: String,
    seen: Seen,
}

impl ClientLedger {
    fn record(&self, client: &str, what: String) {
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.entry(client.to_owned())
            .or_default()
            .push((self.instance.clone(), what));
    }
}

#[event_handler(part_of = Order, sequential_by = "client_id", name = "order-client-ledger")]
impl ClientLedger {
    #[handle]
    async fn placed(&self, e: OrderPlaced, _ctx: &Context) -> Result<(), HandlerError> {
        tokio::time::sleep(Duration::from_millis(2)).await;
        self.record(&e.client_id, format!("placed {} ({})", e.order_id, e.total));
        Ok(())
    }

    #[handle]
    async fn shipped(&self, e: OrderShipped) -> Result<(), HandlerError> {
        tokio::time::sleep(Duration::from_millis(2)).await;
        self.record(&e.client_id, format!("shipped {}", e.order_id));
        Ok(())
    }
}

/// Handles `PlaceOrder` synchronously and raises `OrderPlaced`.
/// (`sequential_by` on a command handler is checked but inert: commands are
/// dispatched synchronously and never reach the outbox.)
struct OrderDesk;

#[command_handler(part_of = Order, sequential_by = "client_id")]
impl OrderDesk {
    #[handle]
    async fn place(&self, c: PlaceOrder, ctx: &Context) -> Result<String, HandlerError> {
        if c.total == 0 {
            return Err(HandlerError::msg("an order needs a total"));
        }
        ctx.raise(OrderPlaced {
            order_id: c.order_id.clone(),
            client_id: c.client_id,
            total: c.total,
        })?;
        Ok(c.order_id)
    }
}

const CLIENTS: [&str; 4] = ["acme", "globex", "initech", "umbrella"];
const ORDERS_PER_CLIENT: usize = 3;

/// Places and ships every client's orders, interleaved across clients.
/// Returns what was raised per client, in order.
async fn drive(
    domain: &Domain,
) -> Result<BTreeMap<String, Vec<String>>, Box<dyn std::error::Error>> {
    let mut raised: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for n in 1..=ORDERS_PER_CLIENT {
        for client in CLIENTS {
            let order_id = format!("{client}-{n}");
            let total = (n as u64) * 100;
            let placed = domain
                .process(PlaceOrder {
                    order_id: order_id.clone(),
                    client_id: client.to_owned(),
                    total,
                })
                .await?;
            assert_eq!(placed, order_id, "the desk answers with the order's id");
            raised
                .entry(client.to_owned())
                .or_default()
                .push(format!("placed {order_id} ({total})"));
        }
        let mut uow = domain.unit_of_work();
        for client in CLIENTS {
            let order_id = format!("{client}-{n}");
            uow.raise(OrderShipped {
                order_id: order_id.clone(),
                client_id: client.to_owned(),
            })?;
            raised
                .entry(client.to_owned())
                .or_default()
                .push(format!("shipped {order_id}"));
        }
        uow.commit().await?;
    }
    Ok(raised)
}

fn report(raised: &BTreeMap<String, Vec<String>>, seen: &Seen) -> bool {
    let seen = seen.lock().unwrap_or_else(|e| e.into_inner());
    let mut all_ok = true;
    for (client, expected) in raised {
        let got: Vec<String> = seen
            .get(client)
            .map(|v| v.iter().map(|(_, w)| w.clone()).collect())
            .unwrap_or_default();
        let ok = &got == expected;
        all_ok &= ok;
        let mut instances: Vec<&str> = seen
            .get(client)
            .map(|v| v.iter().map(|(i, _)| i.as_str()).collect())
            .unwrap_or_default();
        instances.dedup();
        println!(
            "{client:<9} {} [{}] handled by {}",
            if ok { "in order" } else { "OUT OF ORDER" },
            got.join(", "),
            instances.join(" then ")
        );
    }
    all_ok
}

/// The example's configuration, wherever it is run from.
const DOMAIN_TOML: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/domain.toml");

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The Redis client's repeated reconnect warnings, at most one line per
    // source per ten seconds (convoy's own lines are all kept).
    tracing_subscriber::registry()
        .with(
            convoy_runtime::log::quiet_redis(tracing_subscriber::fmt::layer()).with_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| "warn".into()),
            ),
        )
        .init();
    let seen: Seen = Arc::default();
    let ok = match std::env::var("CONVOY_REDIS_URL") {
        Ok(url) if !url.is_empty() => run_on_redis(&url, &seen).await?,
        _ => run_inline(&seen).await?,
    };
    if ok {
        println!("every client's events were handled in the order they were raised");
        Ok(())
    } else {
        Err("some client's events were handled out of order".into())
    }
}

async fn run_inline(seen: &Seen) -> Result<bool, Box<dyn std::error::Error>> {
    println!("orders on the inline broker (in-process, strict submission order)");
    let domain = Domain::builder()
        .config_file(DOMAIN_TOML)
        .handler(ClientLedger {
            instance: "inline".into(),
            seen: seen.clone(),
        })
        .command_handler(OrderDesk)
        .init()?;
    let raised = drive(&domain).await?;
    domain.engine().run_until_idle().await?;
    Ok(report(&raised, seen))
}

async fn run_on_redis(url: &str, seen: &Seen) -> Result<bool, Box<dyn std::error::Error>> {
    println!(
        "orders on Redis at {}: two engine instances",
        convoy_runtime::config::redact_url(url)
    );
    let mut config = Config::from_file(DOMAIN_TOML)?;
    config.broker.url = url.to_owned();
    config.server.partitioning.heartbeat_interval_seconds = Some(0.5);
    let run = format!("{}", std::process::id());
    let engines: Vec<_> = ["engine-a", "engine-b"]
        .into_iter()
        .map(|name| {
            Domain::builder()
                .config(config.clone())
                .instance_id(format!("{name}-{run}"))
                .handler(ClientLedger {
                    instance: name.into(),
                    seen: seen.clone(),
                })
                .command_handler(OrderDesk)
                .init()
        })
        .collect::<Result<_, _>>()?;
    let handles: Vec<_> = engines.iter().map(|d| d.engine().spawn()).collect();
    // Let both instances register before the first events arrive.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let raised = drive(&engines[0]).await?;
    let total: usize = raised.values().map(Vec::len).sum();
    let start = Instant::now();
    loop {
        let n: usize = seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .map(Vec::len)
            .sum();
        if n >= total || start.elapsed() > Duration::from_secs(30) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for h in handles {
        h.shutdown().await?;
    }
    Ok(report(&raised, seen))
}
