// An event must derive serde's Serialize and Deserialize: it travels as
// JSON. One error says so, at the type, even with a handler handling it.
use convoy_runtime::{Aggregate, Event, HandlerError, event_handler};

#[derive(Aggregate)]
pub struct Order;

#[derive(Event)]
#[event(part_of = Order)]
pub struct OrderPlaced {
    pub order_id: String,
}

pub struct Ledger;

#[event_handler(part_of = Order, sequential_by = "order_id")]
impl Ledger {
    #[handle]
    async fn placed(&self, _e: OrderPlaced) -> Result<(), HandlerError> {
        Ok(())
    }
}

fn main() {}
