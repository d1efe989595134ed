// `partition_key` names one field of the aggregate's events, as a string.
use convoy_runtime::Aggregate;

#[derive(Aggregate)]
#[aggregate(category = "stock", partition_key = "sku.id")]
pub struct Stock;

fn main() {}
