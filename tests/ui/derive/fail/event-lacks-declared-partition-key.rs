// An aggregate that declares its partition key requires the field on every
// event that is part of it: a writer routes each event by it.
use convoy_runtime::{Aggregate, Event};
use serde::{Deserialize, Serialize};

#[derive(Aggregate)]
#[aggregate(category = "stock", partition_key = "sku")]
pub struct Stock;

#[derive(Event, Serialize, Deserialize)]
#[event(part_of = Stock)]
pub struct StockAdjusted {
    pub sku: String,
    pub delta: i64,
}

#[derive(Event, Serialize, Deserialize)]
#[event(part_of = Stock)]
pub struct StockCounted {
    pub warehouse: String,
    pub count: u64,
}

fn main() {}
