//! [`KernelStage`]: a user's kernel as a stage.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytemuck::Pod;
use sha2::{Digest, Sha256};

use super::Strategy;
use super::cpu::{CpuFn, check_buffers};
use super::{ConstantUse, FrameLayout, Runs, Stage};
use crate::backend::cuda::{CudaDevice, Kernel, LaunchConfig, Module};
use crate::error::{Error, Result};
use crate::handoff::{KernelArgs, Lease, Lent, Queue, Shared};
use crate::memory::{Buffer, DeviceBuf, HostBuf, MappedKind, MappedView, PinOptions, WritableBuffer};
use crate::placement::Where;

/// Where a kernel's code comes from.
#[derive(Debug, Clone)]
pub enum KernelCode {
    /// CUDA C++ source, compiled by NVRTC for the device's architecture on first use and kept
    /// in hetmem's kernel cache; `name` names it in messages and cache files.
    CudaC {
        /// A short name, such as the file name without `.cu`.
        name: String,
        /// The source, with the kernel as an `extern "C" __global__` function.
        source: String,
    },
    /// PTX text, JIT-compiled by the driver.
    Ptx(String),
    /// A CUBIN (ELF) image for the device's architecture.
    Cubin(Vec<u8>),
    /// A function a cudarc user already loaded, with the context it was loaded in: that must
    /// be the primary context of the GPU the stage runs on (cudarc's `CudaContext::new`), which
    /// is checked; the function must belong to it (a cudarc function cannot say).
    Cudarc {
        /// The context the function's module was loaded in.
        context: std::sync::Arc<cudarc::driver::CudaContext>,
        /// The function.
        function: cudarc::driver::CudaFunction,
    },
}

/// One kernel parameter, in the kernel's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Param {
    /// A pointer to the first byte of the frame's input buffer `index`, which the kernel may
    /// only read.
    Input(usize),
    /// A pointer to the first byte of the frame's output buffer `index`, which the kernel may
    /// read and write.
    Output(usize),
    /// A pointer to the first byte of the stage's constant buffer `index`
    /// ([`KernelStage::with_constants`]), which the kernel may only read, within its first
    /// `bytes`: uploaded once per queue, into device memory (mapped host memory by the
    /// zero-copy strategy, where its placement decides by the hybrid strategy).
    ///
    /// `bytes` is part of the kernel's signature, promised with the rest of it to
    /// [`KernelStage::new`]: [`KernelStage::with_constants`] refuses a constant of any other
    /// length, so the safe code that gives the constants cannot make the kernel read past one.
    Constant {
        /// Which constant: they are numbered from 0, each passed by at least one parameter.
        index: usize,
        /// The constant's length in bytes, all of which the kernel may read.
        bytes: usize,
    },
    /// A pointer to the first word of the stage's mapped view `index` (a flag, counter or
    /// mailbox of `hetmem::resident::mapped`, given with [`KernelStage::with_mapped`]), which
    /// the kernel touches only through `hetmem/mapped.cuh`, as the view of `kind` it is.
    ///
    /// `kind` is part of the kernel's signature, promised with the rest of it to
    /// [`KernelStage::new`]: a launch whose view `index` is missing or of another kind (a flag
    /// where the kernel expects a mailbox, a mailbox of another message size) is refused, so
    /// the safe code that gives the views cannot make the kernel reach past one.
    Mapped {
        /// Which view: they are numbered from 0 in the order [`KernelStage::with_mapped`]
        /// gives them.
        index: usize,
        /// What the kernel takes it for.
        kind: MappedKind,
    },
    /// A value of at most 8 bytes, passed by value (see [`Param::value`]).
    Value {
        /// The value's bytes, little-endian, zero-padded to 8.
        bytes: [u8; 8],
        /// How many of them are the value.
        len: u8,
    },
}

