// Messages need named fields.
use convoy_runtime::{Aggregate, Event};
use serde::{Deserialize, Serialize};

#[derive(Aggregate)]
pub struct Order;

#[derive(Event, Serialize, Deserialize)]
#[event(part_of = Order)]
pub struct OrderPlaced(pub String);

fn main() {}
