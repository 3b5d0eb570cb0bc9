//! A flag raised by a scope that did not end well: `SetOnDrop` sets it when dropped unless it was
//! disarmed, so an early return, an error or a panic all leave the flag set.

use std::sync::atomic::{AtomicBool, Ordering};

/// Sets its flag when dropped, unless disarmed first: however a scope ends (an error, a panic),
/// the flag says it did not end well.
pub struct SetOnDrop<'a>(Option<&'a AtomicBool>);

impl<'a> SetOnDrop<'a> {
    pub fn new(flag: &'a AtomicBool) -> Self {
        SetOnDrop(Some(flag))
    }

    pub fn disarm(&mut self) {
        self.0 = None;
    }
}

impl Drop for SetOnDrop<'_> {
    fn drop(&mut self) {
        if let Some(flag) = self.0 {
            flag.store(true, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flag_is_set_unless_disarmed() {
        let flag = AtomicBool::new(false);
        let mut guard = SetOnDrop::new(&flag);
        guard.disarm();
        drop(guard);
        assert!(!flag.load(Ordering::Acquire));
        drop(SetOnDrop::new(&flag));
        assert!(flag.load(Ordering::Acquire));
    }
}
