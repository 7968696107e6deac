//! PNG's CRC-32 (ISO 3309, as zlib's), for tests that make a PNG header declare another
//! size and still be believed. Shared with the unit tests of `src/filter`
//! (untrusted_input_tests.rs) by `#[path]`.

/// The CRC of a chunk's type and data.
pub fn png_crc(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &byte in bytes {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 { (crc >> 1) ^ 0xEDB8_8320 } else { crc >> 1 };
        }
    }
    !crc
}

#[test]
fn the_crc_of_iend_is_the_one_every_png_ends_with() {
    assert_eq!(png_crc(b"IEND"), 0xAE42_6082);
}
