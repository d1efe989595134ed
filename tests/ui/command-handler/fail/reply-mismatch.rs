// A command declared `reply = OrderId` is answered with an `OrderId`: a
// handler method returning `Result<(), E>` for it is reported at its
// return type.
use convoy_runtime::{Aggregate, Command, HandlerError, command_handler};
use serde::{Deserialize, Serialize};

#[derive(Aggregate)]
pub struct Order;

pub struct OrderId(pub String);

#[derive(Command, Serialize, Deserialize)]
#[command(part_of = Order, reply = OrderId)]
pub struct PlaceOrder {
    pub client_id: String,
}

pub struct Desk;

#[command_handler(part_of = Order)]
impl Desk {
    #[handle]
    async fn place(&self, _command: PlaceOrder) -> Result<(), HandlerError> {
        Ok(())
    }
}

fn main() {}
