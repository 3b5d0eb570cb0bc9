//! Lowercase hex, for the opaque cursors the query endpoints hand out and take back.
//!
//! Invariants:
//! - `decode(encode(b)) == Some(b)`; `decode` takes hex digits only (either case), in pairs, so
//!   a sign or any other character is refused rather than parsed.

/// Two lowercase hex digits per byte.
pub fn encode(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The bytes of a text of hex digit pairs; `None` for anything else.
pub fn decode(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    (0..text.len()).step_by(2).map(|at| u8::from_str_radix(&text[at..at + 2], 16).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_round_trip_and_anything_but_digit_pairs_is_refused() {
        let bytes = [0u8, 1, 0x7f, 0x80, 0xff];
        assert_eq!(encode(&bytes), "00017f80ff");
        assert_eq!(decode("00017F80ff"), Some(bytes.to_vec()));
        assert_eq!(decode(""), Some(vec![]));
        for bad in ["0", "+1", "0g", "é0", " 00"] {
            assert_eq!(decode(bad), None, "{bad:?}");
        }
    }
}
