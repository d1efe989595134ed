// `reply` is for commands; an event is published, not answered.
use convoy_runtime::{Aggregate, Event};
use serde::{Deserialize, Serialize};

#[derive(Aggregate)]
pub struct Order;

#[derive(Event, Serialize, Deserialize)]
#[event(part_of = Order, reply = String)]
pub struct OrderPlaced {
    pub order_id: String,
}

fn main() {}
