//! Outgoing connections: one HTTP client (`http`) for everything fetched from the network, the
//! policy of which addresses it may reach (`guard`), and bodies too large to keep in memory
//! (`spill`).

pub mod guard;
pub mod http;
pub mod spill;
