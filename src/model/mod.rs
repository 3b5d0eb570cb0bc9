//! Identifiers and atproto syntax: fixed-width ids, TIDs, and string validation.

pub mod ids;
pub mod syntax;
pub mod tid;
