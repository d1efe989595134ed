// `sequential_by = false` and no arguments at all: both unpartitioned.
use convoy_runtime::{Aggregate, Event, HandlerError, ProcessManager, process_manager};
use serde::{Deserialize, Serialize};

#[derive(Aggregate)]
pub struct Order;

#[derive(Event, Serialize, Deserialize)]
#[event(part_of = Order)]
pub struct OrderPlaced {
    pub order_id: String,
    pub total: u64,
}

#[derive(Default, Serialize, Deserialize)]
pub struct Revenue {
    total: u64,
}

#[process_manager(sequential_by = false)]
impl Revenue {
    #[handle(start, correlate = "order_id")]
    async fn placed(&mut self, event: OrderPlaced) -> Result<(), HandlerError> {
        self.total += event.total;
        Ok(())
    }
}

#[derive(Default, Serialize, Deserialize)]
pub struct Audit {
    seen: u32,
}

#[process_manager]
impl Audit {
    // Neither `start` nor `end`.
    #[handle(correlate = "order_id")]
    async fn placed(&mut self, _event: OrderPlaced) -> Result<(), HandlerError> {
        self.seen += 1;
        Ok(())
    }
}

#[derive(Default, Serialize, Deserialize)]
pub struct OneShot {
    done: bool,
}

#[process_manager()]
impl OneShot {
    // Both: the instance lives for one event.
    #[handle(start, end, correlate = "order_id")]
    async fn placed(&mut self, _event: OrderPlaced) -> Result<(), HandlerError> {
        self.done = true;
        Ok(())
    }
}

fn main() {
    assert!(!Revenue::DESCRIPTOR.sequential);
    assert!(!Audit::DESCRIPTOR.sequential);
    assert!(!OneShot::DESCRIPTOR.sequential);
    let h = &Audit::DESCRIPTOR.handles[0];
    assert!(!h.start && !h.end);
    let h = &OneShot::DESCRIPTOR.handles[0];
    assert!(h.start && h.end);
    let name = Revenue::DESCRIPTOR.name;
    assert!(name.ends_with("::Revenue"), "{name}");
}
