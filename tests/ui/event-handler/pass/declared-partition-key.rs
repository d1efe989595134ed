// A category's partition key declared on its aggregate: every event carries
// it, a handler may repeat it in `sequential_by` or leave it out (it is
// partitioned by the declaration either way), and a process that links no
// handler routes by it.
use convoy_runtime::{Aggregate, Context, Domain, Event, HandlerError, event_handler};
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

pub struct History;

#[event_handler(part_of = Stock, sequential_by = "sku")]
impl History {
    #[handle]
    async fn adjusted(&self, _e: StockAdjusted, _ctx: &Context) -> Result<(), HandlerError> {
        Ok(())
    }
}

pub struct Audit;

#[event_handler(part_of = Stock)]
impl Audit {
    #[handle]
    async fn adjusted(&self, _e: StockAdjusted) -> Result<(), HandlerError> {
        Ok(())
    }
}

fn main() {
    // A writer: no handler, no discovery; the key comes from the aggregate.
    let domain = Domain::builder().without_discovery().init().expect("init");
    let mut uow = domain.unit_of_work();
    uow.raise(StockAdjusted { sku: "s-1".into(), delta: 3 }).expect("raise");
    assert_eq!(uow.len(), 1);
    let err = uow
        .raise(StockAdjusted { sku: "a:b".into(), delta: 1 })
        .expect_err("the declared key's rules apply at raise");
    assert!(err.to_string().contains("sku"), "{err}");
}
