//! Whether an encoded image is whole: its container walked to its end marker.
//!
//! Decoders make up what a truncated file lacks rather than fail: zune-jpeg (the `image`
//! crate's JPEG decoder, in its lenient mode) paints missing scan data grey, so a JPEG cut
//! mid-scan, or right after its headers, decodes without an error. libjpeg warns of a premature
//! end and Pillow refuses ("image file is truncated"); hetmem refuses too. The walk reads
//! marker and chunk lengths only: the decoder checks what is inside them.

/// How an encoded image ends.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Ending {
    /// With its end marker (JPEG's EOI, PNG's IEND chunk); anything after it is ignored, as
    /// libjpeg and libpng do.
    Whole,
    /// Before its end marker: where the bytes run out.
    Truncated(&'static str),
    /// The walk met something it cannot step over (a corrupt length): the decoder judges.
    Unknown,
}

/// Where a JPEG ends: after its end-of-image marker (FFD9) or before.
pub(super) fn jpeg(bytes: &[u8]) -> Ending {
    const HEADERS: Ending = Ending::Truncated("in its headers, before any image data");
    const SCAN: Ending = Ending::Truncated("inside its compressed image data");
    if !bytes.starts_with(&[0xFF, 0xD8]) {
        return Ending::Unknown;
    }
    let mut at = 2;
    let mut in_scans = false;
    loop {
        // To the next marker: lenient decoders skip stray bytes between segments, and a
        // marker may follow any number of 0xFF fill bytes.
        at = bytes[at..].iter().position(|&byte| byte == 0xFF).map_or(bytes.len(), |found| at + found);
        at = bytes[at..].iter().position(|&byte| byte != 0xFF).map_or(bytes.len(), |found| at + found);
        let Some(&marker) = bytes.get(at) else {
            return if in_scans { SCAN } else { HEADERS };
        };
        at += 1;
        match marker {
            0xD9 => return Ending::Whole,
            // Markers without a length: SOI, TEM, RST0-7 (a stuffed 00 outside a scan is junk).
            0x00 | 0x01 | 0xD0..=0xD8 => continue,
            _ => {}
        }
        let Some(length) = bytes.get(at..at + 2) else {
            return if in_scans { SCAN } else { HEADERS };
        };
        let length = usize::from(u16::from_be_bytes([length[0], length[1]]));
        if length < 2 {
            return Ending::Unknown;
        }
        at += length;
        if at > bytes.len() {
            return if in_scans { SCAN } else { HEADERS };
        }
        if marker == 0xDA {
            in_scans = true;
            // The entropy-coded data runs to the next 0xFF that is neither a stuffed 00 nor a
            // restart marker (nor fill before one).
            loop {
                let Some(found) = bytes[at..].iter().position(|&byte| byte == 0xFF) else {
                    return SCAN;
                };
                at += found;
                match bytes[at + 1..].iter().find(|&&byte| byte != 0xFF) {
                    None => return SCAN,
                    Some(0x00 | 0xD0..=0xD7) => at += 2,
                    Some(_) => break,
                }
            }
        }
    }
}

/// Where a PNG ends: after its IEND chunk (with its CRC) or before.
pub(super) fn png(bytes: &[u8]) -> Ending {
    const SIGNATURE: &[u8] = b"\x89PNG\r\n\x1a\n";
    if !bytes.starts_with(SIGNATURE) {
        return Ending::Unknown;
    }
    let mut at = SIGNATURE.len();
    loop {
        let Some(header) = bytes.get(at..at + 8) else {
            return Ending::Truncated("between two chunks, before its IEND chunk");
        };
        let length = u32::from_be_bytes([header[0], header[1], header[2], header[3]]);
        let kind = &header[4..];
        // PNG caps lengths at 2^31 - 1 and names chunks with letters: anything else is
        // corruption, for the decoder to name.
        if length > 0x7FFF_FFFF || !kind.iter().all(u8::is_ascii_alphabetic) {
            return Ending::Unknown;
        }
        let end = at + 12 + length as usize;
        if end > bytes.len() {
            return Ending::Truncated(match kind {
                b"IEND" => "inside its IEND chunk",
                b"IDAT" => "inside its image data (an IDAT chunk)",
                _ => "inside a chunk, before its IEND chunk",
            });
        }
        if kind == b"IEND" {
            return Ending::Whole;
        }
        at = end;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A baseline JPEG's skeleton: SOI, a segment, SOS with entropy-coded data holding a
    /// stuffed 00 and a restart marker, EOI, then trailing bytes.
    const JPEG: &[u8] = &[
        0xFF, 0xD8, 0xFF, 0xE0, 0x00, 0x04, 0xAA, 0xBB, 0xFF, 0xDA, 0x00, 0x03, 0x01, 0x12, 0xFF, 0x00, 0x34,
        0xFF, 0xD3, 0x56, 0xFF, 0xFF, 0xD9, 0x00,
    ];

    #[test]
    fn a_jpeg_is_whole_only_with_its_end_marker() {
        assert_eq!(jpeg(JPEG), Ending::Whole);
        assert_eq!(jpeg(&JPEG[..JPEG.len() - 1]), Ending::Whole);
        for cut in 2..JPEG.len() - 1 {
            let ending = jpeg(&JPEG[..cut]);
            // The scan's data starts at byte 13, after its header.
            let want = if cut < 13 { "in its headers" } else { "inside its compressed image data" };
            assert!(matches!(ending, Ending::Truncated(at) if at.contains(want)), "cut at {cut}: {ending:?}");
        }
        // An EOI inside a segment (a thumbnail in APP1) does not end the image.
        let mut thumbnail = JPEG.to_vec();
        thumbnail.splice(2..8, [0xFF, 0xE1, 0x00, 0x04, 0xFF, 0xD9]);
        assert_eq!(jpeg(&thumbnail[..12]), Ending::Truncated("in its headers, before any image data"));
        assert_eq!(jpeg(b"not a jpeg"), Ending::Unknown);
        assert_eq!(jpeg(&[0xFF, 0xD8, 0xFF, 0xE0, 0x00, 0x01]), Ending::Unknown);
    }

    #[test]
    fn a_png_is_whole_only_with_its_iend_chunk() {
        let mut png_bytes = b"\x89PNG\r\n\x1a\n".to_vec();
        for (kind, data) in [(&b"IHDR"[..], &[0u8; 13][..]), (b"IDAT", &[1, 2, 3]), (b"IEND", &[])] {
            png_bytes.extend_from_slice(&(data.len() as u32).to_be_bytes());
            png_bytes.extend_from_slice(kind);
            png_bytes.extend_from_slice(data);
            png_bytes.extend_from_slice(&[0; 4]);
        }
        assert_eq!(png(&png_bytes), Ending::Whole);
        for cut in 8..png_bytes.len() {
            assert!(matches!(png(&png_bytes[..cut]), Ending::Truncated(_)), "cut at {cut}");
        }
        assert_eq!(png(&png_bytes[..45]), Ending::Truncated("inside its image data (an IDAT chunk)"));
        let mut corrupt = png_bytes.clone();
        corrupt[8..12].copy_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(png(&corrupt), Ending::Unknown);
    }
}
