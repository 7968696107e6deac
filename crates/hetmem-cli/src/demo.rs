//! `hetmem demo`: the showcase. Moving synthetic frames through the Gaussian blur by every
//! strategy the machine has, side by side: latency, frames/s, link traffic, memory (measured by
//! [`crate::frame_strategies`]), and a before/after picture.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context as _, bail};
use hetmem::ops::gaussian::{Border, FrameFormat, Gaussian, GaussianStage, PixelLayout};
use hetmem::{Device, FrameFilter};
use image::ImageEncoder as _;
use image::codecs::png::PngEncoder;

use crate::choices::{self, StrategyName};
use crate::frame_strategies::{self, render};
use crate::json::{self, Schema};
use crate::outputs::Outputs;
use crate::ui::Ui;

/// What `demo --json` prints.
const SCHEMA: Schema = Schema("hetmem.demo/2");

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
    #[arg(long, value_delimiter = ',', value_parser = choices::by_library::<StrategyName>())]
    strategies: Vec<StrategyName>,
    /// Also write the centre of a frame before and after the blur, side by side, to this PNG
    /// file (checked before the run: its folder must exist, and the file must not, unless -y).
    #[arg(long, value_name = "FILE")]
    png: Option<PathBuf>,
    /// Print JSON instead of a table (under "schema": "hetmem.demo/2").
    #[arg(long)]
    json: bool,
}

pub fn run(device: &Device, args: &Args, ui: Ui, outputs: Outputs) -> anyhow::Result<ExitCode> {
    let format = FrameFormat::new(args.width, args.height, PixelLayout::Rgb)?;
    let kernel = Gaussian::new(args.radius, args.sigma, Border::Reflect101)?;
    let wanted: Vec<_> = args.strategies.iter().map(|name| name.0).collect();
    let mut picture = args.png.as_deref().map(|path| Picture::open(path, outputs)).transpose()?;
    let report = frame_strategies::measure(device, format, &kernel, &wanted, args.frames, ui, |filter| {
        picture.as_mut().map_or(Ok(()), |picture| picture.write(filter, &format))
    })?;
    let mut out = std::io::stdout().lock();
    if args.json {
        json::write(&mut out, SCHEMA, &report)?;
    } else {
        let mut table = frame_strategies::table(&report);
        table.title = format!("hetmem demo: {}", table.title);
        if let Some(path) = &args.png {
            table.note(format!("before/after: {}", path.display()));
        }
        table.write_text(&mut out)?;
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}

/// `--png`: the file is checked and opened before the run, so that a run never ends unable
/// to write its picture; a file created for it is removed again if the run fails first.
struct Picture {
    path: PathBuf,
    file: File,
    created: bool,
    written: bool,
}

impl Picture {
    /// # Errors
    /// Not a `.png` name, a folder that does not exist, a file that exists (without `-y`), or
    /// one that cannot be written.
    fn open(path: &Path, outputs: Outputs) -> anyhow::Result<Picture> {
        let shown = path.display();
        if !path.extension().is_some_and(|extension| extension.eq_ignore_ascii_case("png")) {
            bail!("--png {shown}: the picture is written as PNG: give a file name ending in .png");
        }
        let folder = path.parent().filter(|parent| !parent.as_os_str().is_empty()).unwrap_or(Path::new("."));
        if !folder.is_dir() {
            bail!("--png {shown}: the folder {} does not exist: create it first", folder.display());
        }
        outputs.check(path)?;
        // With -y an existing picture is replaced only once the new one is made.
        let (file, created) = if outputs.overwrite && path.exists() {
            let file =
                OpenOptions::new().write(true).open(path).with_context(|| format!("cannot write {shown}"))?;
            (file, false)
        } else {
            (outputs.create(path)?, true)
        };
        Ok(Picture { path: path.to_path_buf(), file, created, written: false })
    }

    /// Writes the centre of frame 0, before and after the blur, side by side.
    fn write(&mut self, filter: &mut FrameFilter<GaussianStage>, format: &FrameFormat) -> anyhow::Result<()> {
        render(filter.input_mut()?, format.width(), format.height(), 0);
        filter.run()?;
        let (cw, ch) = (format.width().min(640), format.height().min(360));
        let (x0, y0) = ((format.width() - cw) / 2, (format.height() - ch) / 2);
        let mut image = image::RgbImage::new(2 * cw as u32, ch as u32);
        let input = filter.input_mut()?.to_vec();
        for (half, frame) in [(0, &input[..]), (1, filter.output()?)] {
            for y in 0..ch {
                for x in 0..cw {
                    let at = ((y0 + y) * format.width() + x0 + x) * 3;
                    let pixel = image::Rgb([frame[at], frame[at + 1], frame[at + 2]]);
                    image.put_pixel((half * cw + x) as u32, y as u32, pixel);
                }
            }
        }
        let mut png = Vec::new();
        PngEncoder::new(&mut png).write_image(
            image.as_raw(),
            image.width(),
            image.height(),
            image::ExtendedColorType::Rgb8,
        )?;
        let shown = self.path.display();
        self.file
            .set_len(0)
            .and_then(|()| self.file.write_all(&png))
            .with_context(|| format!("writing {shown}"))?;
        self.written = true;
        Ok(())
    }
}

impl Drop for Picture {
    fn drop(&mut self) {
        if self.created && !self.written {
            // Best effort: the run's own error is the one to report.
            let _ = std::fs::remove_file(&self.path);
        }
    }
}
