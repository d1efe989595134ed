// `#[derive(Event)]` without `#[event(part_of = ...)]`.
use convoy_runtime::Event;
use serde::{Deserialize, Serialize};

#[derive(Event, Serialize, Deserialize)]
pub struct OrderPlaced {
    pub order_id: String,
}

fn main() {}
