//! Object storage: a trait and its implementations.

pub mod dir;
pub mod object;
