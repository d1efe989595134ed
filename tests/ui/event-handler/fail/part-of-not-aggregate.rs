// `part_of` names a type that is not an aggregate.
use convoy_runtime::{Aggregate, Context, Event, HandlerError, event_handler};
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

#[event_handler(part_of = OrderPlaced, sequential_by = "client_id")]
impl ClientLedger {
    #[handle]
    async fn placed(&self, _event: OrderPlaced, _ctx: &Context) -> Result<(), HandlerError> {
        Ok(())
    }
}

fn main() {}
