//! The GPU rows: the computation with its buffers copied per pass, mapped, hybrid and placed,
//! each held to the device budget, checked against the CPU once and then timed.

use hetmem::backend::Device;
use hetmem::error::Error;
use hetmem::ops::ct::{self, HuLease, HuWindow, LabelLease, LabelledVolume, Organ, VolumeShape};
use hetmem::placement::{Placement, Where};
use hetmem::{DeviceBuf, HostBuf, Lent, PinOptions, Queue, Shared, memory::DeviceBudget};

use super::outputs::Outputs;
use super::reference::Expected;
use super::{CtOptions, Placing, Row, SMOOTHED_ORGAN, Timer};
use crate::error::Result;

/// What every row of one measurement shares.
pub(super) struct Run<'a> {
    pub(super) volume: VolumeShape,
    pub(super) windows: &'a [HuWindow],
    pub(super) passes: usize,
    pub(super) smoothing: bool,
    pub(super) expected: &'a Expected,
    pub(super) timer: &'a Timer,
}

/// The inputs the rows' kernels read, in host memory, and the queue they run on.
struct Held<'a> {
    device: &'a Device,
    queue: Queue,
    volume: VolumeShape,
    windows: &'a [HuWindow],
    passes: usize,
    weights_buf: Shared<DeviceBuf<f32>>,
    hu_host: Shared<HostBuf<i16>>,
    labels_host: Shared<HostBuf<u8>>,
    budget: DeviceBudget,
}

/// The all-copy, all-mapped, hybrid and placed rows, in that order.
pub(super) fn gpu_rows(
    device: &Device,
    options: &CtOptions,
    run: &Run<'_>,
    phantom: &LabelledVolume,
    weights: &[f32],
    placement: &Placement,
) -> Result<Vec<Row>> {
    let volume = run.volume;
    let mut rows = Vec::new();
    // On the CPU backend the placements' rows run too, each operation's CPU path on that
    // placement's buffers (plain memory standing in for device memory): the budget's refusals
    // and the results are the GPU run's, the seconds are not.
    let checked = match device.as_cuda() {
        Some(_) => "statistics bit for bit, smoothing within 1e-5, projection exactly, against the CPU",
        None => {
            "CPU backend (the CPU path on this placement's buffers; not GPU seconds): results as the reference"
        }
    };
    let queue = Queue::new(device)?;
    let weights_buf = {
        let mut buf = DeviceBuf::new(device, weights.len())?;
        buf.copy_from_slice(weights)?;
        queue.share(buf)
    };
    let mut outputs = Some(Outputs::new(device, &queue, run.passes, run.smoothing, volume)?);
    let hu_host = queue.share(mapped(device, phantom.hu())?);
    let labels_host = queue.share(mapped(device, phantom.labels())?);
    let budget = DeviceBudget::new(options.device_budget);
    let held = Held {
        device,
        queue,
        volume,
        windows: run.windows,
        passes: run.passes,
        weights_buf,
        hu_host,
        labels_host,
        budget,
    };
    let fits = |bytes: u64| {
        (bytes <= options.device_budget).then_some(()).ok_or_else(|| {
            format!(
                "does not fit: needs {bytes} bytes of device memory, more than the {} byte budget \
                 (--device-budget); the placements that leave the volume mapped can run",
                options.device_budget
            )
        })
    };
    let volume_bytes = volume.voxels() as u64 * 2;
    let template_bytes = volume.voxels() as u64;

    let mut run_row = |placing: Placing,
                       volume_at: &str,
                       template_at: &str,
                       needs: u64,
                       body: &mut dyn FnMut(&mut Outputs) -> hetmem::Result<()>|
     -> Result<Row> {
        if let Err(why) = fits(needs) {
            return Ok(not_run(placing, volume_at, template_at, why));
        }
        let taken = outputs.take().ok_or_else(|| Error::invalid("bench ct", "outputs lost"))?;
        let mut out = taken.poison(&held.queue)?;
        body(&mut out)?;
        let mut out = out.check(&held.queue, run.expected, run.windows)?;
        let seconds = run.timer.time(&mut || body(&mut out))?;
        outputs = Some(out);
        Ok(Row {
            placing,
            volume: volume_at.into(),
            template: template_at.into(),
            seconds_per_study: Some(seconds),
            speedup_over_all_copy: None,
            not_run_because: None,
            checked: checked.into(),
        })
    };

    // All copy: device buffers of both, refilled from pinned memory before every pass.
    let row = run_row(
        Placing::AllCopy,
        "copied per pass",
        "copied per pass",
        volume_bytes + template_bytes,
        &mut |out| held.all_copy(out),
    )?;
    rows.push(row);

    let row = run_row(Placing::AllMapped, "mapped", "mapped", 0, &mut |out| {
        held.gpu_run(&held.hu_host, &held.labels_host, out)
    })?;
    rows.push(row);

    // The template's one copy into device memory is part of each timed run.
    let row = run_row(Placing::Hybrid, "mapped", "device", template_bytes, &mut |out| held.hybrid(out))?;
    rows.push(row);

    let volume_place = placement.place_of("volume").unwrap_or(Where::Mapped);
    let template_place = placement.place_of("template").unwrap_or(Where::Mapped);
    let row = run_row(
        Placing::Placed,
        &volume_place.to_string(),
        &template_place.to_string(),
        placement.device_bytes,
        &mut |out| held.placed(volume_place, template_place, out),
    )?;
    rows.push(row);
    Ok(rows)
}

