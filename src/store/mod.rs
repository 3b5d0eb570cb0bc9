//! Object storage: a trait and its implementations.

pub mod dir;
pub mod faulty;
pub mod object;
pub mod pinned;
pub mod s3;
