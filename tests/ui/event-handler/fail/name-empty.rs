// An explicit handler name cannot be empty.
use convoy_runtime::{Aggregate, Event, HandlerError, event_handler};
use serde::{Deserialize, Serialize};

#[derive(Aggregate)]
pub struct Order;

#[derive(Event, Serialize, Deserialize)]
#[event(part_of = Order)]
pub struct OrderPlaced {
    pub order_id: String,
}

pub struct Projector;

#[event_handler(part_of = Order, name = "")]
impl Projector {
    #[handle]
    async fn placed(&self, _event: OrderPlaced) -> Result<(), HandlerError> {
        Ok(())
    }
}

fn main() {}
