//! 9- to 16-bit video (Y4M `C420p10`, `C422p12`, `C444p16`, `Cmono10`) and 16-bit
//! images (PNG, PNM) go through the same path as 8-bit ones, as 16-bit little-endian samples:
//! never narrowed, headers kept byte for byte, every sample equal to hetmem's CPU path, the
//! budget counting two bytes a sample.

use hetmem::ops::gaussian::SampleType;
use image::{ImageBuffer, Luma, LumaA, Rgb, Rgba};

use super::*;

/// `count` random samples of `bits` bits (the low bits of 16-bit words, as 10-bit video holds
/// them), never all equal.
fn random_samples(count: usize, bits: u32) -> Vec<u16> {
    let bytes = random_bytes(2 * count.max(16));
    let samples: Vec<u16> =
        bytes.chunks_exact(2).map(|pair| u16::from_le_bytes([pair[0], pair[1]]) >> (16 - bits)).collect();
    assert!(samples.iter().any(|&v| v != samples[0]), "random samples came out constant");
    samples[..count].to_vec()
}

/// Samples as the frame's bytes: little-endian.
fn le_bytes(samples: &[u16]) -> Vec<u8> {
    samples.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn samples_of(bytes: &[u8]) -> Vec<u16> {
    bytes.chunks_exact(2).map(|pair| u16::from_le_bytes([pair[0], pair[1]])).collect()
}

/// Two frames' bytes equal, or the first 16-bit sample that differs.
fn assert_same(got: &[u8], want: &[u8], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    if let Some(at) = got.chunks_exact(2).zip(want.chunks_exact(2)).position(|(g, w)| g != w) {
        let (got, want) = (samples_of(got)[at], samples_of(want)[at]);
        panic!("{what}: sample {at} is {got}, the CPU path gives {want}");
    }
}

/// A `width` x `height` frame of `layout` in 16-bit samples.
fn wide(layout: PixelLayout, width: u32, height: u32) -> FrameFormat {
    FrameFormat::new(width as usize, height as usize, layout).unwrap().with_sample(SampleType::U16)
}

/// A random 16-bit frame of `format` holding `bits`-bit samples.
fn random_frame(format: FrameFormat, bits: u32) -> Vec<u8> {
    le_bytes(&random_samples(format.frame_bytes() / 2, bits))
}

#[test]
fn a_10_bit_y4m_stream_is_filtered_end_to_end_like_the_cpu_path() {
    let (width, height) = (33, 17);
    let format = wide(PixelLayout::Yuv420, width, height);
    assert_eq!(format.frame_bytes(), 2 * (33 * 17 + 2 * 17 * 9));
    let frames: Vec<Vec<u8>> = (0..3).map(|_| random_frame(format, 10)).collect();
    // As ffmpeg writes it (`-pix_fmt yuv420p10le -f yuv4mpegpipe -strict -1`).
    let header = "YUV4MPEG2 W33 H17 F30000:1001 Ip A1:1 C420p10 XYSCSS=420P10\n";
    let dir = TempDir::new("y4m-10-bit");
    let report = dir.path("report.json");
    let run = hetmem_with_stdin(&["filter", "-", "-", "--report", text(&report)], y4m(header, &frames));
    assert!(run.status.success(), "{}", stderr(&run));
    assert_y4m_result(&run.stdout, header, format, &default_kernel(), &frames);
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&report).unwrap()).expect("JSON in the report");
    assert_eq!((summary["frames"].as_u64(), summary["sample"].as_str()), (Some(3), Some("u16")));
    assert_eq!(summary["format"], "Y4M C420p10");
    // Still 10-bit: a blur never exceeds its largest input.
    let out = &run.stdout[header.len()..];
    let frame_out = &out[6..6 + format.frame_bytes()];
    assert!(samples_of(frame_out).iter().all(|&v| v < 1024));

    // The same from a file into a file, with another kernel and border.
    let (input, output) = (dir.path("in.y4m"), dir.path("out.y4m"));
    std::fs::write(&input, y4m(header, &frames)).unwrap();
    let run = hetmem(&["filter", text(&input), text(&output), "--radius", "5", "--border", "replicate"]);
    assert!(run.status.success(), "{}", stderr(&run));
    assert!(stderr(&run).contains("Y4M C420p10"), "{}", stderr(&run));
    let kernel = Gaussian::new(Some(5), None, Border::Replicate).unwrap();
    assert_y4m_result(&std::fs::read(&output).unwrap(), header, format, &kernel, &frames);
}

