// A state with an `Option<String>` field, and `correlate` fields of every
// key kind: `String`, `u64`, `Option<String>` (where `None` correlates to no
// instance) and a user newtype implementing `PartitionKey`.
use convoy_runtime::{
    Aggregate, Envelope, Event, HandlerError, PartitionKey, Priority, ProcessManager,
    process_manager,
};
use serde::{Deserialize, Serialize};

#[derive(Aggregate)]
pub struct Order;

#[derive(Aggregate)]
pub struct Invoice;

#[derive(Aggregate)]
pub struct Shipment;

#[derive(Aggregate)]
pub struct Account;

#[derive(Event, Serialize, Deserialize)]
#[event(part_of = Order)]
pub struct OrderPlaced {
    pub order_id: String,
    pub note: Option<String>,
}

#[derive(Event, Serialize, Deserialize)]
#[event(part_of = Invoice)]
pub struct InvoiceIssued {
    pub order_no: u64,
}

#[derive(Event, Serialize, Deserialize)]
#[event(part_of = Shipment)]
pub struct ShipmentBooked {
    pub order: Option<String>,
}

#[derive(Serialize, Deserialize)]
pub struct OrderRef(String);

impl PartitionKey for OrderRef {
    fn to_partition_key(&self) -> Option<String> {
        Some(self.0.clone())
    }
}

#[derive(Event, Serialize, Deserialize)]
#[event(part_of = Account)]
pub struct AccountCharged {
    pub r#ref: OrderRef,
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Billing {
    order_id: String,
    note: Option<String>,
    invoice: Option<u64>,
}

#[process_manager(sequential_by = true)]
impl Billing {
    #[handle(start, correlate = "order_id")]
    async fn placed(&mut self, event: OrderPlaced) -> Result<(), HandlerError> {
        self.order_id = event.order_id;
        self.note = event.note;
        Ok(())
    }

    #[handle(correlate = "order_no")]
    async fn issued(&mut self, event: InvoiceIssued) -> Result<(), HandlerError> {
        self.invoice = Some(event.order_no);
        Ok(())
    }

    #[handle(correlate = "order")]
    async fn booked(&mut self, _event: ShipmentBooked) -> Result<(), HandlerError> {
        Ok(())
    }

    #[handle(end, correlate = "ref")]
    async fn charged(&mut self, _event: AccountCharged) -> Result<(), HandlerError> {
        Ok(())
    }
}

fn correlation<E: Event>(event: &E) -> Option<String> {
    let envelope = Envelope::wrap(event, None, Priority::Normal, None).expect("wraps");
    Billing::correlation(&envelope).expect("decodes")
}

fn main() {
    let placed = OrderPlaced {
        order_id: "o-1".into(),
        note: None,
    };
    assert_eq!(correlation(&placed).as_deref(), Some("o-1"));
    assert_eq!(
        correlation(&InvoiceIssued { order_no: 7 }).as_deref(),
        Some("7")
    );
    assert_eq!(
        correlation(&ShipmentBooked {
            order: Some("o-2".into())
        })
        .as_deref(),
        Some("o-2")
    );
    assert_eq!(correlation(&ShipmentBooked { order: None }), None);
    assert_eq!(
        correlation(&AccountCharged {
            r#ref: OrderRef("o-3".into())
        })
        .as_deref(),
        Some("o-3")
    );
    let correlates: Vec<_> = Billing::DESCRIPTOR
        .handles
        .iter()
        .map(|h| h.correlate)
        .collect();
    assert_eq!(correlates, ["order_id", "order_no", "order", "ref"]);
    let state: Billing = serde_json::from_str(r#"{"order_id":"o-1","note":null,"invoice":null}"#)
        .expect("state round trip");
    assert_eq!(state.note, None);
}
