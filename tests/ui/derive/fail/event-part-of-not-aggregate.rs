// `part_of` naming a type that is not an aggregate.
use convoy_runtime::Event;
use serde::{Deserialize, Serialize};

pub struct Order;

#[derive(Event, Serialize, Deserialize)]
#[event(part_of = Order)]
pub struct OrderPlaced {
    pub order_id: String,
}

fn main() {}