impl Param {
    /// A scalar parameter (`u32`, `f32`, `i64`, ...), passed by value as its own type.
    ///
    /// # Panics
    /// A type larger than 8 bytes (pass larger data through an input buffer).
    pub fn value<V: Pod>(value: V) -> Param {
        let source = bytemuck::bytes_of(&value);
        assert!(
            source.len() <= 8,
            "a {}-byte kernel parameter: pass larger values through a buffer",
            source.len()
        );
        let mut bytes = [0u8; 8];
        bytes[..source.len()].copy_from_slice(source);
        Param::Value { bytes, len: source.len() as u8 }
    }
}

/// A user's kernel as a [`Stage`]: its code, entry point, launch configuration and parameters,
/// and optionally a CPU closure that computes the same (the CPU backend's path and the GPU
/// path's test reference).
///
/// # Safety contract
/// hetmem cannot see what a kernel does, so the constructor is `unsafe` and its caller
/// promises, for every launch: the kernel `entry` of the code takes exactly the parameters
/// listed, in order and type (buffers as pointers to their first byte, values as their own
/// type); it reads only the input and constant buffers, within `inputs[i].bytes()` bytes of
/// each input and the `bytes` its [`Param::Constant`] declares of each constant, and writes
/// only the output buffers, within `outputs[j].bytes()` bytes of each; it touches a mapped view
/// ([`Param::Mapped`]) only through `hetmem/mapped.cuh`'s functions for that kind of view, in
/// the role the CPU does not play; it keeps no pointer after it returns and ends on its own,
/// whatever the constants' contents (a kernel that waits on a mapped view ends once the CPU
/// gives it what it waits for). Everything around the
/// launch is safe: the pipeline hands it buffers of exactly those sizes, lent to the GPU through
/// the hand-off, so the CPU cannot touch them meanwhile, and [`KernelStage::with_constants`]
/// takes only constants of the declared lengths (a clone of the stage keeps the same
/// declarations and the same check).
///
/// # Examples
/// ```no_run
/// use hetmem::stage::{ScalarType, FrameLayout, KernelCode, KernelStage, Param};
/// use hetmem::backend::cuda::LaunchConfig;
/// let source = r#"extern "C" __global__ void gain(const float* x, float* y, unsigned n, float g) {
///     for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
///         y[i] = g * x[i];
/// }"#;
/// let block = FrameLayout::samples(4096, ScalarType::F32)?;
/// // SAFETY: gain(const float*, float*, unsigned, float) reads x[0..n), writes y[0..n), with
/// // n = 4096, the length of both buffers.
/// let stage = unsafe {
///     KernelStage::new(
///         KernelCode::CudaC { name: "gain".into(), source: source.into() },
///         "gain",
///         vec![block.clone()],
///         vec![block],
///         vec![Param::Input(0), Param::Output(0), Param::value(4096u32), Param::value(0.5f32)],
///         LaunchConfig::linear(4096, 256, 1024),
///     )?
/// };
/// # Ok::<(), hetmem::Error>(())
/// ```
#[derive(Clone)]
pub struct KernelStage {
    code: Arc<KernelCode>,
    entry: String,
    inputs: Vec<FrameLayout>,
    outputs: Vec<FrameLayout>,
    params: Vec<Param>,
    config: LaunchConfig,
    /// The length of each constant, as the parameters declare it (fixed by the constructor).
    constant_bytes: Vec<usize>,
    /// Which constructor or [`KernelStage::with_constants`] call made the stage (its clones
    /// share it): a stage prepared under one id runs under that id only, so a clone given other
    /// constants cannot run with the ones another clone prepared.
    id: u64,
    constants: Vec<Arc<[u8]>>,
    /// The mapped views [`Param::Mapped`] passes, by index.
    mapped: Vec<Arc<dyn MappedView + Send + Sync>>,
    cpu: Option<Arc<CpuFn>>,
}

/// What a [`KernelStage`] keeps per queue: its kernel and its constant buffers there.
#[derive(Debug)]
pub struct KernelPrepared {
    /// `None` on the CPU backend.
    kernel: Option<Kernel>,
    constants: Vec<Constant>,
    /// The [`KernelStage`] (and its clones) this was prepared for: another stage's kernel,
    /// parameters or constants would not match this one's.
    stage: u64,
}

/// Numbers the stages [`KernelStage::new`] and [`KernelStage::with_constants`] make.
static NEXT_STAGE: AtomicU64 = AtomicU64::new(0);

