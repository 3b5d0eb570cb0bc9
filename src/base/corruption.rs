//! How a reader that met a corrupt object reports it: one error-level log line naming the object,
//! and a counter by kind and place (`backlinks_corrupt_objects_total{kind, place}` in `/metrics`).
//! The reader then fails with an error that names the object; nothing corrupt is ever served.
//!
//! Invariants:
//! - The counters only grow, and their labels come from the fixed `ObjectKind` x `Place` set.

use std::fmt::Display;
use std::sync::atomic::{AtomicU64, Ordering};

/// The kinds of checksummed object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ObjectKind {
    Data,
    Meta,
    Manifest,
    Outline,
    /// An account log's snapshot or change range.
    Accounts,
}

/// Where the corrupt copy was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Place {
    Bucket,
    /// The local data directory (a meta, or the cached copy of a data file).
    Local,
}

impl ObjectKind {
    pub const ALL: [ObjectKind; 5] =
        [ObjectKind::Data, ObjectKind::Meta, ObjectKind::Manifest, ObjectKind::Outline, ObjectKind::Accounts];

    pub fn label(self) -> &'static str {
        match self {
            ObjectKind::Data => "data",
            ObjectKind::Meta => "meta",
            ObjectKind::Manifest => "manifest",
            ObjectKind::Outline => "outline",
            ObjectKind::Accounts => "accounts",
        }
    }
}

impl Place {
    pub const ALL: [Place; 2] = [Place::Bucket, Place::Local];

    pub fn label(self) -> &'static str {
        match self {
            Place::Bucket => "bucket",
            Place::Local => "local",
        }
    }
}

/// Corrupt objects met by readers of this process, by kind and place.
static CORRUPT_OBJECTS: [[AtomicU64; 2]; ObjectKind::ALL.len()] =
    [const { [const { AtomicU64::new(0) }; 2] }; ObjectKind::ALL.len()];

fn counter(kind: ObjectKind, place: Place) -> &'static AtomicU64 {
    let kind = ObjectKind::ALL.iter().position(|k| *k == kind).expect("every kind is in ALL");
    let place = Place::ALL.iter().position(|p| *p == place).expect("every place is in ALL");
    &CORRUPT_OBJECTS[kind][place]
}

/// Logs and counts a corrupt object a reader met. The caller still fails with an error naming it.
pub fn report_corruption(kind: ObjectKind, place: Place, object: &str, detail: &dyn Display) {
    counter(kind, place).fetch_add(1, Ordering::Relaxed);
    tracing::error!(kind = kind.label(), place = place.label(), object, %detail, "corrupt object: checksum or format check failed");
}

/// How many corrupt objects of `kind` at `place` readers of this process met.
pub fn corrupt_objects(kind: ObjectKind, place: Place) -> u64 {
    counter(kind, place).load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_are_counted_by_kind_and_place() {
        let before = corrupt_objects(ObjectKind::Outline, Place::Local);
        report_corruption(ObjectKind::Outline, Place::Local, "outlines/did/x", &"test");
        assert_eq!(corrupt_objects(ObjectKind::Outline, Place::Local), before + 1);
    }
}
