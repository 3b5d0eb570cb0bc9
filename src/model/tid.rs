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
//! - `gather(spread(v)) == v` and `spread(gather(v)) == v` for every `u64` (a bijection that
//!   keeps the top bit), so a table may store any record key spread.

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

/// Microseconds whose milliseconds fit in 43 bits; later times use `spread`'s spare codes.
const SPREAD_PLAIN_TIMES: u64 = 1000 << 43;
/// Microsecond rests 1000..1024 never occur for plain times: they carry the late ones.
const SPREAD_SPARE_RESTS: u64 = 1024 - 1000;

/// Splits a TID's time into milliseconds and the microsecond rest, in fields of their own:
/// `(ms << 20) | (rest << 10) | clock id`. A TID is `(µs << 10) | clock id`, and the network's
/// are made from a millisecond clock (rest mostly 0..10) with one of 32 clock ids, so spread
/// values of one table share more high bits and keep the low ones mostly zero: the table's
/// XOR-delta columns compress better (docs/format.md, payload encoding 2).
///
/// A bijection on all of `u64`. Values with the top bit set (outlined record keys) are left as
/// they are. Times from `1000 << 43` µs on (about the year 2248; TIDs end near 2255, and a
/// record key is the author's choice) would need a 44th millisecond bit; they use the rests
/// 1000..1023 instead, so the result keeps the top bit clear.
pub fn spread(value: u64) -> u64 {
    if value & TID_TOP_BIT != 0 {
        return value;
    }
    let (time, clock) = (value >> 10, value & 1023);
    let (ms, rest) = match time.checked_sub(SPREAD_PLAIN_TIMES) {
        None => (time / 1000, time % 1000),
        Some(late) => (late / SPREAD_SPARE_RESTS, 1000 + late % SPREAD_SPARE_RESTS),
    };
    debug_assert!(ms < 1 << 43 && rest < 1024);
    (ms << 20) | (rest << 10) | clock
}

/// The inverse of `spread`.
pub fn gather(value: u64) -> u64 {
    if value & TID_TOP_BIT != 0 {
        return value;
    }
    let (ms, rest, clock) = (value >> 20, (value >> 10) & 1023, value & 1023);
    let time = match rest {
        0..1000 => ms * 1000 + rest,
        _ => SPREAD_PLAIN_TIMES + ms * SPREAD_SPARE_RESTS + (rest - 1000),
    };
    (time << 10) | clock
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn spread_splits_milliseconds_rest_and_clock_id() {
        let tid = parse_tid("3mmoojp7etg2g").unwrap();
        let (time, clock) = (tid >> 10, tid & 1023);
        assert_eq!(spread(tid), ((time / 1000) << 20) | ((time % 1000) << 10) | clock);
        assert_eq!(spread((1_700_000_000_123_000 << 10) | 7), (1_700_000_000_123 << 20) | 7);
        // The edges: outlined keys, the last plain time, the first and the last late ones.
        let last_plain = ((SPREAD_PLAIN_TIMES - 1) << 10) | 1023;
        assert_eq!(spread(last_plain), (((1 << 43) - 1) << 20) | (999 << 10) | 1023);
        assert_eq!(spread(SPREAD_PLAIN_TIMES << 10), 1000 << 10);
        assert_eq!(spread(TID_TOP_BIT - 1), TID_TOP_BIT - 1);
        for value in [0, TID_TOP_BIT, u64::MAX, last_plain, SPREAD_PLAIN_TIMES << 10, TID_TOP_BIT - 1] {
            assert_eq!(gather(spread(value)), value, "{value:#x}");
        }
    }

    proptest! {
        #[test]
        fn spread_is_a_bijection_that_keeps_the_top_bit(value: u64) {
            prop_assert_eq!(gather(spread(value)), value);
            prop_assert_eq!(spread(gather(value)), value);
            prop_assert_eq!(spread(value) & TID_TOP_BIT, value & TID_TOP_BIT);
        }
    }

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
