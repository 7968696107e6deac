//! Property tests of the two readers of untrusted bytes, the Y4M reader and the image decode
//! path: arbitrary bytes, and valid files with bytes flipped, inserted or deleted
//! and the sizes in their headers changed to zero or huge values, never panic, and never
//! allocate more than the pixel cap allows.
//!
//! The allocations are watched, not inferred: this test binary's global allocator notes the
//! largest request made on a watched thread (the reader's: the ring's slots, the filter's
//! frame and the decoders' buffers are all allocated there), whoever asks for it, `image`,
//! zune-jpeg or hetmem. A request far beyond anything legitimate is refused outright, so that
//! a missing check fails the test (an infallible allocation then aborts it, naming the size)
//! instead of taking the machine's memory.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::io;
use std::sync::OnceLock;

use hetmem::ops::gaussian::{Border, FrameFormat, Gaussian, PixelLayout, SampleType};
use hetmem::{BackendChoice, BackendKind, Device};
use proptest::prelude::*;

use hetmem_media::image::{ImageKind, Opened};
use hetmem_media::{Budget, Endpoint, FrameSink, Named, y4m};

use super::{Job, Kind, kind_of_content, video};

#[path = "../../tests/filter/png_crc.rs"]
mod png_crc;
use png_crc::png_crc;

/// The cap the readers work under here: 64 x 64, more than the valid files need, small
/// enough that a header declaring a little more than the cap shows in the allocations.
const MAX_PIXELS: u64 = 1 << 12;
/// The largest allocation the cap allows: 16 bytes per pixel (no pixel type takes more: RGBA
/// floats) plus 256 KiB for fixed buffers (the 64 KiB reader and writer buffers, the
/// decoders' tables and windows).
const ALLOWANCE: usize = 16 * MAX_PIXELS as usize + (256 << 10);
/// Requests above this are refused while watching: no reader has a reason to make them.
const REFUSED_ABOVE: usize = 256 << 20;

struct Watched;

#[global_allocator]
static ALLOCATOR: Watched = Watched;

thread_local! {
    /// While this thread is watched: the largest request it has made.
    static LARGEST: Cell<Option<usize>> = const { Cell::new(None) };
}

impl Watched {
    /// Notes a request for `size` bytes; whether to grant it.
    fn grant(size: usize) -> bool {
        // `try_with`: allocations happen while a thread's locals are torn down too. The
        // local is a const-initialised `Cell` without a destructor, so reading it allocates
        // nothing.
        LARGEST
            .try_with(|largest| match largest.get() {
                Some(seen) => {
                    largest.set(Some(seen.max(size)));
                    size <= REFUSED_ABOVE
                }
                None => true,
            })
            .unwrap_or(true)
    }
}

