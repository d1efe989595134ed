// The generated code does not depend on the user's names: arguments called
// `envelope` and `ctx`, constants called `field`, `message`, `event` or
// `result` (which would capture a binding of that name), and types called
// `Result`, `Option`, `Box`, `Some`, `None`, `Ok`, `Err`, `Envelope`,
// `Context`, `Send`, `Sync` or `String`, or a module called `core`, change
// nothing.
#![allow(non_upper_case_globals, non_camel_case_types, dead_code)]

use convoy_runtime::{Aggregate, Event, HandlerError, event_handler};
use serde::{Deserialize, Serialize};

const field: u8 = 0;
const message: u8 = 0;
const event: u8 = 0;
const result: u8 = 0;

pub struct Option;
pub struct Box;
pub struct Envelope;
pub struct Context;
pub struct Send;
pub struct Sync;
pub struct Some;
pub struct None;
pub struct Ok;
pub struct Err;
pub struct __CONVOY_DESCRIPTOR;
type Result<T> = std::result::Result<T, HandlerError>;

mod core {}
mod std_like {
    pub struct String;
}
use std_like::String;

#[derive(Aggregate)]
pub struct Order;

#[derive(Event, Serialize, Deserialize)]
#[event(part_of = Order)]
pub struct OrderPlaced {
    pub order_id: std::string::String,
    pub client_id: u64,
    pub field: u64,
    pub r#type: u8,
}

pub struct ClientLedger;

#[event_handler(part_of = Order, sequential_by = "client_id")]
impl ClientLedger {
    #[handle]
    async fn placed(&self, envelope: OrderPlaced, ctx: &convoy_runtime::Context) -> Result<()> {
        let _ = (envelope, ctx, String);
        Result::Ok(())
    }
}

fn main() {}