/// A constant buffer uploaded for one queue.
#[derive(Debug)]
enum Constant {
    Host(Shared<HostBuf<u8>>),
    Device(Shared<DeviceBuf<u8>>),
}

impl std::fmt::Debug for KernelStage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelStage")
            .field("entry", &self.entry)
            .field("inputs", &self.inputs)
            .field("outputs", &self.outputs)
            .field("params", &self.params)
            .field("config", &self.config)
            .field("constants", &self.constants.len())
            .field("mapped", &self.mapped.len())
            .field("cpu", &self.cpu.is_some())
            .finish()
    }
}

impl KernelStage {
    /// A stage that launches `entry` of `code` with `config` on each frame's buffers (for a
    /// cudarc function, `entry` only names it in messages).
    ///
    /// # Safety
    /// See the type's [safety contract](KernelStage#safety-contract); a PTX or CUBIN image must
    /// also be complete and come from a trusted source (the driver trusts an image's own
    /// lengths).
    ///
    /// # Errors
    /// No inputs or outputs, a parameter naming a buffer that is not there, an output passed
    /// twice (one launch gets each writable buffer once), constants not numbered from 0 or
    /// declared with two lengths or none, an empty code.
    pub unsafe fn new(
        code: KernelCode,
        entry: &str,
        inputs: Vec<FrameLayout>,
        outputs: Vec<FrameLayout>,
        params: Vec<Param>,
        config: LaunchConfig,
    ) -> Result<KernelStage> {
        check_buffers(&inputs, &outputs)?;
        let bad = |problem: String| Error::invalid("kernel stage", problem);
        let mut written = vec![false; outputs.len()];
        for (position, param) in params.iter().enumerate() {
            match *param {
                Param::Input(index) if index >= inputs.len() => {
                    return Err(bad(format!("parameter {position} is input {index}, of {}", inputs.len())));
                }
                Param::Output(index) if index >= outputs.len() => {
                    return Err(bad(format!("parameter {position} is output {index}, of {}", outputs.len())));
                }
                Param::Output(index) if written[index] => {
                    return Err(bad(format!("output {index} is passed twice (parameter {position})")));
                }
                Param::Output(index) => written[index] = true,
                _ => {}
            }
        }
        let empty = match &code {
            KernelCode::CudaC { source, .. } | KernelCode::Ptx(source) => source.trim().is_empty(),
            KernelCode::Cubin(image) => image.is_empty(),
            KernelCode::Cudarc { .. } => false,
        };
        if empty || entry.is_empty() {
            return Err(bad("an empty kernel or entry point name".into()));
        }
        let constant_bytes = declared_constants(&params)?;
        Ok(KernelStage {
            code: Arc::new(code),
            entry: entry.to_string(),
            inputs,
            outputs,
            params,
            config,
            constant_bytes,
            id: NEXT_STAGE.fetch_add(1, Ordering::Relaxed),
            constants: Vec::new(),
            mapped: Vec::new(),
            cpu: None,
        })
    }

    /// Gives the constant buffers the kernel reads through [`Param::Constant`] (filter taps,
    /// a lookup table, a template): uploaded once per queue, into device memory, or mapped
    /// host memory by the zero-copy strategy (by the hybrid strategy, where its placement
    /// decides: see [`Stage::constants`]). Each must be exactly as long as its parameter
    /// declares, since the kernel reads that many bytes of it.
    ///
    /// # Errors
    /// Another number of constants than the parameters pass, or a constant of another length
    /// than its parameter declares (the error names the constant and both lengths).
    pub fn with_constants(mut self, constants: Vec<Vec<u8>>) -> Result<KernelStage> {
        let constants: Vec<Arc<[u8]>> = constants.into_iter().map(Arc::from).collect();
        check_constants(&self.constant_bytes, &constants)?;
        self.constants = constants;
        self.id = NEXT_STAGE.fetch_add(1, Ordering::Relaxed);
        Ok(self)
    }