// SAFETY: each method hands the caller's arguments, unchanged, to the system allocator, or
// returns null, which `GlobalAlloc` allows for a failed allocation; the bookkeeping touches a
// thread-local `Cell` and allocates nothing, so it cannot recurse.
unsafe impl GlobalAlloc for Watched {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !Watched::grant(layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's layout, with the caller's guarantees (a non-zero size).
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if !Watched::grant(layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator, which is the system's, with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if !Watched::grant(new_size) {
            return std::ptr::null_mut();
        }
        // SAFETY: `ptr` came from the system allocator with `layout`; `new_size` is the
        // caller's, with the caller's guarantees.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Ends the watch, even when the watched code panics.
struct Watch;

impl Drop for Watch {
    fn drop(&mut self) {
        LARGEST.with(|largest| largest.set(None));
    }
}

/// Runs `f` watched: what it returned, and the largest allocation it asked for.
fn largest_allocation<T>(f: impl FnOnce() -> T) -> (T, usize) {
    LARGEST.with(|largest| largest.set(Some(0)));
    let watch = Watch;
    let result = f();
    let largest = LARGEST.with(Cell::get).unwrap_or(0);
    drop(watch);
    (result, largest)
}

fn budget() -> Budget {
    Budget::new(MAX_PIXELS)
}

/// The Y4M reader on `bytes`, as `hetmem filter - -` runs it, into a sink: the largest
/// allocation it made. Whether it succeeds does not matter; that it neither panics nor
/// over-allocates does.
fn y4m_reads(bytes: &[u8], budget: Budget) -> (anyhow::Result<()>, usize) {
    let device = Device::open(BackendChoice::Only(BackendKind::Cpu)).unwrap();
    let kernel = Gaussian::new(None, None, Border::Reflect101).unwrap();
    let (input, output) = (Endpoint::Std, Endpoint::Std);
    let job = Job {
        device: &device,
        strategy: hetmem::Strategy::Cpu,
        strategy_chosen: true,
        kernel: &kernel,
        kernel_args: (None, None, Border::Reflect101),
        input: Named { endpoint: &input, std_name: "stdin" },
        output: Named { endpoint: &output, std_name: "stdout" },
        budget,
        retries: 0,
        ui: crate::ui::Ui { quiet: true },
        outputs: crate::outputs::Outputs { overwrite: false },
        started: std::time::Instant::now(),
        opening_the_device: std::time::Duration::ZERO,
    };
    largest_allocation(|| {
        let sink = || -> anyhow::Result<FrameSink> { Ok(FrameSink::stream(Box::new(io::sink()))) };
        let mut reader = bytes;
        let video = y4m::read_header(&mut reader, &job.input.to_string())?;
        video::filter(&job, video, reader, Some(bytes.len() as u64), sink).map(drop)
    })
}

/// The image path on `bytes` read as `kind`, as `hetmem filter` runs it: the header, the
/// budget, then the pixels into a frame the size the header declares (the filter's memory).
fn image_reads(bytes: &[u8], kind: ImageKind, budget: Budget) -> (anyhow::Result<()>, usize) {
    largest_allocation(|| {
        let image = Opened::new(bytes, kind, "input", &budget)?;
        // Fallible, so that a frame the budget should have refused fails the test, not the
        // process.
        let mut pixels = Vec::new();
        pixels.try_reserve_exact(image.frame().frame_bytes())?;
        pixels.resize(image.frame().frame_bytes(), 0);
        image.read_into(&mut pixels)
    })
}

/// Every reader on `bytes`: the Y4M reader, and the image path as each format (the CLI picks
/// one by content, else by extension, so any of them may meet any bytes).
fn check_every_reader(bytes: &[u8]) -> Result<(), TestCaseError> {
    let (_, largest) = y4m_reads(bytes, budget());
    prop_assert!(largest <= ALLOWANCE, "the Y4M reader asked for {largest} bytes");
    for kind in [ImageKind::Png, ImageKind::Jpeg, ImageKind::Pnm] {
        let (_, largest) = image_reads(bytes, kind, budget());
        prop_assert!(largest <= ALLOWANCE, "the {} path asked for {largest} bytes", kind.name());
    }
    Ok(())
}

/// Bytes that look like pixels but are not constant.
fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 37 % 251) as u8).collect()
}

/// Small valid files of every format the readers take.
fn valid_files() -> &'static [Vec<u8>] {
    static FILES: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    FILES.get_or_init(|| {
        let format = FrameFormat::new(16, 8, PixelLayout::Yuv420).unwrap();
        let mut y4m = b"YUV4MPEG2 W16 H8 F25:1 Ip A1:1 C420jpeg\n".to_vec();
        for _ in 0..2 {
            y4m.extend_from_slice(b"FRAME\n");
            y4m.extend(pattern(format.frame_bytes()));
        }
        let encode = |format: image::ImageFormat, image: image::DynamicImage| {
            let mut file = io::Cursor::new(Vec::new());
            image.write_to(&mut file, format).unwrap();
            file.into_inner()
        };
        let rgb = image::DynamicImage::from(image::RgbImage::from_raw(12, 10, pattern(360)).unwrap());
        let rgba = image::DynamicImage::from(image::RgbaImage::from_raw(12, 10, pattern(480)).unwrap());
        let gray = image::DynamicImage::from(image::GrayImage::from_raw(12, 10, pattern(120)).unwrap());
        // 16-bit samples: 10-bit video, a 16-bit RGBA PNG and a 16-bit PGM.
        let deep = FrameFormat::new(16, 8, PixelLayout::Yuv420).unwrap().with_sample(SampleType::U16);
        let mut y4m_10_bit = b"YUV4MPEG2 W16 H8 F25:1 Ip A1:1 C420p10 XYSCSS=420P10\n".to_vec();
        y4m_10_bit.extend_from_slice(b"FRAME\n");
        y4m_10_bit.extend(pattern(deep.frame_bytes()));
        let samples = |len: usize| -> Vec<u16> { (0..len).map(|i| (i * 7919 % 65521) as u16).collect() };
        let rgba16 = image::DynamicImage::from(
            image::ImageBuffer::<image::Rgba<u16>, _>::from_raw(12, 10, samples(480)).unwrap(),
        );
        let gray16 = image::DynamicImage::from(
            image::ImageBuffer::<image::Luma<u16>, _>::from_raw(12, 10, samples(120)).unwrap(),
        );
        vec![
            y4m,
            encode(image::ImageFormat::Png, rgb.clone()),
            encode(image::ImageFormat::Png, rgba),
            encode(image::ImageFormat::Jpeg, rgb.clone()),
            encode(image::ImageFormat::Jpeg, gray.clone()),
            encode(image::ImageFormat::Pnm, rgb),
            encode(image::ImageFormat::Pnm, gray),
            [&b"P7\nWIDTH 3\nHEIGHT 2\nDEPTH 4\nMAXVAL 255\nTUPLTYPE RGB_ALPHA\nENDHDR\n"[..], &pattern(24)]
                .concat(),
            [&b"P3\n2 2\n255\n"[..], b"1 2 3 4 5 6 7 8 9 10 11 12\n"].concat(),
            y4m_10_bit,
            encode(image::ImageFormat::Png, rgba16),
            encode(image::ImageFormat::Pnm, gray16),
        ]
    })
}

