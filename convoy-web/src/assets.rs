//! The stylesheet and the one script, embedded in the binary.

/// `app.css`.
pub(crate) const CSS: &str = include_str!("../assets/app.css");

/// `app.js`: refreshes the live parts of a page on server-sent events.
pub(crate) const JS: &str = include_str!("../assets/app.js");
