// A `#[handle]` method whose error type does not convert into `HandlerError`.
use convoy_runtime::{Aggregate, Context, Event, event_handler};
use serde::{Deserialize, Serialize};

#[derive(Aggregate)]
pub struct Order;

#[derive(Event, Serialize, Deserialize)]
#[event(part_of = Order)]
pub struct OrderPlaced {
    pub order_id: String,
    pub client_id: String,
}

#[derive(Debug)]
pub struct LedgerFault;

pub struct ClientLedger;

#[event_handler(part_of = Order, sequential_by = "client_id")]
impl ClientLedger {
    #[handle]
    async fn placed(&self, _event: OrderPlaced, _ctx: &Context) -> Result<(), LedgerFault> {
        Err(LedgerFault)
    }
}

fn main() {}
