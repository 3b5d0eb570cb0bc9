//! The data model at the bottom of the crate: fixed-width ids, TIDs, atproto string syntax, and
//! the operations an event asks of the index.

pub mod account;
pub mod account_states;
pub mod ids;
pub mod operation;
pub mod syntax;
pub mod tid;
