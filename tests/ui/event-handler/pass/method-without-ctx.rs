// A `#[handle]` method may leave out the context argument.
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

#[event_handler(part_of = Order, sequential_by = "client_id")]
impl ClientLedger {
    #[handle]
    async fn placed(&self, event: OrderPlaced) -> Result<(), HandlerError> {
        if event.order_id.is_empty() {
            return Err("an order needs an id".into());
        }
        Ok(())
    }
}

fn main() {}
