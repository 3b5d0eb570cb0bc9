//! The bottom layer: small helpers that every other module may use and that import nothing else
//! of the crate.
//!
//! - `rng`: the seeded generator behind every injected randomness (table ids, jitter, tests);
//! - `clock`: the injected wall clock, and the system one that only the binary passes in;
//! - `durable`: whole-file writes that survive a crash (write, fsync, rename, fsync the directory);
//! - `dates`: proleptic Gregorian day arithmetic for the wire's timestamps;
//! - `drop_flag`: a flag that a scope raises unless it ends well;
//! - `positions`: an open-addressing hash index of positions into a caller's vector;
//! - `corruption`: how a reader that met a failed checksum logs and counts it;
//! - `redact`: credentials inside URLs, hidden wherever a URL is shown;
//! - `priority`: threads that yield the CPU to ingest;
//! - `hex`: the digits of opaque cursors.

pub mod clock;
pub mod corruption;
pub mod dates;
pub mod drop_flag;
pub mod durable;
pub mod hex;
pub mod positions;
pub mod priority;
pub mod redact;
pub mod rng;
