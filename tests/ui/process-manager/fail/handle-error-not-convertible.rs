// A `#[handle]` method whose error type does not convert into `HandlerError`.
use convoy_runtime::{Aggregate, Context, Event, HandlerError, process_manager};
use serde::{Deserialize, Serialize};

#[derive(Aggregate)]
pub struct Order;

#[derive(Aggregate)]
pub struct Payment;

#[derive(Event, Serialize, Deserialize)]
#[event(part_of = Order)]
pub struct OrderPlaced {
    pub order_id: String,
    pub total: u64,
}

#[derive(Event, Serialize, Deserialize)]
#[event(part_of = Payment)]
pub struct PaymentCaptured {
    pub payment_id: String,
    pub order_ref: String,
}

#[derive(Debug)]
pub struct PaymentFault;

#[derive(Default, Serialize, Deserialize)]
pub struct Fulfilment {
    order_id: String,
    paid: bool,
}

#[process_manager(sequential_by = true)]
impl Fulfilment {
    #[handle(start, correlate = "order_id")]
    async fn placed(&mut self, event: OrderPlaced, _ctx: &Context) -> Result<(), HandlerError> {
        self.order_id = event.order_id;
        Ok(())
    }

    #[handle(correlate = "order_ref")]
    async fn paid(&mut self, _event: PaymentCaptured) -> Result<(), PaymentFault> {
        self.paid = true;
        Err(PaymentFault)
    }
}

fn main() {}