/// A change to a valid file.
#[derive(Debug, Clone)]
enum Mutation {
    Flip {
        at: usize,
        bit: u8,
    },
    Insert {
        at: usize,
        byte: u8,
    },
    Delete {
        at: usize,
    },
    Truncate {
        at: usize,
    },
    /// The `which`-th decimal number of the header (a Y4M or PNM header's sizes, after its
    /// magic number) becomes `value`.
    Number {
        which: usize,
        value: u64,
    },
    /// A PNG's IHDR declares another size, its CRC made right so the decoder believes it.
    PngSize {
        width: u32,
        height: u32,
    },
    /// A JPEG's frame header (SOF) declares another size.
    JpegSize {
        width: u16,
        height: u16,
    },
}

/// Sizes that break naive readers: zero, one, the edges of 16 and 32 bits, and beyond.
fn size() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(1),
        Just(65_535),
        Just(65_536),
        Just(65_537),
        Just(u64::from(u32::MAX)),
        Just(u64::MAX),
        Just(99_999_999_999_999_999),
        0..100_000u64,
    ]
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), 0..8u8).prop_map(|(at, bit)| Mutation::Flip { at, bit }),
        (any::<usize>(), any::<u8>()).prop_map(|(at, byte)| Mutation::Insert { at, byte }),
        any::<usize>().prop_map(|at| Mutation::Delete { at }),
        any::<usize>().prop_map(|at| Mutation::Truncate { at }),
        (0..4usize, size()).prop_map(|(which, value)| Mutation::Number { which, value }),
        (size(), size()).prop_map(|(w, h)| Mutation::PngSize { width: w as u32, height: h as u32 }),
        (size(), size()).prop_map(|(w, h)| Mutation::JpegSize { width: w as u16, height: h as u16 }),
    ]
}

