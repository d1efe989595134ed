// Command handlers, in both forms; `sequential_by` is accepted (and
// checked) on them; a command declared with `reply = T` is answered with a
// `T`, and handlers may be given a stable `name`.
use std::sync::Arc;

use convoy_runtime::__private::{Dispatched, HandlerKind};
use convoy_runtime::envelope::Priority;
use convoy_runtime::key::KeyPolicy;
use convoy_runtime::{
    Aggregate, Command, CommandHandler, Context, Envelope, Handle, HandlerError, command_handler,
};
use serde::{Deserialize, Serialize};

#[derive(Aggregate)]
pub struct Order;

#[derive(Command, Serialize, Deserialize)]
#[command(part_of = Order)]
pub struct PlaceOrder {
    pub order_id: String,
    pub client_id: String,
}

#[derive(Command, Serialize, Deserialize)]
#[command(part_of = Order, name = "CancelOrder")]
pub struct CancelOrderV2 {
    pub order_id: String,
    pub client_id: String,
}

#[derive(Command, Serialize, Deserialize)]
#[command(part_of = Order, reply = u64)]
pub struct CountOrders {
    pub client_id: String,
}

pub struct Orders;

pub struct Counter;

#[command_handler(part_of = Order, name = "order-counter")]
impl Counter {
    #[handle]
    async fn count(&self, command: CountOrders) -> Result<u64, HandlerError> {
        Ok(command.client_id.len() as u64)
    }
}

#[command_handler(part_of = Order, sequential_by = "client_id")]
impl Orders {
    #[handle]
    async fn place(&self, command: PlaceOrder, ctx: &Context) -> Result<(), HandlerError> {
        assert_eq!(ctx.message_type(), "PlaceOrder");
        if command.order_id.is_empty() {
            return Err("an order needs an id".into());
        }
        Ok(())
    }
}

#[command_handler(part_of = Order, handles = [CancelOrderV2])]
pub struct Cancellations;

impl Handle<CancelOrderV2> for Cancellations {
    async fn handle(&self, command: CancelOrderV2, _ctx: &Context) -> Result<(), HandlerError> {
        let _ = command;
        Ok(())
    }
}

fn run<H: CommandHandler, C: Command>(handler: &H, command: &C) -> Result<Dispatched, HandlerError> {
    let envelope = Envelope::wrap(command, None, Priority::Normal, None).unwrap();
    let ctx = Context::new(handler.descriptor().name, &envelope, 1, Arc::new(KeyPolicy::default()));
    futures::executor::block_on(handler.dispatch(&envelope, &ctx))
}

fn main() {
    let d = Orders.descriptor();
    assert_eq!(d.kind, HandlerKind::Command);
    assert_eq!(d.sequential_by, Some("client_id"));
    assert_eq!(Cancellations.descriptor().handles[0].type_name, "CancelOrder");

    let place = PlaceOrder { order_id: "o-1".into(), client_id: "c-1".into() };
    assert_eq!(run(&Orders, &place).unwrap(), Dispatched::Handled);
    let bad = PlaceOrder { order_id: String::new(), client_id: "c-1".into() };
    assert_eq!(run(&Orders, &bad).unwrap_err().to_string(), "an order needs an id");
    let cancel = CancelOrderV2 { order_id: "o-1".into(), client_id: "c-1".into() };
    assert_eq!(run(&Orders, &cancel).unwrap(), Dispatched::NotHandled);
    assert_eq!(run(&Cancellations, &cancel).unwrap(), Dispatched::Handled);
    assert_eq!(Counter.descriptor().name, "order-counter");
    let count = CountOrders { client_id: "c-12".into() };
    assert_eq!(run(&Counter, &count).unwrap(), Dispatched::Handled);
}
