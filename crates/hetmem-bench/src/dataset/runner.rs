//! Each method run over the data set: every frame through the blur, timed, then a sample of
//! frames filtered again into a poisoned output and compared with the CPU's blur.

use std::time::Instant;

use hetmem::backend::cuda::{Kernel, LaunchConfig};
use hetmem::error::{Error, Result};
use hetmem::kernels;
use hetmem::{
    Buffer, Device, DeviceBuf, HostBuf, Lease, Lent, PinOptions, Queue, Shared, WritableBuffer,
    handoff::KernelArgs, memory::HostVisible,
};

use super::{BLOCK, DATASET, DatasetOptions, Method, MethodRun, TILE, blur3_rgb_cpu};

/// What every method needs.
pub(super) struct Runner<'a> {
    device: &'a Device,
    queue: &'a Queue,
    options: &'a DatasetOptions,
    /// The blur, on a GPU.
    kernel: Option<Kernel>,
}

impl<'a> Runner<'a> {
    pub(super) fn new(
        device: &'a Device,
        queue: &'a Queue,
        options: &'a DatasetOptions,
    ) -> Result<Runner<'a>> {
        let kernel = match device.as_cuda() {
            Some(cuda) => Some(kernels::kernel(cuda, &DATASET, "dataset_blur3_rgb")?),
            None => None,
        };
        Ok(Runner { device, queue, options, kernel })
    }

    fn config(&self) -> LaunchConfig {
        let (width, height) = (self.options.width as u32, self.options.height as u32);
        LaunchConfig {
            grid: (width.div_ceil(TILE.0), height.div_ceil(TILE.1), 1),
            block: (BLOCK.0, BLOCK.1, 1),
            shared_bytes: 0,
        }
    }

    /// Free device memory now, on a GPU.
    fn free_device_memory(&self) -> Result<Option<u64>> {
        self.device
            .as_cuda()
            .map(|cuda| cuda.memory_info().map(|(free, _)| free))
            .transpose()
            .map_err(Error::from)
    }

    /// `method` over every frame of `data`, timed, then its sample checked.
    pub(super) fn run<B>(&self, method: Method, data: &Shared<B>) -> Result<MethodRun>
    where
        B: HostVisible + Buffer<Elem = u8>,
    {
        let frame = self.options.frame_bytes();
        let free_before = self.free_device_memory()?;
        let mut buffers = Buffers {
            out: HostBuf::<u8>::pinned(
                self.device,
                frame,
                PinOptions { mapped: true, ..PinOptions::default() },
            )?,
            device: match method {
                Method::Mapped => None,
                Method::CopyEach => Some((
                    DeviceBuf::<u8>::new(self.device, frame)?,
                    DeviceBuf::<u8>::new(self.device, frame)?,
                )),
            },
        };
        let device_bytes = buffers.device.as_ref().map_or(0, |_| 2 * frame as u64);
        let free_during = self.free_device_memory()?;

        let started = Instant::now();
        for index in 0..self.options.frames {
            buffers = self.frame(index, data, buffers)?;
        }
        let seconds = started.elapsed().as_secs_f64();

        let mut verified_frames = Vec::new();
        for index in sample(self.options.frames, self.options.verify) {
            buffers.out.as_mut_slice().fill(POISON);
            buffers = self.frame(index, data, buffers)?;
            let mut want = vec![0; frame];
            blur3_rgb_cpu(
                &data.host()[index * frame..][..frame],
                &mut want,
                self.options.width,
                self.options.height,
            );
            let got = buffers.out.as_slice();
            if let Some(at) = got.iter().zip(&want).position(|(got, want)| got != want) {
                return Err(Error::invalid(
                    "data set result",
                    format!(
                        "{}: frame {index}, byte {at} is {} where the CPU's blur gives {}",
                        method.name(),
                        got[at],
                        want[at]
                    ),
                ));
            }
            verified_frames.push(index);
        }
        Ok(MethodRun {
            method,
            frames_s: self.options.frames as f64 / seconds,
            gb_s: self.options.dataset_bytes() as f64 / seconds / 1e9,
            seconds,
            device_bytes,
            device_used_bytes: free_before
                .zip(free_during)
                .map(|(before, during)| before.saturating_sub(during)),
            verified_frames,
        })
    }

    /// Frame `index` of `data` blurred into `buffers.out`, finished when this returns: read in
    /// place when `buffers.device` is `None`, else copied through the two device frames.
    fn frame<B>(&self, index: usize, data: &Shared<B>, buffers: Buffers) -> Result<Buffers>
    where
        B: HostVisible + Buffer<Elem = u8>,
    {
        let (width, height) = (self.options.width, self.options.height);
        let frame = self.options.frame_bytes();
        let source = &data.host()[index * frame..][..frame];
        let Buffers { mut out, device } = buffers;
        let Some(kernel) = &self.kernel else {
            // The CPU backend: the same steps, by the CPU's blur.
            let device = match device {
                None => {
                    blur3_rgb_cpu(source, out.as_mut_slice(), width, height);
                    None
                }
                Some((mut input, mut output)) => {
                    input.copy_from_slice(source)?;
                    let mut blurred = vec![0; frame];
                    blur3_rgb_cpu(&input.to_vec()?, &mut blurred, width, height);
                    output.copy_from_slice(&blurred)?;
                    output.copy_to_slice(out.as_mut_slice())?;
                    Some((input, output))
                }
            };
            return Ok(Buffers { out, device });
        };
        match device {
            None => {
                let mut out = self.queue.lend(out);
                self.launch(kernel, data, index * frame, &mut out)?;
                Ok(Buffers { out: out.reclaim()?, device: None })
            }
            Some((mut input, output)) => {
                input.copy_from_slice(source)?;
                let input = self.queue.share(input);
                let mut output = self.queue.lend(output);
                self.launch(kernel, &input, 0, &mut output)?;
                let (input, output) = (input.reclaim()?, output.reclaim()?);
                output.copy_to_slice(out.as_mut_slice())?;
                Ok(Buffers { out, device: Some((input, output)) })
            }
        }
    }

    /// Queues the blur of the frame at byte `in_offset` of `input` into `output`.
    ///
    /// # Errors
    /// A frame that does not lie inside `input`, an `output` that is not one frame long, or
    /// the launch failing.
    fn launch<I, O>(&self, kernel: &Kernel, input: &I, in_offset: usize, output: &mut Lent<O>) -> Result<()>
    where
        I: Lease,
        I::Buf: Buffer<Elem = u8>,
        O: WritableBuffer<Elem = u8>,
    {
        let frame = self.options.frame_bytes();
        if in_offset.checked_add(frame).is_none_or(|end| end > input.len()) || output.len() != frame {
            return Err(Error::invalid(
                "data set frame",
                format!(
                    "{frame} bytes at {in_offset} of {} into {}: the frame must lie inside the input and fill the output",
                    input.len(),
                    output.len()
                ),
            ));
        }
        let args = KernelArgs::new()
            .read(input)
            .value(in_offset as u64)
            .write(output)
            .value(0u64)
            .value(self.options.width as u32)
            .value(self.options.height as u32);
        // SAFETY: dataset_blur3_rgb(const u8* frames, u64 in_offset, u8* out, u64 out_offset,
        // u32 width, u32 height) takes these arguments in order and type (sizes checked to fit
        // 32 bits by `DatasetOptions::validate`). It reads frames[in_offset .. in_offset +
        // width x height x 3), clamped to the frame's edges, and writes out[0 .. the same
        // length): checked above to lie inside `input` and to be all of `output`.
        unsafe { self.queue.launch(kernel, self.config(), args) }
    }
}