fn mutate(bytes: &mut Vec<u8>, mutation: &Mutation) {
    let len = bytes.len().max(1);
    match *mutation {
        Mutation::Flip { at, bit } if !bytes.is_empty() => bytes[at % len] ^= 1 << bit,
        Mutation::Insert { at, byte } => bytes.insert(at % (bytes.len() + 1), byte),
        Mutation::Delete { at } if !bytes.is_empty() => {
            bytes.remove(at % len);
        }
        Mutation::Truncate { at } => bytes.truncate(at % len),
        Mutation::Number { which, value } => {
            let head = &bytes[..bytes.len().min(80)];
            let mut numbers = Vec::new();
            // After the magic number (`YUV4MPEG2`, `P6`): its digits are no size.
            let mut at = head.iter().position(u8::is_ascii_whitespace).unwrap_or(head.len());
            while at < head.len() {
                let digits = head[at..].iter().take_while(|byte| byte.is_ascii_digit()).count();
                if digits > 0 {
                    numbers.push(at..at + digits);
                }
                at += digits.max(1);
            }
            if let Some(range) = numbers.get(which).cloned() {
                drop(bytes.splice(range, value.to_string().into_bytes()));
            }
        }
        Mutation::PngSize { width, height } if bytes.starts_with(b"\x89PNG") && bytes.len() >= 33 => {
            bytes[16..20].copy_from_slice(&width.to_be_bytes());
            bytes[20..24].copy_from_slice(&height.to_be_bytes());
            let crc = png_crc(&bytes[12..29]);
            bytes[29..33].copy_from_slice(&crc.to_be_bytes());
        }
        Mutation::JpegSize { width, height } => {
            // SOF0 to SOF2: FF C0..C2, length, precision, then height and width.
            if let Some(sof) =
                bytes.windows(2).position(|pair| pair[0] == 0xFF && (0xC0..=0xC2).contains(&pair[1]))
                && sof + 9 <= bytes.len()
            {
                bytes[sof + 5..sof + 7].copy_from_slice(&height.to_be_bytes());
                bytes[sof + 7..sof + 9].copy_from_slice(&width.to_be_bytes());
            }
        }
        _ => {}
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Any bytes, often behind a format's magic number so that they reach past the first
    /// check.
    #[test]
    fn arbitrary_bytes_never_panic_or_allocate_beyond_the_cap(
        magic in prop::sample::select(vec![
            &b""[..], b"YUV4MPEG2 ", b"\x89PNG\r\n\x1a\n", b"\xFF\xD8\xFF", b"P6\n", b"P5 ", b"P7\n", b"P1\n",
        ]),
        rest in prop::collection::vec(any::<u8>(), 0..2048),
    ) {
        check_every_reader(&[magic, &rest[..]].concat())?;
    }

    /// Valid files whose header declares another size: zero, huge, or a little beyond the cap.
    #[test]
    fn declared_sizes_never_allocate_beyond_the_cap(
        file in 0..valid_files().len(),
        which in 0..3usize,
        value in size(),
        png_width in size(),
        jpeg_height in size(),
    ) {
        let mut bytes = valid_files()[file].clone();
        mutate(&mut bytes, &Mutation::Number { which, value });
        mutate(&mut bytes, &Mutation::PngSize { width: png_width as u32, height: value as u32 });
        mutate(&mut bytes, &Mutation::JpegSize { width: value as u16, height: jpeg_height as u16 });
        check_every_reader(&bytes)?;
    }

    /// Valid files, changed in one to four places.
    #[test]
    fn mutated_files_never_panic_or_allocate_beyond_the_cap(
        file in 0..valid_files().len(),
        mutations in prop::collection::vec(mutation(), 1..4),
    ) {
        let mut bytes = valid_files()[file].clone();
        for mutation in &mutations {
            mutate(&mut bytes, mutation);
        }
        check_every_reader(&bytes)?;
    }
}

/// The readers take what they should (so the properties are not met by refusing
/// everything), and the watch sees the ring's slots: lifted above the allowance, a stream's
/// allocation is caught.
#[test]
fn the_readers_take_valid_files_and_the_watch_sees_their_allocations() {
    for bytes in valid_files() {
        let bytes = &bytes[..];
        match kind_of_content(bytes) {
            Some(Kind::Video) => y4m_reads(bytes, budget()).0.unwrap(),
            Some(Kind::Image(kind)) => image_reads(bytes, kind, budget()).0.unwrap(),
            None => panic!("{:?}: not recognised", &bytes[..8]),
        }
    }
    let large = b"YUV4MPEG2 W2048 H2048 Cmono\n";
    let (refused, largest) = y4m_reads(large, budget());
    let message = refused.unwrap_err().to_string();
    assert!(message.contains("2048x2048") && message.contains("--max-pixels"), "{message}");
    assert!(largest <= ALLOWANCE, "{largest}");
    let lifted = Budget::new(1 << 22);
    let (_, largest) = y4m_reads(large, lifted);
    assert!(largest >= 2048 * 2048, "the watch missed the ring's slots: {largest}");
    // An image's frame, the filter's memory (here the test's stand-in for it), is allocated
    // only after its header passed the budget.
    let mut png = valid_files()[1].clone();
    mutate(&mut png, &Mutation::PngSize { width: 1024, height: 1024 });
    let (_, largest) = image_reads(&png, ImageKind::Png, lifted);
    assert!(largest >= 3 * 1024 * 1024, "{largest}");
    let (refused, largest) = image_reads(&png, ImageKind::Png, budget());
    assert!(refused.unwrap_err().to_string().contains("1024x1024"));
    assert!(largest <= ALLOWANCE, "{largest}");
}
