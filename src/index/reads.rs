//! Where a flush waits for its reads of the trees (the tallies read tables: `tally`): flushes
//! run on plain threads, inside a runtime's blocking task, or in a test's runtime.
//!
//! Invariants:
//! - On a thread of a multi-threaded runtime the wait moves the runtime's work elsewhere first
//!   (`block_in_place`); on a current-thread runtime's thread the future is polled right there
//!   (its reads are blocking tasks, which complete without that thread); on any other thread it
//!   runs on the runtime the index was opened in, else on one of the index's own.
//! - The index's own runtime is only made when needed, and shut down without waiting.

use std::future::Future;
use std::sync::OnceLock;
use tokio::runtime::{Handle, Runtime, RuntimeFlavor};

#[derive(Debug)]
pub(super) struct Reads {
    opened_in: Option<Handle>,
    own: OnceLock<Runtime>,
}

impl Reads {
    /// Remembers the runtime the caller is in, if any.
    pub fn here() -> Self {
        Reads { opened_in: Handle::try_current().ok(), own: OnceLock::new() }
    }

    pub fn block_on<F: Future>(&self, future: F) -> F::Output {
        if let Ok(current) = Handle::try_current() {
            return match current.runtime_flavor() {
                RuntimeFlavor::CurrentThread => futures::executor::block_on(future),
                _ => tokio::task::block_in_place(|| current.block_on(future)),
            };
        }
        match &self.opened_in {
            Some(handle) => handle.block_on(future),
            None => self.own().block_on(future),
        }
    }

    fn own(&self) -> &Runtime {
        self.own.get_or_init(|| {
            tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime for a flush's reads")
        })
    }
}

impl Drop for Reads {
    fn drop(&mut self) {
        if let Some(runtime) = self.own.take() {
            runtime.shutdown_background();
        }
    }
}
