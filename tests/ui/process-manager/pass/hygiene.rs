// The generated code does not depend on the user's names: arguments called
// `envelope` and `ctx`, constants called `field`, `message`, `event`,
// `result` or `__CONVOY_EVENT_0`, and types called `Result`, `Option`,
// `Box`, `Some`, `None`, `Ok`, `Err`, `Envelope`, `Context`, `Send`, `Sync`,
// `String` or `__CONVOY_DESCRIPTOR`, or a module called `core`, change
// nothing. The state types are named through a module path, the macro is
// renamed on import, and one `correlate` field is a keyword.
#![allow(non_upper_case_globals, non_camel_case_types, dead_code)]

use convoy_runtime::{Aggregate, Event, HandlerError, process_manager as saga};
use serde::{Deserialize, Serialize};

const field: u8 = 0;
const message: u8 = 0;
const event: u8 = 0;
const result: u8 = 0;
const __CONVOY_EVENT_0: u8 = 0;
pub struct __CONVOY_DESCRIPTOR;

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
    pub field: u64,
    pub r#type: u8,
}

#[derive(Event, Serialize, Deserialize)]
#[event(part_of = Order)]
pub struct OrderShipped {
    pub order_id: std::string::String,
}

pub mod sagas {
    #[derive(Default, serde::Serialize, serde::Deserialize)]
    pub struct Fulfilment {
        pub seen: u8,
    }

    #[derive(Default, serde::Serialize, serde::Deserialize)]
    pub struct Typed {}
}

#[saga(sequential_by = true)]
impl sagas::Fulfilment {
    #[handle(start, correlate = "field")]
    async fn placed(&mut self, envelope: OrderPlaced, ctx: &convoy_runtime::Context) -> Result<()> {
        let _ = (envelope, ctx, String);
        self.seen += 1;
        Result::Ok(())
    }

    #[handle(end, correlate = "order_id")]
    async fn shipped(&mut self, shipped: OrderShipped) -> Result<()> {
        let _ = shipped;
        Result::Ok(())
    }
}

#[saga]
impl sagas::Typed {
    #[handle(correlate = "type")]
    async fn typed(&mut self, _e: OrderPlaced) -> Result<()> {
        Result::Ok(())
    }
}

fn main() {}
