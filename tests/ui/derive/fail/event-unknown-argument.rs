// A misspelt argument of `#[event(..)]` gets a suggestion.
use convoy_runtime::{Aggregate, Event};
use serde::{Deserialize, Serialize};

#[derive(Aggregate)]
pub struct Order;

#[derive(Event, Serialize, Deserialize)]
#[event(part_of = Order, nmae = "Placed")]
pub struct OrderPlaced {
    pub order_id: String,
}

fn main() {}
