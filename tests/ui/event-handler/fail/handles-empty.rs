// Struct form with an empty `handles = []`.
use convoy_runtime::{Aggregate, Event, event_handler};
use serde::{Deserialize, Serialize};

#[derive(Aggregate)]
pub struct Order;

#[derive(Event, Serialize, Deserialize)]
#[event(part_of = Order)]
pub struct OrderPlaced {
    pub order_id: String,
    pub client_id: String,
}

#[event_handler(part_of = Order, handles = [])]
pub struct ClientLedger;

fn main() {}