    /// Adds a mapped flag, counter or mailbox (`hetmem::resident::mapped`) that
    /// [`Param::Mapped`] passes: the first call gives view 0, the next view 1, and so on. The
    /// stage keeps it alive; it must be of the kind its parameter declares and of the GPU the
    /// stage runs on (both checked at each launch).
    pub fn with_mapped<V: MappedView + Send + Sync + 'static>(mut self, view: Arc<V>) -> KernelStage {
        self.mapped.push(view);
        self
    }

    /// Adds the CPU path: `cpu` computes what the kernel computes, on the same buffers. The
    /// stage then runs on the CPU backend (by the CPU strategy) too.
    pub fn with_cpu(
        mut self,
        cpu: impl Fn(&[&[u8]], &mut [&mut [u8]]) -> Result<()> + Send + Sync + 'static,
    ) -> KernelStage {
        self.cpu = Some(Arc::new(cpu));
        self
    }

    /// The kernel's launch configuration.
    pub fn config(&self) -> LaunchConfig {
        self.config
    }

    /// Mapped view `index`, if it is there and of `kind`, as its parameter declares (for a
    /// `launch`, a counter the kernel adds to must be one the GPU may add to).
    fn mapped_view(
        &self,
        index: usize,
        kind: MappedKind,
        launch: bool,
    ) -> Result<&(dyn MappedView + Send + Sync)> {
        let bad = |problem: String| Error::invalid("kernel stage", problem);
        match self.mapped.get(index) {
            Some(view) if launch && view.kind().fits(kind) && !view.kind().serves_launch(kind) => {
                Err(bad(format!(
                    "mapped view {index} is a counter the CPU writes (Writer::Cpu), and the kernel adds to it \
                 (kernel_adds: true): its adds would race the CPU's; make the counter with Writer::Gpu"
                )))
            }
            Some(view) if view.kind().fits(kind) => Ok(&**view),
            Some(view) => Err(bad(format!(
                "mapped view {index} is a {:?}; the kernel's parameter takes a {kind:?}: give views in the \
                 order and of the kinds the parameters declare",
                view.kind()
            ))),
            None => Err(bad(format!(
                "a parameter passes mapped view {index}, of {}: give each with KernelStage::with_mapped",
                self.mapped.len()
            ))),
        }
    }

    /// Checks that every mapped view a parameter passes is there, of the kind it declares.
    fn check_mapped(&self) -> Result<()> {
        for param in &self.params {
            if let Param::Mapped { index, kind } = *param {
                self.mapped_view(index, kind, false)?;
            }
        }
        Ok(())
    }

    /// The kernel, loaded into `device` (compiled first for CUDA C; modules are kept per
    /// device, so each code is compiled and loaded once).
    fn load(&self, device: &CudaDevice) -> Result<Kernel> {
        let module = match &*self.code {
            KernelCode::CudaC { name, source } => crate::kernels::user_module(device, name, source)?,
            KernelCode::Ptx(text) => self.load_image(device, text.as_bytes())?,
            KernelCode::Cubin(image) => self.load_image(device, image)?,
            KernelCode::Cudarc { context, function } => {
                return Ok(device.kernel_from_cudarc(context, function, &self.entry)?);
            }
        };
        Ok(module.kernel(&self.entry)?)
    }

    fn load_image(&self, device: &CudaDevice, image: &[u8]) -> Result<Arc<Module>> {
        // The image's SHA-256 keys the device's module table: two images never share a module.
        let digest: String = Sha256::digest(image).iter().map(|byte| format!("{byte:02x}")).collect();
        device.cached_module(&format!("image:{digest}"), || {
            // SAFETY: the constructor's caller promised a complete image from a trusted source.
            Ok(unsafe { Module::load(device, image) }?)
        })
    }
}

impl Stage for KernelStage {
    type Prepared = KernelPrepared;

    fn inputs(&self) -> &[FrameLayout] {
        &self.inputs
    }

    fn outputs(&self) -> &[FrameLayout] {
        &self.outputs
    }

    fn runs(&self) -> Runs {
        Runs { gpu: true, cpu: self.cpu.is_some() }
    }