/// A method's buffers besides the data set: the host frame results land in, and for
/// [`Method::CopyEach`] the device frames the input is copied into and filtered into.
struct Buffers {
    out: HostBuf<u8>,
    device: Option<(DeviceBuf<u8>, DeviceBuf<u8>)>,
}

/// What outputs are filled with before a checked run: a byte no unwritten output can pass for
/// the blur of random data everywhere.
pub(super) const POISON: u8 = 0xA5;

/// Frames to check among `frames`: the first, the last and evenly spaced ones between, `count`
/// in all (fewer when there are fewer frames).
fn sample(frames: usize, count: usize) -> Vec<usize> {
    let count = count.min(frames);
    let mut picked: Vec<usize> = match count {
        0 => Vec::new(),
        1 => vec![0],
        _ => (0..count).map(|i| i * (frames - 1) / (count - 1)).collect(),
    };
    picked.dedup();
    picked
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sample_takes_the_first_the_last_and_evenly_between() {
        assert_eq!(sample(500, 3), [0, 249, 499]);
        assert_eq!(sample(5, 5), [0, 1, 2, 3, 4]);
        assert_eq!(sample(1, 3), [0]);
        assert_eq!(sample(2, 5), [0, 1]);
        assert!(sample(7, 0).is_empty());
    }
}