#[test]
fn every_deep_y4m_colour_space_is_filtered_plane_by_plane() {
    let dir = TempDir::new("y4m-deep");
    for (space, layout, bits) in [
        ("C420p9", PixelLayout::Yuv420, 9),
        ("C422p10", PixelLayout::Yuv422, 10),
        ("C444p12", PixelLayout::Yuv444, 12),
        ("C420p16", PixelLayout::Yuv420, 16),
        ("Cmono10", PixelLayout::Gray, 10),
        ("Cmono16", PixelLayout::Gray, 16),
    ] {
        let format = wide(layout, 21, 10);
        let frames: Vec<Vec<u8>> = (0..2).map(|_| random_frame(format, bits)).collect();
        filter_y4m_file_and_check(&dir, space, format, &frames);
    }
}

/// A 10-bit frame is twice the bytes of an 8-bit one: the budget says so before allocating,
/// and a stream cut inside a frame counts the 16-bit frame's bytes.
#[test]
fn the_budget_and_the_frame_checks_count_two_bytes_a_sample() {
    let needs = |space: &str| -> u64 {
        let header = format!("YUV4MPEG2 W64 H64 F25:1 {space}\n");
        let run = hetmem_with_stdin(&["filter", "-", "-", "--max-pixels", "100"], header.into_bytes());
        assert_eq!(run.status.code(), Some(1));
        let message = stderr(&run);
        assert!(
            message.contains("64x64 pixels (4096 pixels)") && message.contains("--max-pixels 4096"),
            "{message}"
        );
        let bytes = message.split("which needs ").nth(1).and_then(|rest| rest.split(' ').next());
        bytes.and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("no byte count in: {message}"))
    };
    assert_eq!(needs("C420p10"), 2 * needs("C420"));
    assert_eq!(needs("Cmono16"), 2 * needs("Cmono"));

    let format = wide(PixelLayout::Gray, 16, 8);
    let header = "YUV4MPEG2 W16 H8 Cmono10\n";
    let frames = [random_frame(format, 10), random_frame(format, 10)];
    let mut stream = y4m(header, &frames);
    // The second frame holds only as many bytes as an 8-bit one would.
    stream.truncate(stream.len() - format.frame_bytes() / 2);
    let run = hetmem_with_stdin(&["filter", "-", "-"], stream);
    assert_eq!(run.status.code(), Some(1));
    let error = stderr(&run);
    assert!(error.contains("frame 1") && error.contains("after 128 of its 256 bytes"), "{error}");
    assert_y4m_result(&run.stdout, header, format, &default_kernel(), &frames[..1]);
}

/// The pixels of a decoded 16-bit image as the frame's little-endian bytes.
fn frame_bytes_of(image: &image::DynamicImage) -> Vec<u8> {
    match image {
        image::DynamicImage::ImageLuma16(pixels) => le_bytes(pixels.as_raw()),
        image::DynamicImage::ImageLumaA16(pixels) => le_bytes(pixels.as_raw()),
        image::DynamicImage::ImageRgb16(pixels) => le_bytes(pixels.as_raw()),
        image::DynamicImage::ImageRgba16(pixels) => le_bytes(pixels.as_raw()),
        other => panic!("not a 16-bit image: {:?}", other.color()),
    }
}

