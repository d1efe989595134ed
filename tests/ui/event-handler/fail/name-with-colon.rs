// An explicit handler name names the consumer group and the leases: a `:`
// (the separator of convoy's key names) is rejected at the literal.
use convoy_runtime::{Aggregate, Event, HandlerError, event_handler};
use serde::{Deserialize, Serialize};

#[derive(Aggregate)]
pub struct Order;

#[derive(Event, Serialize, Deserialize)]
#[event(part_of = Order)]
pub struct OrderPlaced {
    pub order_id: String,
    pub client_id: String,
}

pub struct ClientLedger;

#[event_handler(part_of = Order, sequential_by = "client_id", name = "ledger:projector")]
impl ClientLedger {
    #[handle]
    async fn placed(&self, _event: OrderPlaced) -> Result<(), HandlerError> {
        Ok(())
    }
}

fn main() {}
