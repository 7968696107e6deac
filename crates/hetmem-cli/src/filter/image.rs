//! `hetmem filter` on an image: decoded straight into the filter's input memory
//! ([`hetmem::FrameFilter`]), filtered once (again after a failure, as `--retries` allows), and
//! encoded straight from its output memory. The formats are hetmem-media's
//! ([`hetmem_media::image`]).

use std::path::Path;

use anyhow::Context as _;
use hetmem::ops::gaussian::GaussianStage;
use hetmem::{Device, FrameFilter, Strategy};
use hetmem_media::Input;
use hetmem_media::image::{ImageKind, Opened, encoding, write};
use image::ColorType;

use super::Job;
use super::recovery::{self, Recovery, Retry};
use super::stats::{Clock, Facts, OPENING_THE_DEVICE, RELEASING, Report};

pub(super) fn filter(
    job: &Job,
    input: Input,
    to: &Path,
    kind: ImageKind,
    output_kind: ImageKind,
) -> anyhow::Result<Report> {
    let mut clock = Clock::new(job.started);
    clock.setup(OPENING_THE_DEVICE, job.opening_the_device);
    // An image's one frame streams from the input's first byte read to the output written.
    clock.start_streaming();
    let (input_name, output) = (job.input.to_string(), job.output.to_string());
    let bytes = input.read_all(&job.budget, &input_name)?;
    let image = Opened::new(&bytes, kind, &input_name, &job.budget)?;
    let ((width, height), color, plan) = (image.size(), image.color(), image.plan());
    let encoding = encoding(to, output_kind, plan.written(), &output)?;
    let mut warnings = Vec::new();
    if matches!(color, ColorType::Rgb32F | ColorType::Rgba32F) {
        warnings.push(format!(
            "{input_name} has {color:?} pixels: hetmem filters 8 or 16 bits per channel, so they were converted \
             to 8 bits and {output} is 8-bit"
        ));
    }
    let kernel = job
        .kernel_for(plan.sample())
        .with_context(|| format!("cannot filter {input_name} ({width}x{height} {color:?})"))?;
    let stage = GaussianStage::new(image.frame(), &kernel)?.with_segments(crate::environment::segments()?);
    let build = |device: &Device,
                 strategy: Strategy,
                 warnings: &mut Vec<String>|
     -> anyhow::Result<FrameFilter<GaussianStage>> {
        let context =
            |strategy| format!("cannot filter {input_name} ({width}x{height}) by the {strategy} strategy");
        match FrameFilter::with_stage(device, strategy, stage.clone()) {
            Ok(filter) => Ok(filter),
            // Memory short even after the library's retries: an `auto` run goes on on the CPU.
            Err(error) if error.is_transient() && !job.strategy_chosen && strategy != Strategy::Cpu => {
                warnings.push(format!(
                    "{}: {error}; filtering by the cpu strategy instead (the same result)",
                    context(strategy)
                ));
                FrameFilter::with_stage(device, Strategy::Cpu, stage.clone())
                    .with_context(|| context(Strategy::Cpu))
            }
            Err(error) => Err(error).with_context(|| context(strategy)),
        }
    };
    clock.stop_streaming();
    let mut filter =
        clock.build(|| build(job.device, job.strategy, &mut warnings), FrameFilter::setup_time)?;
    clock.start_streaming();
    image.read_into(filter.input_mut()?)?;
    // Kept for --retries: a failed run may lose the filter's input memory.
    let kept = (job.retries > 0).then(|| filter.input_mut().map(|input| input.to_vec())).transpose()?;
    let mut recovery = Recovery::new(job.retries);
    let cpu = recovery::cpu();
    let latency = loop {
        let ran = filter
            .run()
            .with_context(|| format!("filtering {input_name} by the {} strategy", filter.strategy()));
        let error = match ran {
            Ok(latency) => break latency,
            Err(error) => error,
        };
        let (device, strategy) = match recovery.after(job.device, filter.strategy(), 0, &error) {
            None => return Err(error),
            Some(Retry::Cpu) => (&cpu, Strategy::Cpu),
            Some(Retry::Same) => (job.device, filter.strategy()),
        };
        clock.stop_streaming();
        clock.time(RELEASING, || drop(filter));
        filter = clock.build(|| build(device, strategy, &mut warnings), FrameFilter::setup_time)?;
        clock.start_streaming();
        filter.input_mut()?.copy_from_slice(kept.as_deref().expect("kept when retries are allowed"));
    };
    warnings.extend(recovery.warnings());
    clock.frame(latency);

    let result = filter.output()?;
    let file = job.outputs.create(to)?;
    write(file, encoding, result, (width, height), plan).with_context(|| format!("cannot write {output}"))?;
    clock.stop_streaming();
    let strategy = filter.strategy();
    clock.time(RELEASING, || drop(filter));
    let facts = Facts {
        input: input_name,
        output,
        kind: "image",
        format: format!("{} {color:?}", kind.name()),
        width: width as usize,
        height: height as usize,
        layout: plan.layout(),
        sample: plan.sample(),
        strategy,
        warnings,
    };
    let mut report = Report::new(facts, &kernel, clock);
    report.retried = recovery.retried;
    Ok(report)
}
