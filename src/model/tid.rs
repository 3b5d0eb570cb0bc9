//! TIDs (timestamp identifiers): 13 characters of base32-sortable text <-> a `u64`.
//!
//! Invariants:
//! - A TID is exactly [`TID_LEN`] ASCII characters from [`TID_ALPHABET`], most significant digit
//!   first, so the text order of two TIDs equals the order of their integers.
//! - 13 digits carry 65 bits; the spec fixes the top bit of the 64-bit value at 0, so the first
//!   digit is one of `234567ab` (values 0..=7) and every TID fits in 63 bits.
//! - `parse_tid(format_tid(v)) == Some(v)` for every `v` below [`TID_TOP_BIT`], and
//!   `format_tid(parse_tid(s)?) == s` for every `s` that parses (there is one spelling per value).
//! - `parse_tid` never allocates and never panics; it runs once per ingested record key.

/// Number of characters in a TID.
pub const TID_LEN: usize = 13;

/// The base32-sortable digits, in ascending value order (`'2'` is 0, `'z'` is 31).
pub const TID_ALPHABET: &[u8; 32] = b"234567abcdefghijklmnopqrstuvwxyz";

/// The bit that is always clear in a TID's value. Record ids use it to mark outlined record keys.
pub const TID_TOP_BIT: u64 = 1 << 63;

/// Bits carried by one base32 digit.
const BITS_PER_DIGIT: u32 = 5;

/// Largest value the first digit may have: its 5 bits sit at positions 60..65, and bits 63 and
/// above must be clear, so only its low 3 bits may be set.
const MAX_FIRST_DIGIT: u8 = 0b111;

/// Marks a byte that is not a base32-sortable digit in [`DIGIT_VALUES`].
const NOT_A_DIGIT: u8 = 0xff;

/// Byte -> digit value, or [`NOT_A_DIGIT`]. A table keeps the hot loop free of branches on ranges.
const DIGIT_VALUES: [u8; 256] = build_digit_values();

const fn build_digit_values() -> [u8; 256] {
    let mut table = [NOT_A_DIGIT; 256];
    let mut value = 0;
    while value < TID_ALPHABET.len() {
        table[TID_ALPHABET[value] as usize] = value as u8;
        value += 1;
    }
    table
}

/// The value of a base32-sortable digit, or `None` for any other byte.
#[inline]
pub fn digit_value(byte: u8) -> Option<u8> {
    let value = DIGIT_VALUES[byte as usize];
    (value != NOT_A_DIGIT).then_some(value)
}

/// Parses a TID into its integer value; `None` if `s` is not a valid TID (wrong length, a byte
/// outside the alphabet, or a first digit that would set the top bit).
#[inline]
pub fn parse_tid(s: &str) -> Option<u64> {
    let digits: &[u8; TID_LEN] = s.as_bytes().try_into().ok()?;
    let first = digit_value(digits[0])?;
    if first > MAX_FIRST_DIGIT {
        return None;
    }
    let mut value = u64::from(first);
    for &byte in &digits[1..] {
        value = (value << BITS_PER_DIGIT) | u64::from(digit_value(byte)?);
    }
    Some(value)
}

/// Formats a TID value as its 13-character text.
///
/// # Panics
/// If `value` has the top bit set: such a value is not a TID (it is an outlined record key), and
/// formatting it would silently drop that bit.
pub fn format_tid(value: u64) -> String {
    assert!(value & TID_TOP_BIT == 0, "TID value {value:#x} has the top bit set");
    let mut digits = [0u8; TID_LEN];
    for (position, slot) in digits.iter_mut().enumerate() {
        let shift = BITS_PER_DIGIT * (TID_LEN - 1 - position) as u32;
        *slot = TID_ALPHABET[((value >> shift) & 0b1_1111) as usize];
    }
    // Every byte comes from the ASCII alphabet, so this conversion cannot fail.
    let text: String = digits.iter().map(|&byte| char::from(byte)).collect();
    debug_assert_eq!(parse_tid(&text), Some(value), "TID encoding does not round-trip");
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn smallest_tid_is_zero() {
        assert_eq!(parse_tid("2222222222222"), Some(0));
        assert_eq!(format_tid(0), "2222222222222");
    }

    #[test]
    fn largest_tid_is_all_63_bits() {
        assert_eq!(parse_tid("bzzzzzzzzzzzz"), Some(TID_TOP_BIT - 1));
        assert_eq!(format_tid(TID_TOP_BIT - 1), "bzzzzzzzzzzzz");
    }

    #[test]
    fn known_values() {
        assert_eq!(parse_tid("2222222222223"), Some(1));
        assert_eq!(parse_tid("222222222222z"), Some(31));
        assert_eq!(parse_tid("2222222222232"), Some(32));
        assert_eq!(parse_tid("3222222222222"), Some(1 << 60));
        // A real like record key from the Jetstream capture.
        assert_eq!(parse_tid("3mmoojp7etg2g"), Some(0x194a_947d_4aac_b00c));
    }

    #[test]
    fn rejects_non_tids() {
        for bad in [
            "",
            "222222222222",   // 12 characters
            "22222222222222", // 14 characters
            "c222222222222",  // first digit 8: top bit set
            "zzzzzzzzzzzzz",
            "3JZFCIJPJ2Z2A", // the alphabet is lowercase only
            "0000000000000",
            "3jzfcijpj2z21", // '1' is not a digit
            "3jzf-cij-pj2z",
            "3jzfcijpj2z2é", // multi-byte: 14 bytes
        ] {
            assert_eq!(parse_tid(bad), None, "{bad:?} must not parse");
        }
    }

    #[test]
    #[should_panic(expected = "top bit")]
    fn formatting_a_top_bit_value_panics() {
        format_tid(TID_TOP_BIT);
    }

    #[test]
    fn text_order_is_value_order() {
        let values = [0, 1, 31, 32, 1 << 40, (1 << 60) + 5, TID_TOP_BIT - 1];
        for pair in values.windows(2) {
            assert!(format_tid(pair[0]) < format_tid(pair[1]));
        }
    }

    proptest! {
        #[test]
        fn value_round_trips(value in 0..TID_TOP_BIT) {
            let text = format_tid(value);
            prop_assert_eq!(text.len(), TID_LEN);
            prop_assert_eq!(parse_tid(&text), Some(value));
        }

        #[test]
        fn text_round_trips(first in 0usize..=7, rest in proptest::collection::vec(0usize..32, TID_LEN - 1)) {
            let mut text = String::new();
            text.push(char::from(TID_ALPHABET[first]));
            text.extend(rest.iter().map(|&digit| char::from(TID_ALPHABET[digit])));
            let value = parse_tid(&text).expect("a text built from the alphabet parses");
            prop_assert_eq!(format_tid(value), text);
        }

        #[test]
        fn arbitrary_text_never_panics(text in "\\PC{0,20}") {
            if let Some(value) = parse_tid(&text) {
                prop_assert_eq!(format_tid(value), text);
            }
        }
    }
}
