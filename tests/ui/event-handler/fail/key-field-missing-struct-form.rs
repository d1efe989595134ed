// Struct form: one of the types in `handles = [..]` has no `client_id` field.
use convoy_runtime::{Aggregate, Context, Event, Handle, HandlerError, event_handler};
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
pub struct OrderShipped {
    pub order_id: String,
    pub carrier: String,
}

#[event_handler(part_of = Order, sequential_by = "client_id", handles = [OrderPlaced, OrderShipped])]
pub struct ClientLedger;

impl Handle<OrderPlaced> for ClientLedger {
    async fn handle(&self, _event: OrderPlaced, _ctx: &Context) -> Result<(), HandlerError> {
        Ok(())
    }
}

impl Handle<OrderShipped> for ClientLedger {
    async fn handle(&self, _event: OrderShipped, _ctx: &Context) -> Result<(), HandlerError> {
        Ok(())
    }
}

fn main() {}
