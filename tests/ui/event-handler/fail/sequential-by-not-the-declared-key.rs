// A handler's `sequential_by` must name the key its category's aggregate
// declares: a category has one key.
use convoy_runtime::{Aggregate, Context, Event, HandlerError, event_handler};
use serde::{Deserialize, Serialize};

#[derive(Aggregate)]
#[aggregate(category = "stock", partition_key = "sku")]
pub struct Stock;

#[derive(Event, Serialize, Deserialize)]
#[event(part_of = Stock)]
pub struct StockAdjusted {
    pub sku: String,
    pub warehouse: String,
    pub delta: i64,
}

pub struct History;

#[event_handler(part_of = Stock, sequential_by = "warehouse")]
impl History {
    #[handle]
    async fn adjusted(&self, _e: StockAdjusted, _ctx: &Context) -> Result<(), HandlerError> {
        Ok(())
    }
}

fn main() {}