impl Held<'_> {
    /// Device buffers of both, refilled from pinned memory before every pass.
    fn all_copy(&self, out: &mut Outputs) -> hetmem::Result<()> {
        let (queue, device, volume, budget) = (&self.queue, self.device, self.volume, &self.budget);
        let (hu_host, labels_host, windows) = (&self.hu_host, &self.labels_host, self.windows);
        let mut hu_dev = queue.lend(DeviceBuf::<i16>::with_budget(device, volume.voxels(), budget)?);
        let mut labels_dev = queue.lend(DeviceBuf::<u8>::with_budget(device, volume.voxels(), budget)?);
        let refill = |hu_dev: &mut Lent<DeviceBuf<i16>>, labels_dev: &mut Lent<DeviceBuf<u8>>| {
            queue.copy(hu_host, hu_dev)?;
            queue.copy(labels_host, labels_dev)
        };
        for pass in 0..self.passes {
            refill(&mut hu_dev, &mut labels_dev)?;
            let (window, organ) = (windows[pass / Organ::ALL.len()], Organ::ALL[pass % Organ::ALL.len()]);
            ct::organ_stats(queue, &hu_dev, &labels_dev, organ.label(), window, &mut out.stats[pass])?;
        }
        if let Some(smoothed) = &mut out.smoothed {
            refill(&mut hu_dev, &mut labels_dev)?;
            let organ = SMOOTHED_ORGAN.label();
            ct::masked_gaussian(queue, volume, &hu_dev, &labels_dev, organ, &self.weights_buf, smoothed)?;
        }
        // The projection reads the volume only.
        queue.copy(hu_host, &mut hu_dev)?;
        ct::mip_height(queue, volume, &hu_dev, &mut out.mip)?;
        queue.synchronize()
    }

    /// The template copied into device memory, the volume mapped.
    fn hybrid(&self, out: &mut Outputs) -> hetmem::Result<()> {
        let mut labels_dev =
            self.queue.lend(DeviceBuf::<u8>::with_budget(self.device, self.volume.voxels(), &self.budget)?);
        self.queue.copy(&self.labels_host, &mut labels_dev)?;
        self.gpu_run(&self.hu_host, &labels_dev, out)
    }

    /// Each buffer where the placement put it.
    fn placed(&self, volume_place: Where, template_place: Where, out: &mut Outputs) -> hetmem::Result<()> {
        let (queue, device, volume, budget) = (&self.queue, self.device, self.volume, &self.budget);
        let (hu_host, labels_host) = (&self.hu_host, &self.labels_host);
        let held_hu = match volume_place {
            Where::Device => {
                let mut dev = queue.lend(DeviceBuf::<i16>::with_budget(device, volume.voxels(), budget)?);
                queue.copy(hu_host, &mut dev)?;
                Some(dev)
            }
            Where::Mapped => None,
        };
        let held_labels = match template_place {
            Where::Device => {
                let mut dev = queue.lend(DeviceBuf::<u8>::with_budget(device, volume.voxels(), budget)?);
                queue.copy(labels_host, &mut dev)?;
                Some(dev)
            }
            Where::Mapped => None,
        };
        match (&held_hu, &held_labels) {
            (Some(hu), Some(labels)) => self.gpu_run(hu, labels, out),
            (Some(hu), None) => self.gpu_run(hu, labels_host, out),
            (None, Some(labels)) => self.gpu_run(hu_host, labels, out),
            (None, None) => self.gpu_run(hu_host, labels_host, out),
        }
    }

    /// One GPU run of the computation on these inputs.
    fn gpu_run<H: HuLease, L: LabelLease>(
        &self,
        hu: &H,
        labels: &L,
        out: &mut Outputs,
    ) -> hetmem::Result<()> {
        gpu_run(&self.queue, self.volume, hu, labels, &self.weights_buf, self.windows, out)
    }
}

fn mapped<T: hetmem::Element>(device: &Device, data: &[T]) -> Result<HostBuf<T>> {
    let mut buf = HostBuf::pinned(device, data.len(), PinOptions::default())?;
    buf.as_mut_slice().copy_from_slice(data);
    Ok(buf)
}

/// One GPU run of the computation: every pass, the smoothing, the projection.
fn gpu_run<H: HuLease, L: LabelLease>(
    queue: &Queue,
    volume: VolumeShape,
    hu: &H,
    labels: &L,
    weights: &hetmem::Shared<DeviceBuf<f32>>,
    windows: &[HuWindow],
    outputs: &mut Outputs,
) -> hetmem::Result<()> {
    let mut pass = 0;
    for &window in windows {
        for organ in Organ::ALL {
            ct::organ_stats(queue, hu, labels, organ.label(), window, &mut outputs.stats[pass])?;
            pass += 1;
        }
    }
    if let Some(out) = &mut outputs.smoothed {
        ct::masked_gaussian(queue, volume, hu, labels, SMOOTHED_ORGAN.label(), weights, out)?;
    }
    ct::mip_height(queue, volume, hu, &mut outputs.mip)?;
    queue.synchronize()
}

fn not_run(placing: Placing, volume: &str, template: &str, why: String) -> Row {
    Row {
        placing,
        volume: volume.into(),
        template: template.into(),
        seconds_per_study: None,
        speedup_over_all_copy: None,
        not_run_because: Some(why),
        checked: String::new(),
    }
}
