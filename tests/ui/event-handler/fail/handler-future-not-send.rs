// A handler future that is not `Send` (it holds an `Rc` across an await).
use std::rc::Rc;

use convoy_runtime::{Aggregate, Context, Event, HandlerError, event_handler};
use serde::{Deserialize, Serialize};

#[derive(Aggregate)]
pub struct Order;

#[derive(Event, Serialize, Deserialize)]
#[event(part_of = Order)]
pub struct OrderPlaced {
    pub order_id: String,
    pub client_id: String,
}

pub struct ClientLedger;

async fn audit() {}

#[event_handler(part_of = Order, sequential_by = "client_id")]
impl ClientLedger {
    #[handle]
    async fn placed(&self, event: OrderPlaced, _ctx: &Context) -> Result<(), HandlerError> {
        let local = Rc::new(event.client_id);
        audit().await;
        drop(local);
        Ok(())
    }
}

fn main() {}
