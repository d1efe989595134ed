//! What a Redis fault schedule (`fault_schedules.rs`,
//! `cluster_fault_schedules.rs`) takes from `support/`, in one module;
//! besides `faults.rs`, which each declares at its root (so the checkers'
//! unit tests keep their names, `faults::tests::*`).
#![allow(missing_docs, unreachable_pub)]

#[path = "engine_slots.rs"]
pub mod engine_slots;
#[path = "names.rs"]
pub mod names;
#[path = "record.rs"]
pub mod record;
#[path = "schedule_dir.rs"]
pub mod schedule_dir;
#[path = "schedule_io.rs"]
pub mod schedule_io;
#[path = "schedule_run.rs"]
pub mod schedule_run;