    /// Each constant buffer, read whole by every block of the launch (what a kernel that
    /// takes a table by pointer typically does; a kernel that reads less only makes device
    /// memory look more worth it).
    fn constants(&self, _device: &crate::backend::Device) -> Vec<ConstantUse> {
        let (x, y, z) = self.config.grid;
        let blocks = u64::from(x) * u64::from(y) * u64::from(z);
        self.constants
            .iter()
            .enumerate()
            .map(|(index, bytes)| ConstantUse {
                name: format!("constant {index}"),
                bytes: bytes.len() as u64,
                bytes_read_per_frame: bytes.len() as u64 * blocks,
            })
            .collect()
    }

    fn prepare(&self, queue: &Queue, _strategy: Strategy, places: &[Where]) -> Result<KernelPrepared> {
        // On every backend, so that code tested on the CPU keeps the GPU's rule (each launch
        // checks again).
        self.check_mapped()?;
        let Some(gpu) = queue.cuda_device() else {
            return Ok(KernelPrepared { kernel: None, constants: Vec::new(), stage: self.id });
        };
        // Checked again where the constants meet the kernel: a stage cloned before
        // `with_constants` has none, and the kernel reads each declared length.
        check_constants(&self.constant_bytes, &self.constants)?;
        if places.len() != self.constants.len() {
            return Err(Error::invalid(
                "kernel stage",
                format!("{} constant places for {} constants", places.len(), self.constants.len()),
            ));
        }
        let device = queue.device();
        let constants = self
            .constants
            .iter()
            .zip(places)
            .map(|(bytes, place)| -> Result<Constant> {
                Ok(if *place == Where::Mapped {
                    let mut buffer = HostBuf::<u8>::pinned(&device, bytes.len(), PinOptions::default())?;
                    buffer.as_mut_slice().copy_from_slice(bytes);
                    Constant::Host(queue.share(buffer))
                } else {
                    let mut buffer = DeviceBuf::<u8>::new(&device, bytes.len())?;
                    buffer.copy_from_slice(bytes)?;
                    Constant::Device(queue.share(buffer))
                })
            })
            .collect::<Result<_>>()?;
        Ok(KernelPrepared { kernel: Some(self.load(gpu)?), constants, stage: self.id })
    }

    fn queue<I, O>(
        &self,
        prepared: &mut KernelPrepared,
        queue: &Queue,
        inputs: &[I],
        outputs: &mut [Lent<O>],
    ) -> Result<()>
    where
        I: Lease,
        I::Buf: Buffer<Elem = u8>,
        O: WritableBuffer<Elem = u8>,
    {
        if prepared.stage != self.id {
            return Err(Error::invalid(
                "kernel stage",
                "prepared for another KernelStage (another kernel, parameters or constants): prepare \
                 this stage for the queue",
            ));
        }
        let kernel = prepared.kernel.as_ref().ok_or_else(|| Error::NeedsGpu {
            what: "the kernel stage".into(),
            detail: "it was prepared on a queue of the CPU backend, which has no GPU to run it".into(),
        })?;
        check_lengths("input", inputs.iter().map(Lease::len), &self.inputs)?;
        check_lengths("output", outputs.iter().map(Lease::len), &self.outputs)?;
        let mut outputs: Vec<Option<&mut Lent<O>>> = outputs.iter_mut().map(Some).collect();
        let mut args = KernelArgs::new();
        for param in &self.params {
            args = match *param {
                Param::Input(index) => args.read(&inputs[index]),
                Param::Output(index) => {
                    args.write(outputs[index].take().expect("the constructor passes each output once"))
                }
                Param::Value { bytes, len } => args.value_bytes(&bytes[..usize::from(len)]),
                Param::Mapped { index, kind } => args.mapped(self.mapped_view(index, kind, true)?),
                Param::Constant { index, .. } => match &prepared.constants[index] {
                    Constant::Host(buffer) => args.read(buffer),
                    Constant::Device(buffer) => args.read(buffer),
                },
            };
        }
        // SAFETY: the constructor's caller promised (KernelStage's safety contract) that the
        // kernel takes these parameters in this order and type and stays within each buffer's
        // layout and each constant's declared length; every buffer is one frame of its layout
        // (checked above), the kernel and every constant the stage's own, of its declared
        // length (prepared for this stage or a clone of it, checked above; lengths checked by
        // `prepare`, which uploaded them), each lent or shared with this queue (checked when its
        // address is resolved), and `launch` records the launch on each.
        unsafe { queue.launch(kernel, self.config, args) }
    }

