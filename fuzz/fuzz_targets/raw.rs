//! The raw video reader (`hetmem filter --raw WxH:pix_fmt`): the first five bytes give the
//! command line's width, height (16 bits each, little-endian) and pixel format, the rest is
//! the stream.
#![no_main]

libfuzzer_sys::fuzz_target!(|bytes: &[u8]| {
    let Some((head, stream)) = bytes.split_first_chunk::<5>() else { return };
    let width = usize::from(u16::from_le_bytes([head[0], head[1]]));
    let height = usize::from(u16::from_le_bytes([head[2], head[3]]));
    let _ = hetmem_media::fuzzing::raw(width, height, head[4], stream);
});
