// The fulfilment process manager across two aggregates (`order` correlated
// by `order_id`, `payment` by `order_ref`), with and without `ctx`, with a
// user error type; `correlation` and `dispatch` driven by hand.
use std::fmt;
use std::sync::Arc;

use convoy_runtime::key::KeyPolicy;
use convoy_runtime::{
    Aggregate, Context, Envelope, Event, HandlerError, Priority, ProcessManager, process_manager,
};
use serde::{Deserialize, Serialize};

#[derive(Aggregate)]
pub struct Order;

#[derive(Aggregate)]
pub struct Payment;

#[derive(Event, Serialize, Deserialize)]
#[event(part_of = Order)]
pub struct OrderPlaced {
    pub order_id: String,
    pub client_id: String,
    pub total: u64,
}

#[derive(Event, Serialize, Deserialize)]
#[event(part_of = Payment)]
pub struct PaymentCaptured {
    pub payment_id: String,
    pub order_ref: String,
    pub amount: u64,
}

#[derive(Event, Serialize, Deserialize)]
#[event(part_of = Order)]
pub struct OrderShipped {
    pub order_id: String,
    pub carrier: String,
}

#[derive(Event, Serialize, Deserialize)]
#[event(part_of = Order)]
pub struct OrderCancelled {
    pub order_id: String,
}

#[derive(Debug)]
pub struct NotPaid;

impl fmt::Display for NotPaid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("shipped before payment")
    }
}

impl std::error::Error for NotPaid {}

#[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Fulfilment {
    order_id: String,
    paid: bool,
    shipped: bool,
}

#[process_manager(sequential_by = true)]
impl Fulfilment {
    #[handle(start, correlate = "order_id")]
    async fn placed(&mut self, e: OrderPlaced, ctx: &Context) -> Result<(), HandlerError> {
        assert_eq!(ctx.message_type(), "OrderPlaced");
        self.order_id = e.order_id;
        Ok(())
    }

    #[handle(correlate = "order_ref")]
    async fn paid(&mut self, e: PaymentCaptured) -> Result<(), HandlerError> {
        assert_eq!(e.order_ref, self.order_id);
        self.paid = true;
        Ok(())
    }

    #[handle(end, correlate = "order_id")]
    async fn shipped(&mut self, _e: OrderShipped, _ctx: &Context) -> Result<(), NotPaid> {
        if !self.paid {
            return Err(NotPaid);
        }
        self.shipped = true;
        Ok(())
    }

    // Not a handler: left alone.
    fn done(&self) -> bool {
        self.paid && self.shipped
    }
}

fn envelope<E: Event>(event: &E) -> Envelope {
    Envelope::wrap(event, None, Priority::Normal, None).expect("wraps")
}

fn main() {
    let d = Fulfilment::DESCRIPTOR;
    assert!(d.name.ends_with("::Fulfilment"), "{}", d.name);
    assert!(d.sequential);
    let handles: Vec<_> = d
        .handles
        .iter()
        .map(|h| {
            (
                h.message.type_name,
                h.message.category,
                h.correlate,
                h.start,
                h.end,
            )
        })
        .collect();
    assert_eq!(
        handles,
        [
            ("OrderPlaced", "order", "order_id", true, false),
            ("PaymentCaptured", "payment", "order_ref", false, false),
            ("OrderShipped", "order", "order_id", false, true),
        ]
    );
    let registered: Vec<_> = convoy_runtime::__private::inventory::iter::<
        convoy_runtime::process_manager::ProcessManagerRegistration,
    >()
    .map(|r| r.0.name)
    .collect();
    assert_eq!(registered, [d.name]);

    let placed = envelope(&OrderPlaced {
        order_id: "o-1".into(),
        client_id: "c-1".into(),
        total: 3,
    });
    let paid = envelope(&PaymentCaptured {
        payment_id: "p-1".into(),
        order_ref: "o-1".into(),
        amount: 3,
    });
    let shipped = envelope(&OrderShipped {
        order_id: "o-1".into(),
        carrier: "post".into(),
    });
    let cancelled = envelope(&OrderCancelled {
        order_id: "o-1".into(),
    });
    for e in [&placed, &paid, &shipped] {
        assert_eq!(
            Fulfilment::correlation(e).expect("decodes").as_deref(),
            Some("o-1")
        );
    }
    assert_eq!(
        Fulfilment::correlation(&cancelled).expect("not handled"),
        None
    );

    let policy = Arc::new(KeyPolicy::default());
    let ctx = |e: &Envelope| Context::new(d.name, e, 1, policy.clone());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        use convoy_runtime::handler::Dispatched;

        let mut state = Fulfilment::default();
        let outcome = state
            .dispatch(&placed, &ctx(&placed))
            .await
            .expect("placed");
        assert_eq!(outcome, Dispatched::Handled);
        let err = state
            .dispatch(&shipped, &ctx(&shipped))
            .await
            .expect_err("not paid yet");
        assert_eq!(err.to_string(), "shipped before payment");
        state.dispatch(&paid, &ctx(&paid)).await.expect("paid");
        state
            .dispatch(&shipped, &ctx(&shipped))
            .await
            .expect("shipped");
        let outcome = state
            .dispatch(&cancelled, &ctx(&cancelled))
            .await
            .expect("ignored");
        assert_eq!(outcome, Dispatched::NotHandled);
        assert!(state.done());
        assert_eq!(
            state,
            Fulfilment {
                order_id: "o-1".into(),
                paid: true,
                shipped: true
            }
        );
    });
}