    fn run_cpu(&self, inputs: &[&[u8]], outputs: &mut [&mut [u8]]) -> Result<()> {
        let cpu = self.cpu.as_ref().ok_or_else(|| {
            Error::invalid(
                "kernel stage",
                format!(
                    "`{}` has no CPU path: give one with KernelStage::with_cpu, or run it on a GPU",
                    self.entry
                ),
            )
        })?;
        cpu(inputs, outputs)
    }
}

/// The length of each constant the parameters pass, by index: every index from 0 up passed
/// by some parameter, each with one length of at least a byte.
fn declared_constants(params: &[Param]) -> Result<Vec<usize>> {
    let bad = |problem: String| Error::invalid("kernel stage", problem);
    let mut declared: Vec<Option<usize>> = Vec::new();
    for (position, param) in params.iter().enumerate() {
        let Param::Constant { index, bytes } = *param else { continue };
        // No more constants than parameters: an index beyond them leaves one unpassed.
        if index >= params.len() {
            return Err(bad(format!(
                "parameter {position} is constant {index}: number the constants from 0, each passed by a parameter"
            )));
        }
        if bytes == 0 {
            return Err(bad(format!(
                "parameter {position} declares constant {index} of 0 bytes: give the length the kernel reads"
            )));
        }
        if declared.len() <= index {
            declared.resize(index + 1, None);
        }
        match declared[index] {
            Some(earlier) if earlier != bytes => {
                return Err(bad(format!(
                    "parameter {position} declares constant {index} of {bytes} bytes, an earlier one of \
                     {earlier}: give each constant one length"
                )));
            }
            _ => declared[index] = Some(bytes),
        }
    }
    declared
        .iter()
        .enumerate()
        .map(|(index, bytes)| {
            bytes.ok_or_else(|| {
                bad(format!(
                    "no parameter passes constant {index}: number the constants from 0, each passed by a parameter"
                ))
            })
        })
        .collect()
}

/// Checks that `constants` are the ones `declared` asks for: as many, each of its length.
fn check_constants(declared: &[usize], constants: &[Arc<[u8]>]) -> Result<()> {
    if constants.len() != declared.len() {
        return Err(Error::invalid(
            "kernel stage",
            format!(
                "{} constants given; the kernel's parameters pass {}: give them with \
                 KernelStage::with_constants",
                constants.len(),
                declared.len()
            ),
        ));
    }
    for (index, (constant, &bytes)) in constants.iter().zip(declared).enumerate() {
        if constant.len() != bytes {
            return Err(Error::invalid(
                "kernel stage",
                format!(
                    "constant {index} holds {} bytes; its parameter declares {bytes}, which the kernel \
                     reads: give a constant of exactly {bytes} bytes",
                    constant.len()
                ),
            ));
        }
    }
    Ok(())
}

