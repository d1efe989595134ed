// A handler `part_of = Account` handling an event of `Order`.
use convoy_runtime::{Aggregate, Event, HandlerError, event_handler};
use serde::{Deserialize, Serialize};

#[derive(Aggregate)]
pub struct Account;

#[derive(Aggregate)]
pub struct Order;

#[derive(Event, Serialize, Deserialize)]
#[event(part_of = Account)]
pub struct Debited {
    pub account_id: String,
}

#[derive(Event, Serialize, Deserialize)]
#[event(part_of = Order)]
pub struct OrderPlaced {
    pub account_id: String,
}

pub struct Ledger;

#[event_handler(part_of = Account, sequential_by = "account_id")]
impl Ledger {
    #[handle]
    async fn debited(&self, _event: Debited) -> Result<(), HandlerError> {
        Ok(())
    }

    #[handle]
    async fn placed(&self, _event: OrderPlaced) -> Result<(), HandlerError> {
        Ok(())
    }
}

fn main() {}
