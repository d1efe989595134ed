// The key field exists but its type (`f64`) cannot be a partition key.
use convoy_runtime::{Aggregate, Context, Event, HandlerError, event_handler};
use serde::{Deserialize, Serialize};

#[derive(Aggregate)]
pub struct Order;

#[derive(Event, Serialize, Deserialize)]
#[event(part_of = Order)]
pub struct OrderPriced {
    pub order_id: String,
    pub price: f64,
}

pub struct PriceBook;

#[event_handler(part_of = Order, sequential_by = "price")]
impl PriceBook {
    #[handle]
    async fn priced(&self, _event: OrderPriced, _ctx: &Context) -> Result<(), HandlerError> {
        Ok(())
    }
}

fn main() {}
