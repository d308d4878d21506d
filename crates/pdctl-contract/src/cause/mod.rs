//! Every failure pdctl knows, as one enum. The human sentence, the stable `cause_code` (JSON
//! summary, record, metric label), the `kind` (gate / config / access / busy), the exit code and
//! the HTTP status of a control-API error are all derived from a [`Cause`] by exhaustive `match`es
//! below — nothing anywhere matches the text of a message.

mod class;
mod durations;
mod examples;
mod list;
mod sentence;

pub use durations::{dur, outage};
pub use list::*;
