// The context written before the event, and by value.
use convoy_runtime::{Aggregate, Context, Event, HandlerError, event_handler};
use serde::{Deserialize, Serialize};

#[derive(Aggregate)]
pub struct Account;

#[derive(Event, Serialize, Deserialize)]
#[event(part_of = Account)]
pub struct Debited {
    pub account_id: String,
}

pub struct Ledger;

#[event_handler(part_of = Account, sequential_by = "account_id")]
impl Ledger {
    #[handle]
    async fn on(&self, ctx: Context, e: Debited) -> Result<(), HandlerError> {
        let _ = (ctx, e);
        Ok(())
    }
}

fn main() {}
