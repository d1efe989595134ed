// An argument of `#[command(..)]` given twice.
use convoy_runtime::{Aggregate, Command};
use serde::{Deserialize, Serialize};

#[derive(Aggregate)]
pub struct Order;

#[derive(Command, Serialize, Deserialize)]
#[command(part_of = Order, part_of = Order)]
pub struct PlaceOrder {
    pub order_id: String,
}

fn main() {}
