//! `did:plc` DIDs packed into 15 bytes: the 24 base32 characters after `did:plc:`, 5 bits each,
//! first character in the top bits of a 120-bit big-endian number. Outline ranges store them so
//! (docs/format.md "Outline range"), and the outline cache keeps them so: written out, a DID is
//! 32 bytes, and nearly every account of the network has one.
//!
//! Invariants:
//! - Lossless both ways: `pack` takes exactly `did:plc:` followed by 24 characters of `a-z2-7`
//!   (anything else is `None`) and `unpack(pack(v)) == v`; every 15 bytes unpack to such a DID.

/// Bytes of a packed DID.
pub const PACKED_LEN: usize = 15;
/// Bytes of the DID written out.
pub const TEXT_LEN: usize = PREFIX.len() + CHARS;

const PREFIX: &str = "did:plc:";
const CHARS: usize = 24;
const BASE32: &[u8; 32] = b"abcdefghijklmnopqrstuvwxyz234567";

pub type Packed = [u8; PACKED_LEN];

/// The DID's 15 packed bytes, or `None` for any value that is not a `did:plc` DID.
pub fn pack(value: &str) -> Option<Packed> {
    let chars = value.strip_prefix(PREFIX).filter(|rest| rest.len() == CHARS)?;
    let mut bits = 0u128;
    for c in chars.bytes() {
        bits = bits << 5 | u128::from(digit(c)?);
    }
    Some(bits.to_be_bytes()[16 - PACKED_LEN..].try_into().expect("15 bytes"))
}

fn digit(c: u8) -> Option<u8> {
    match c {
        b'a'..=b'z' => Some(c - b'a'),
        b'2'..=b'7' => Some(c - b'2' + 26),
        _ => None,
    }
}

/// The DID written out, without allocating.
#[derive(Clone, Copy)]
pub struct Text([u8; TEXT_LEN]);

impl Text {
    pub fn unpack(packed: &Packed) -> Self {
        let mut word = [0u8; 16];
        word[16 - PACKED_LEN..].copy_from_slice(packed);
        let bits = u128::from_be_bytes(word);
        let mut text = [0u8; TEXT_LEN];
        text[..PREFIX.len()].copy_from_slice(PREFIX.as_bytes());
        for (i, c) in text[PREFIX.len()..].iter_mut().enumerate() {
            *c = BASE32[(bits >> (5 * (CHARS - 1 - i))) as usize & 31];
        }
        Self(text)
    }

    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.0).expect("an unpacked DID is ASCII")
    }
}

/// `Text::unpack` as a `String`.
pub fn unpack(packed: &Packed) -> String {
    Text::unpack(packed).as_str().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn packs_exactly_the_plc_dids() {
        for value in
            ["did:plc:vfnmgxg2yscfliemmcxzyfyh", "did:plc:aaaaaaaaaaaaaaaaaaaaaaaa", "did:plc:777777777777777777777777"]
        {
            let packed = pack(value).unwrap();
            assert_eq!(unpack(&packed), value);
        }
        assert_eq!(pack("did:plc:aaaaaaaaaaaaaaaaaaaaaaab").unwrap(), {
            let mut packed = [0u8; PACKED_LEN];
            packed[PACKED_LEN - 1] = 1;
            packed
        });
        for value in [
            "did:plc:vfnmgxg2yscfliemmcxzyfy",
            "did:plc:vfnmgxg2yscfliemmcxzyfyhh",
            "did:plc:vfnmgxg2yscfliemmcxzyfy1",
            "did:plc:VFNMGXG2YSCFLIEMMCXZYFYH",
            "did:web:vfnmgxg2yscfliemmcxzyfyh",
            "did:plc:vfnmgxg2yscfliemmcxzyf{h",
            "did:plc:",
            "",
        ] {
            assert!(pack(value).is_none(), "{value}");
        }
    }

    proptest! {
        #[test]
        fn every_packed_value_unpacks_to_a_did_that_packs_back(packed in any::<[u8; PACKED_LEN]>()) {
            let text = unpack(&packed);
            prop_assert_eq!(text.len(), TEXT_LEN);
            prop_assert_eq!(pack(&text), Some(packed));
        }

        #[test]
        fn pack_takes_only_the_plc_alphabet(chars in "[a-z0-9A-Z]{24}") {
            let value = format!("did:plc:{chars}");
            let in_alphabet = chars.bytes().all(|c| BASE32.contains(&c));
            prop_assert_eq!(pack(&value).is_some(), in_alphabet);
            if let Some(packed) = pack(&value) {
                prop_assert_eq!(unpack(&packed), value);
            }
        }
    }
}
