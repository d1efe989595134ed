// Messages travel as JSON: they need serde's derives.
use convoy_runtime::{Aggregate, Event};

#[derive(Aggregate)]
pub struct Order;

#[derive(Event)]
#[event(part_of = Order)]
pub struct OrderPlaced {
    pub order_id: String,
}

fn main() {}
