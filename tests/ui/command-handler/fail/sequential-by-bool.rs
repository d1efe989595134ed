// `sequential_by = true` on a command handler.
use convoy_runtime::{Aggregate, Command, Context, HandlerError, command_handler};
use serde::{Deserialize, Serialize};

#[derive(Aggregate)]
pub struct Order;

#[derive(Command, Serialize, Deserialize)]
#[command(part_of = Order)]
pub struct PlaceOrder {
    pub order_id: String,
    pub client_id: String,
}

pub struct Orders;

#[command_handler(part_of = Order, sequential_by = true)]
impl Orders {
    #[handle]
    async fn place(&self, _command: PlaceOrder, _ctx: &Context) -> Result<(), HandlerError> {
        Ok(())
    }
}

fn main() {}
