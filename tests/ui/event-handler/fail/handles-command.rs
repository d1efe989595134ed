// A command handled by an event handler.
use convoy_runtime::{Aggregate, Command, Context, Event, HandlerError, event_handler};
use serde::{Deserialize, Serialize};

#[derive(Aggregate)]
pub struct Order;

#[derive(Event, Serialize, Deserialize)]
#[event(part_of = Order)]
pub struct OrderPlaced {
    pub order_id: String,
    pub client_id: String,
}

#[derive(Command, Serialize, Deserialize)]
#[command(part_of = Order)]
pub struct PlaceOrder {
    pub client_id: String,
}

pub struct ClientLedger;

#[event_handler(part_of = Order, sequential_by = "client_id")]
impl ClientLedger {
    #[handle]
    async fn placed(&self, _event: OrderPlaced, _ctx: &Context) -> Result<(), HandlerError> {
        Ok(())
    }

    #[handle]
    async fn place(&self, _command: PlaceOrder, _ctx: &Context) -> Result<(), HandlerError> {
        Ok(())
    }
}

fn main() {}
