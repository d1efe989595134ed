//! A fulfilment process manager across orders and payments: each order is
//! one instance, keyed by its order id, fed by the `order` category
//! (`order_id`) and the `payment` category (`order_ref`). Declared
//! `sequential_by = true`, no two events of one order are ever handled at
//! once, while different orders proceed in parallel.
//!
//! Run with (inline broker, no services):
//!
//! ```text
//! cargo run --example fulfilment
//! ```
//!
//! or on Redis with two engine instances:
//!
//! ```text
//! CONVOY_REDIS_URL=redis://127.0.0.1:6379/ cargo run --example fulfilment
//! ```

use std::time::{Duration, Instant};

use convoy_runtime::process_manager::{MemoryStateStore, StateStore};
use convoy_runtime::{
    Aggregate, Config, Context, Domain, Event, HandlerError, ProcessManager, process_manager,
};
use serde::{Deserialize, Serialize};
use tracing_subscriber::prelude::*;

#[derive(Aggregate)]
#[aggregate(category = "order")]
struct Order;

#[derive(Aggregate)]
#[aggregate(category = "payment")]
struct Payment;

/// An order was placed.
#[derive(Event, Serialize, Deserialize, Debug)]
#[event(part_of = Order)]
struct OrderPlaced {
    order_id: String,
    total: u64,
}

/// A payment for an order was captured.
#[derive(Event, Serialize, Deserialize, Debug)]
#[event(part_of = Payment)]
struct PaymentCaptured {
    order_ref: String,
    amount: u64,
}

/// The order was shipped: the process is complete.
#[derive(Event, Serialize, Deserialize, Debug)]
#[event(part_of = Order)]
struct OrderShipped {
    order_id: String,
}

/// One order's progress.
#[derive(Default, Serialize, Deserialize, Debug)]
struct Fulfilment {
    order_id: String,
    total: u64,
    paid: u64,
    shipped: bool,
}

#[process_manager(sequential_by = true)]
impl Fulfilment {
    #[handle(start, correlate = "order_id")]
    async fn placed(&mut self, e: OrderPlaced) -> Result<(), HandlerError> {
        self.order_id = e.order_id;
        self.total = e.total;
        Ok(())
    }

    #[handle(correlate = "order_ref")]
    async fn paid(&mut self, e: PaymentCaptured, ctx: &Context) -> Result<(), HandlerError> {
        tokio::time::sleep(Duration::from_millis(2)).await;
        self.paid += e.amount;
        if self.paid >= self.total && self.total > 0 {
            ctx.raise(OrderShipped {
                order_id: self.order_id.clone(),
            })?;
        }
        Ok(())
    }

    #[handle(end, correlate = "order_id")]
    async fn shipped(&mut self, _e: OrderShipped) -> Result<(), HandlerError> {
        self.shipped = true;
        Ok(())
    }
}

const ORDERS: [&str; 3] = ["o-1", "o-2", "o-3"];

/// Places every order and pays each in three instalments, interleaved.
async fn drive(domain: &Domain) -> Result<(), Box<dyn std::error::Error>> {
    let mut uow = domain.unit_of_work();
    for o in ORDERS {
        uow.raise(OrderPlaced {
            order_id: o.into(),
            total: 90,
        })?;
    }
    for _ in 0..3 {
        for o in ORDERS {
            uow.raise(PaymentCaptured {
                order_ref: o.into(),
                amount: 30,
            })?;
        }
    }
    uow.commit().await?;
    Ok(())
}

async fn report(store: &dyn StateStore) -> Result<bool, Box<dyn std::error::Error>> {
    let name = <Fulfilment as ProcessManager>::DESCRIPTOR.name;
    let mut all = true;
    for o in ORDERS {
        match store.load(name, o).await? {
            Some(s) => {
                let f: Fulfilment = serde_json::from_str(&s.state)?;
                println!(
                    "{o}: total {}, paid {}, shipped {}, ended {}",
                    f.total, f.paid, f.shipped, s.ended
                );
                all &= f.shipped && s.ended;
            }
            None => {
                println!("{o}: not started");
                all = false;
            }
        }
    }
    Ok(all)
}

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
    let done = match std::env::var("CONVOY_REDIS_URL") {
        Ok(url) if !url.is_empty() => on_redis(&url).await?,
        _ => inline().await?,
    };
    if done {
        println!("every order was paid and shipped");
        Ok(())
    } else {
        Err("some order did not complete".into())
    }
}

async fn inline() -> Result<bool, Box<dyn std::error::Error>> {
    println!("fulfilment on the inline broker");
    let store = std::sync::Arc::new(MemoryStateStore::new());
    let domain = Domain::builder()
        .process_manager::<Fulfilment>()
        .state_store_arc(store.clone())
        .init()?;
    drive(&domain).await?;
    domain.engine().run_until_idle().await?;
    report(store.as_ref()).await
}

async fn on_redis(url: &str) -> Result<bool, Box<dyn std::error::Error>> {
    println!(
        "fulfilment on Redis at {}: two engine instances",
        convoy_runtime::config::redact_url(url)
    );
    let mut config = Config::default();
    config.broker.url = url.to_owned();
    config.server.partitioning.heartbeat_interval_seconds = Some(0.5);
    let run = std::process::id();
    let domains: Vec<Domain> = ["engine-a", "engine-b"]
        .into_iter()
        .map(|n| {
            Domain::builder()
                .config(config.clone())
                .instance_id(format!("{n}-{run}"))
                .process_manager::<Fulfilment>()
                .init()
        })
        .collect::<Result<_, _>>()?;
    let handles: Vec<_> = domains.iter().map(|d| d.engine().spawn()).collect();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    drive(&domains[0]).await?;
    let store = domains[0]
        .broker()
        .state_store()
        .ok_or("the Redis broker keeps process-manager state")?;
    let start = Instant::now();
    let mut done = false;
    while !done && start.elapsed() < Duration::from_secs(30) {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let name = <Fulfilment as ProcessManager>::DESCRIPTOR.name;
        let mut all = true;
        for o in ORDERS {
            all &= store.load(name, o).await?.is_some_and(|s| s.ended);
        }
        done = all;
    }
    for h in handles {
        h.shutdown().await?;
    }
    report(store.as_ref()).await
}