#[test]
fn sixteen_bit_pngs_stay_16_bit_and_match_the_cpu_path() {
    let dir = TempDir::new("png-16");
    let (width, height) = (37u32, 23u32);
    let pixels = (width * height) as usize;
    // Sigma alone: sized by 8 sigma for 16-bit samples, as OpenCV does (13 x 13 here).
    let kernel = Gaussian::for_samples(None, Some(1.5), Border::Reflect101, SampleType::U16).unwrap();
    assert_eq!(kernel.radius(), 6);
    for (name, layout) in
        [("gray", PixelLayout::Gray), ("rgb", PixelLayout::Rgb), ("rgba", PixelLayout::Rgba)]
    {
        let format = wide(layout, width, height);
        let samples = random_samples(format.frame_bytes() / 2, 16);
        let input = dir.path(&format!("{name}.png"));
        match layout {
            PixelLayout::Gray => {
                ImageBuffer::<Luma<u16>, _>::from_raw(width, height, samples.clone()).unwrap().save(&input)
            }
            PixelLayout::Rgb => {
                ImageBuffer::<Rgb<u16>, _>::from_raw(width, height, samples.clone()).unwrap().save(&input)
            }
            _ => ImageBuffer::<Rgba<u16>, _>::from_raw(width, height, samples.clone()).unwrap().save(&input),
        }
        .unwrap();
        let output = dir.path(&format!("{name}-out.png"));
        let run = hetmem(&["filter", text(&input), text(&output), "--sigma", "1.5", "--json"]);
        assert!(run.status.success(), "{name}: {}", stderr(&run));
        let summary: serde_json::Value = serde_json::from_slice(&run.stdout).expect("JSON on stdout");
        assert_eq!(summary["sample"], "u16", "{name}");
        assert!(summary["warnings"].as_array().unwrap().is_empty(), "{name}: {summary}");
        let result = image::open(&output).unwrap();
        let want = blurred(format, &kernel, &le_bytes(&samples));
        assert_eq!(result.color().bytes_per_pixel() as usize, format.planes()[0].pixel_bytes(), "{name}");
        assert_same(&frame_bytes_of(&result), &want, name);
        assert_eq!(pixels * format.planes()[0].pixel_bytes(), want.len());
    }

    // Gray with alpha is filtered as RGBA and written back as 16-bit gray with alpha.
    let gray_alpha = random_samples(pixels * 2, 16);
    let input = dir.path("la.png");
    ImageBuffer::<LumaA<u16>, _>::from_raw(width, height, gray_alpha.clone()).unwrap().save(&input).unwrap();
    let output = dir.path("la-out.png");
    let run = hetmem(&["filter", text(&input), text(&output), "--sigma", "1.5"]);
    assert!(run.status.success(), "{}", stderr(&run));
    let rgba: Vec<u16> = gray_alpha.chunks_exact(2).flat_map(|p| [p[0], p[0], p[0], p[1]]).collect();
    let format = wide(PixelLayout::Rgba, width, height);
    let want: Vec<u16> = samples_of(&blurred(format, &kernel, &le_bytes(&rgba)))
        .chunks_exact(4)
        .flat_map(|p| [p[0], p[3]])
        .collect();
    let result = image::open(&output).unwrap();
    assert_eq!(result.color(), image::ColorType::La16);
    assert_same(&frame_bytes_of(&result), &le_bytes(&want), "gray with alpha");

    // JPEG holds 8 bits: refused before any work, naming the remedy.
    let run = hetmem(&["filter", text(&dir.path("rgb.png")), text(&dir.path("out.jpg"))]);
    assert_eq!(run.status.code(), Some(1));
    let error = stderr(&run);
    assert!(error.contains("16-bit RGB") && error.contains(".png"), "{error}");
    assert!(!dir.path("out.jpg").exists());
}

#[test]
fn sixteen_bit_pgm_and_ppm_stay_16_bit() {
    let dir = TempDir::new("pnm-16");
    let (width, height) = (19u32, 12u32);
    for (extension, layout) in [("pgm", PixelLayout::Gray), ("ppm", PixelLayout::Rgb)] {
        let format = wide(layout, width, height);
        let samples = random_samples(format.frame_bytes() / 2, 16);
        let input = dir.path(&format!("in.{extension}"));
        if layout == PixelLayout::Gray {
            ImageBuffer::<Luma<u16>, _>::from_raw(width, height, samples.clone()).unwrap().save(&input)
        } else {
            ImageBuffer::<Rgb<u16>, _>::from_raw(width, height, samples.clone()).unwrap().save(&input)
        }
        .unwrap();
        let output = dir.path(&format!("out.{extension}"));
        let run = hetmem(&["filter", text(&input), text(&output), "--radius", "3", "--border", "replicate"]);
        assert!(run.status.success(), "{extension}: {}", stderr(&run));
        let kernel = Gaussian::new(Some(3), None, Border::Replicate).unwrap();
        let magic = if layout == PixelLayout::Gray { "P5" } else { "P6" };
        assert!(std::fs::read(&output).unwrap().starts_with(format!("{magic}\n19 12\n65535\n").as_bytes()));
        let result = image::open(&output).unwrap();
        assert_same(&frame_bytes_of(&result), &blurred(format, &kernel, &le_bytes(&samples)), extension);
    }
    // RGBA goes to PAM, 16 bits still.
    let format = wide(PixelLayout::Rgba, width, height);
    let samples = random_samples(format.frame_bytes() / 2, 16);
    let (input, output) = (dir.path("rgba.png"), dir.path("rgba.pam"));
    ImageBuffer::<Rgba<u16>, _>::from_raw(width, height, samples.clone()).unwrap().save(&input).unwrap();
    let run = hetmem(&["filter", text(&input), text(&output)]);
    assert!(run.status.success(), "{}", stderr(&run));
    let result = image::open(&output).unwrap();
    assert_eq!(result.color(), image::ColorType::Rgba16);
    assert_same(&frame_bytes_of(&result), &blurred(format, &default_kernel(), &le_bytes(&samples)), "pam");
    // A PGM holds gray only, 16-bit or not.
    let run = hetmem(&["filter", text(&input), text(&dir.path("rgba.pgm"))]);
    assert_eq!(run.status.code(), Some(1));
    assert!(stderr(&run).contains("16-bit RGBA"), "{}", stderr(&run));
}

