// Messages cannot be generic.
use convoy_runtime::{Aggregate, Event};
use serde::{Deserialize, Serialize};

#[derive(Aggregate)]
pub struct Order;

#[derive(Event, Serialize, Deserialize)]
#[event(part_of = Order)]
pub struct OrderPlaced<T> {
    pub order_id: T,
}

fn main() {}
