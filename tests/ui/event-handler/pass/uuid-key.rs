// A `uuid::Uuid` key field (and an `Option` of one), rendered hyphenated and
// lowercase.
use convoy_runtime::{Aggregate, Context, Event, HandlerError, Message, event_handler};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

#[derive(Aggregate)]
pub struct Account;

#[derive(Event, Serialize, Deserialize)]
#[event(part_of = Account)]
pub struct Debited {
    pub account_id: Uuid,
    pub previous: Option<Uuid>,
}

pub struct Ledger;

#[event_handler(part_of = Account, sequential_by = "account_id")]
impl Ledger {
    #[handle]
    async fn debited(&self, event: Debited, ctx: &Context) -> Result<(), HandlerError> {
        let _ = (event, ctx);
        Ok(())
    }
}

fn main() {
    let id = Uuid::from_u128(0x67E5_5044_10B1_426F_9247_BB68_0E5F_E0C8);
    let debited = Debited { account_id: id, previous: None };
    assert_eq!(
        debited.partition_key("account_id"),
        Some(Some("67e55044-10b1-426f-9247-bb680e5fe0c8".to_owned()))
    );
    assert_eq!(debited.partition_key("previous"), Some(None));
}
