// `sequential_by` on a command handler is checked too: the field must exist.
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

#[derive(Command, Serialize, Deserialize)]
#[command(part_of = Order)]
pub struct CancelOrder {
    pub order_id: String,
}

pub struct Orders;

#[command_handler(part_of = Order, sequential_by = "client_id")]
impl Orders {
    #[handle]
    async fn place(&self, _command: PlaceOrder, _ctx: &Context) -> Result<(), HandlerError> {
        Ok(())
    }

    #[handle]
    async fn cancel(&self, _command: CancelOrder, _ctx: &Context) -> Result<(), HandlerError> {
        Ok(())
    }
}

fn main() {}