/// Checks that each buffer is exactly one frame of its layout.
pub(crate) fn check_lengths(
    what: &str,
    lengths: impl Iterator<Item = usize>,
    layouts: &[FrameLayout],
) -> Result<()> {
    let lengths: Vec<usize> = lengths.collect();
    if lengths.len() != layouts.len() {
        return Err(Error::invalid(
            "stage buffers",
            format!("{} {what} buffers for {} layouts", lengths.len(), layouts.len()),
        ));
    }
    for (index, (len, layout)) in lengths.iter().zip(layouts).enumerate() {
        if *len != layout.bytes() {
            return Err(Error::invalid(
                "stage buffers",
                format!("{what} {index} holds {len} bytes, its layout {}", layout.bytes()),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stage::ScalarType;

    fn code() -> KernelCode {
        KernelCode::CudaC { name: "k".into(), source: "extern \"C\" __global__ void k() {}".into() }
    }

    #[test]
    fn parameters_must_name_buffers_that_are_there_and_each_output_once() {
        let block = FrameLayout::samples(64, ScalarType::U8).unwrap();
        let config = LaunchConfig::linear(64, 64, 1);
        let make = |params| {
            // SAFETY: never launched; only the constructor's checks run.
            unsafe { KernelStage::new(code(), "k", vec![block.clone()], vec![block.clone()], params, config) }
        };
        assert!(make(vec![Param::Input(0), Param::Input(0), Param::Output(0), Param::value(1u32)]).is_ok());
        let error = make(vec![Param::Input(1)]).unwrap_err().to_string();
        assert!(error.contains("input 1, of 1"), "{error}");
        let error = make(vec![Param::Output(0), Param::Output(0)]).unwrap_err().to_string();
        assert!(error.contains("passed twice"), "{error}");
        assert!(make(vec![Param::Output(3)]).is_err());
        // SAFETY: as above.
        let empty = unsafe { KernelStage::new(code(), "k", vec![], vec![block.clone()], vec![], config) };
        assert!(empty.unwrap_err().to_string().contains("at least one"));
    }

    #[test]
    fn constants_are_numbered_from_0_each_with_one_length() {
        let block = FrameLayout::samples(64, ScalarType::U8).unwrap();
        let make = |constants: &[(usize, usize)]| {
            let mut params = vec![Param::Input(0), Param::Output(0)];
            params.extend(constants.iter().map(|&(index, bytes)| Param::Constant { index, bytes }));
            // SAFETY: never launched; only the constructor's checks run.
            unsafe {
                KernelStage::new(
                    code(),
                    "k",
                    vec![block.clone()],
                    vec![block.clone()],
                    params,
                    LaunchConfig::linear(64, 64, 1),
                )
            }
            .map(|stage| stage.constant_bytes)
        };
        assert_eq!(make(&[(1, 8), (0, 1024), (1, 8)]).unwrap(), [1024, 8]);
        let error = make(&[(1, 8)]).unwrap_err().to_string();
        assert!(error.contains("no parameter passes constant 0"), "{error}");
        let error = make(&[(0, 8), (0, 16)]).unwrap_err().to_string();
        assert!(error.contains("constant 0 of 16 bytes, an earlier one of 8"), "{error}");
        let error = make(&[(0, 0)]).unwrap_err().to_string();
        assert!(error.contains("constant 0 of 0 bytes"), "{error}");
        // An index no list of constants could reach is refused before anything is sized by it.
        let error = make(&[(usize::MAX, 8)]).unwrap_err().to_string();
        assert!(error.contains("number the constants from 0"), "{error}");
    }

    #[test]
    fn values_keep_their_bytes() {
        assert_eq!(Param::value(0x0102_0304u32), Param::Value { bytes: [4, 3, 2, 1, 0, 0, 0, 0], len: 4 });
        assert_eq!(Param::value(1.5f32), Param::Value { bytes: [0, 0, 0xc0, 0x3f, 0, 0, 0, 0], len: 4 });
    }

    #[test]
    fn a_stage_without_a_cpu_path_says_how_to_get_one() {
        let block = FrameLayout::samples(8, ScalarType::U8).unwrap();
        // SAFETY: never launched.
        let stage = unsafe {
            KernelStage::new(
                code(),
                "k",
                vec![block.clone()],
                vec![block],
                vec![],
                LaunchConfig::linear(8, 8, 1),
            )
        }
        .unwrap();
        assert_eq!(stage.runs(), Runs { gpu: true, cpu: false });
        let mut output = [0u8; 8];
        let error = stage.run_cpu(&[&[1; 8]], &mut [&mut output]).unwrap_err().to_string();
        assert!(error.contains("with_cpu"), "{error}");
        let doubled = stage.with_cpu(|inputs, outputs| {
            outputs[0].iter_mut().zip(inputs[0]).for_each(|(y, x)| *y = 2 * x);
            Ok(())
        });
        doubled.run_cpu(&[&[3; 8]], &mut [&mut output]).unwrap();
        assert_eq!(output, [6; 8]);
    }
}
