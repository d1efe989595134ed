// A handled type that is a plain serde struct, not an event.
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

#[derive(Serialize, Deserialize)]
pub struct AuditLine {
    pub client_id: String,
}

pub struct ClientLedger;

#[event_handler(part_of = Order)]
impl ClientLedger {
    #[handle]
    async fn placed(&self, _event: OrderPlaced, _ctx: &Context) -> Result<(), HandlerError> {
        Ok(())
    }

    #[handle]
    async fn audited(&self, _line: AuditLine, _ctx: &Context) -> Result<(), HandlerError> {
        Ok(())
    }
}

fn main() {}
