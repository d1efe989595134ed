// An event handled by a command handler.
use convoy_runtime::{Aggregate, Command, Context, Event, HandlerError, command_handler};
use serde::{Deserialize, Serialize};

#[derive(Aggregate)]
pub struct Order;

#[derive(Command, Serialize, Deserialize)]
#[command(part_of = Order)]
pub struct PlaceOrder {
    pub order_id: String,
    pub client_id: String,
}

#[derive(Event, Serialize, Deserialize)]
#[event(part_of = Order)]
pub struct OrderPlaced {
    pub order_id: String,
}

pub struct Orders;

#[command_handler(part_of = Order)]
impl Orders {
    #[handle]
    async fn place(&self, _command: PlaceOrder, _ctx: &Context) -> Result<(), HandlerError> {
        Ok(())
    }

    #[handle]
    async fn placed(&self, _event: OrderPlaced, _ctx: &Context) -> Result<(), HandlerError> {
        Ok(())
    }
}

fn main() {}
