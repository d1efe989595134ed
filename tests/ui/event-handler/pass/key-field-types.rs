// Key fields of every accepted kind: `String`, `u64`, `Option<String>` and a
// user newtype implementing `PartitionKey`.
use convoy_runtime::{Aggregate, Context, Event, HandlerError, Message, PartitionKey, event_handler};
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
    pub client_id: String,
    pub total: f64,
}

#[derive(Event, Serialize, Deserialize)]
#[event(part_of = Invoice)]
pub struct InvoiceIssued {
    pub invoice_no: u64,
}

#[derive(Event, Serialize, Deserialize)]
#[event(part_of = Shipment)]
pub struct ShipmentBooked {
    pub carrier: Option<String>,
}

#[derive(Serialize, Deserialize)]
pub struct AccountId(String);

impl PartitionKey for AccountId {
    fn to_partition_key(&self) -> Option<String> {
        Some(format!("acc-{}", self.0))
    }
}

#[derive(Event, Serialize, Deserialize)]
#[event(part_of = Account)]
pub struct AccountOpened {
    pub account: AccountId,
}

pub struct Ledger;
pub struct Billing;
pub struct Dispatch;
pub struct Accounts;

#[event_handler(part_of = Order, sequential_by = "client_id")]
impl Ledger {
    #[handle]
    async fn placed(&self, event: OrderPlaced, ctx: &Context) -> Result<(), HandlerError> {
        let _ = (event, ctx);
        Ok(())
    }
}

#[event_handler(part_of = Invoice, sequential_by = "invoice_no")]
impl Billing {
    #[handle]
    async fn issued(&self, event: InvoiceIssued, ctx: &Context) -> Result<(), HandlerError> {
        let _ = (event, ctx);
        Ok(())
    }
}

#[event_handler(part_of = Shipment, sequential_by = "carrier")]
impl Dispatch {
    #[handle]
    async fn booked(&self, event: ShipmentBooked, ctx: &Context) -> Result<(), HandlerError> {
        let _ = (event, ctx);
        Ok(())
    }
}

#[event_handler(part_of = Account, sequential_by = "account")]
impl Accounts {
    #[handle]
    async fn opened(&self, event: AccountOpened, ctx: &Context) -> Result<(), HandlerError> {
        let _ = (event, ctx);
        Ok(())
    }
}

fn main() {
    let placed = OrderPlaced { client_id: "c-1".into(), total: 1.5 };
    assert_eq!(placed.partition_key("client_id"), Some(Some("c-1".to_owned())));
    assert_eq!(placed.partition_key("total"), None, "f64 is not a key type");
    assert_eq!(placed.partition_key("nope"), None);

    let issued = InvoiceIssued { invoice_no: 42 };
    assert_eq!(issued.partition_key("invoice_no"), Some(Some("42".to_owned())));

    let booked = ShipmentBooked { carrier: None };
    assert_eq!(booked.partition_key("carrier"), Some(None), "None is the null key");

    let opened = AccountOpened { account: AccountId("7".into()) };
    assert_eq!(opened.partition_key("account"), Some(Some("acc-7".to_owned())));
}