/// With sigma alone, cv2.GaussianBlur sizes a 16-bit image's kernel by 8 sigma, an 8-bit
/// one's by 6: hetmem too, so `--sigma 1` is 9 x 9 here and 7 x 7 on 8-bit input.
#[test]
fn a_radius_left_out_follows_opencvs_16_bit_rule() {
    let dir = TempDir::new("sigma-16");
    let (width, height) = (29u32, 21u32);
    let format = wide(PixelLayout::Gray, width, height);
    let samples = random_samples(format.frame_bytes() / 2, 16);
    let (input, output) = (dir.path("in.png"), dir.path("out.png"));
    ImageBuffer::<Luma<u16>, _>::from_raw(width, height, samples.clone()).unwrap().save(&input).unwrap();
    let run = hetmem(&["filter", text(&input), text(&output), "--sigma", "1"]);
    assert!(run.status.success(), "{}", stderr(&run));
    assert!(stderr(&run).contains("Gaussian 9x9 (sigma 1,"), "{}", stderr(&run));
    let kernel = Gaussian::for_samples(None, Some(1.0), Border::Reflect101, SampleType::U16).unwrap();
    assert_eq!(kernel.radius(), 4);
    assert_same(
        &frame_bytes_of(&image::open(&output).unwrap()),
        &blurred(format, &kernel, &le_bytes(&samples)),
        "png",
    );

    // 10-bit video likewise; a sigma too wide for 16-bit samples is refused by name.
    let format = wide(PixelLayout::Gray, 16, 8);
    let frames = [random_frame(format, 10)];
    let header = "YUV4MPEG2 W16 H8 Cmono10\n";
    let run = hetmem_with_stdin(&["filter", "-", "-", "--sigma", "1"], y4m(header, &frames));
    assert!(run.status.success(), "{}", stderr(&run));
    assert_y4m_result(&run.stdout, header, format, &kernel, &frames);
    let run = hetmem_with_stdin(&["filter", "-", "-", "--sigma", "9"], y4m(header, &frames));
    assert_eq!(run.status.code(), Some(1));
    let error = stderr(&run);
    assert!(
        error.contains("stdin") && error.contains("sigma 9 implies radius 36 for 16-bit samples"),
        "{error}"
    );
    assert!(run.stdout.is_empty());
}

/// On a GPU machine, every strategy it can run gives the CPU path's samples for 10-bit video
/// and a 16-bit image.
#[test]
fn every_strategy_the_gpu_runs_gives_the_cpu_result_on_16_bit_samples() {
    let test = "every_strategy_the_gpu_runs_gives_the_cpu_result_on_16_bit_samples";
    if hetmem::testing::cuda_device_or_skip(test).is_none() {
        return;
    }
    let device = Device::open(BackendChoice::Only(BackendKind::Cuda)).unwrap();
    let dir = TempDir::new("gpu-16");
    let format = wide(PixelLayout::Yuv420, 333, 171);
    let frames: Vec<Vec<u8>> = (0..4).map(|_| random_frame(format, 10)).collect();
    let header = "YUV4MPEG2 W333 H171 F25:1 C420p10 XYSCSS=420P10\n";
    let (width, height) = (257u32, 129u32);
    let rgb = wide(PixelLayout::Rgb, width, height);
    let samples = random_samples(rgb.frame_bytes() / 2, 16);
    let png = dir.path("in.png");
    ImageBuffer::<Rgb<u16>, _>::from_raw(width, height, samples.clone()).unwrap().save(&png).unwrap();
    let kernel = Gaussian::new(Some(7), None, Border::Reflect101).unwrap();
    for strategy in Strategy::ALL.into_iter().chain([Strategy::Auto]) {
        if strategy.check(&device).is_err() {
            continue;
        }
        let name = strategy.name();
        let run = hetmem_with_stdin_on(
            "cuda",
            &["filter", "-", "-", "--strategy", name, "--radius", "7"],
            y4m(header, &frames),
        );
        assert!(run.status.success(), "{name}: {}", stderr(&run));
        assert_y4m_result(&run.stdout, header, format, &kernel, &frames);
        let out = dir.path(&format!("{name}.png"));
        let image_run =
            command_on("cuda", &["filter", text(&png), text(&out), "--strategy", name, "--radius", "7"])
                .output()
                .unwrap();
        assert!(image_run.status.success(), "{name}: {}", stderr(&image_run));
        let result = image::open(&out).unwrap();
        assert_same(&frame_bytes_of(&result), &blurred(rgb, &kernel, &le_bytes(&samples)), name);
    }
}
