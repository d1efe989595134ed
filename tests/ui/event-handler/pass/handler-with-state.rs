// A handler holding state (`Arc<Mutex<..>>`), dispatched for real.
use std::sync::{Arc, Mutex};

use convoy_runtime::__private::Dispatched;
use convoy_runtime::envelope::Priority;
use convoy_runtime::key::KeyPolicy;
use convoy_runtime::{Aggregate, Context, Envelope, Event, EventHandler, HandlerError, event_handler};
use serde::{Deserialize, Serialize};

#[derive(Aggregate)]
pub struct Order;

#[derive(Event, Serialize, Deserialize)]
#[event(part_of = Order)]
pub struct OrderPlaced {
    pub order_id: String,
    pub client_id: String,
}

#[derive(Event, Serialize, Deserialize)]
#[event(part_of = Order)]
pub struct OrderCancelled {
    pub order_id: String,
    pub client_id: String,
}

#[derive(Debug)]
pub struct LedgerClosed;

impl std::fmt::Display for LedgerClosed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ledger closed")
    }
}

impl std::error::Error for LedgerClosed {}

pub struct ClientLedger {
    log: Arc<Mutex<Vec<String>>>,
    closed: bool,
}

#[event_handler(part_of = Order, sequential_by = "client_id")]
impl ClientLedger {
    /// Not a handler: left alone.
    pub fn new(log: Arc<Mutex<Vec<String>>>) -> Self {
        ClientLedger { log, closed: false }
    }

    #[handle]
    async fn placed(&self, event: OrderPlaced, ctx: &Context) -> Result<(), LedgerClosed> {
        if self.closed {
            return Err(LedgerClosed);
        }
        let attempt = ctx.attempt();
        self.log.lock().unwrap().push(format!("{} {} #{attempt}", event.client_id, event.order_id));
        Ok(())
    }
}

fn dispatch<E: Event>(handler: &ClientLedger, event: &E) -> Result<Dispatched, HandlerError> {
    let envelope = Envelope::wrap(event, Some("c-1".into()), Priority::Normal, None).unwrap();
    let ctx = Context::new(handler.descriptor().name, &envelope, 1, Arc::new(KeyPolicy::default()));
    futures::executor::block_on(handler.dispatch(&envelope, &ctx))
}

fn main() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut ledger = ClientLedger::new(log.clone());
    let placed = OrderPlaced { order_id: "o-1".into(), client_id: "c-1".into() };
    assert_eq!(dispatch(&ledger, &placed).unwrap(), Dispatched::Handled);
    assert_eq!(*log.lock().unwrap(), ["c-1 o-1 #1"]);

    let cancelled = OrderCancelled { order_id: "o-1".into(), client_id: "c-1".into() };
    assert_eq!(dispatch(&ledger, &cancelled).unwrap(), Dispatched::NotHandled);

    ledger.closed = true;
    let error = dispatch(&ledger, &placed).unwrap_err();
    assert_eq!(error.to_string(), "ledger closed");
}
