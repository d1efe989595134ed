//! convoy runtime.
#[cfg(feature = "testing")]
pub mod testing;
