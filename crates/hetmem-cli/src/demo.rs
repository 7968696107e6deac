//! `hetmem demo`: the showcase. Moving synthetic frames through the Gaussian blur by every
//! strategy the machine has, side by side: latency, frames/s, link traffic, memory (measured by
//! [`crate::frame_strategies`]), and a before/after picture.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use hetmem::ops::gaussian::{Border, FrameFormat, Gaussian, GaussianStage, PixelLayout};
use hetmem::{Device, FrameFilter, Strategy};

use crate::frame_strategies::{self, render};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Frames per strategy.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    frames: u32,
    /// Frame width in pixels.
    #[arg(long, default_value_t = 1920)]
    width: usize,
    /// Frame height in pixels.
    #[arg(long, default_value_t = 1080)]
    height: usize,
    /// Kernel radius (2 = 5x5). Default: from sigma, or 2.
    #[arg(long)]
    radius: Option<u32>,
    /// Gaussian sigma. Default: OpenCV's for the radius.
    #[arg(long)]
    sigma: Option<f64>,
    /// Strategies to run, comma-separated (default: every one the machine has).
    #[arg(long, value_delimiter = ',')]
    strategies: Vec<String>,
    /// Where to write the before/after PNG.
    #[arg(long, default_value = "hetmem-demo.png")]
    png: PathBuf,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

pub fn run(device: &Device, args: &Args) -> anyhow::Result<ExitCode> {
    let format = FrameFormat::new(args.width, args.height, PixelLayout::Rgb)?;
    let kernel = Gaussian::new(args.radius, args.sigma, Border::Reflect101)?;
    let wanted: Vec<Strategy> = args.strategies.iter().map(|name| name.parse()).collect::<Result<_, _>>()?;
    let report =
        frame_strategies::measure(device, format, &kernel, &wanted, args.frames, !args.json, |filter| {
            write_png(&args.png, filter, &format)
        })?;
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &report)?;
        writeln!(out)?;
    } else {
        let mut table = frame_strategies::table(&report);
        table.title = format!("hetmem demo: {}", table.title);
        table.note(format!("before/after: {}", args.png.display()));
        table.write_text(&mut out)?;
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// Writes the centre of frame 0, before and after the blur, side by side.
fn write_png(
    path: &PathBuf,
    filter: &mut FrameFilter<GaussianStage>,
    format: &FrameFormat,
) -> anyhow::Result<()> {
    render(filter.input_mut()?, format.width, format.height, 0);
    filter.run()?;
    let (cw, ch) = (format.width.min(640), format.height.min(360));
    let (x0, y0) = ((format.width - cw) / 2, (format.height - ch) / 2);
    let mut image = image::RgbImage::new(2 * cw as u32, ch as u32);
    let input = filter.input_mut()?.to_vec();
    for (half, frame) in [(0, &input[..]), (1, filter.output()?)] {
        for y in 0..ch {
            for x in 0..cw {
                let at = ((y0 + y) * format.width + x0 + x) * 3;
                let pixel = image::Rgb([frame[at], frame[at + 1], frame[at + 2]]);
                image.put_pixel((half * cw + x) as u32, y as u32, pixel);
            }
        }
    }
    image.save(path).with_context(|| format!("writing {}", path.display()))
}
