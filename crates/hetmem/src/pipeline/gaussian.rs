//! The Gaussian blur's frame filter and rings: constructors that build the stage from a frame
//! format and a kernel (the stage itself is `ops::gaussian::GaussianStage`, which knows nothing
//! of filters and rings).

use super::{FanOutRing, FrameFilter, FrameRing, RingOptions, Strategy};
use crate::backend::Device;
use crate::error::Result;
use crate::ops::gaussian::{FrameFormat, Gaussian, GaussianStage};

impl FrameFilter<GaussianStage> {
    /// A blur of `format` frames with `kernel` on `device` by `strategy`.
    ///
    /// # Errors
    /// As for [`FrameFilter::with_stage`].
    pub fn new(device: &Device, strategy: Strategy, format: FrameFormat, kernel: &Gaussian) -> Result<Self> {
        FrameFilter::with_stage(device, strategy, GaussianStage::new(format, kernel)?)
    }

    /// The frame format.
    pub fn format(&self) -> &FrameFormat {
        self.stage().format()
    }
}

impl FrameRing<GaussianStage> {
    /// A ring blurring `format` frames with `kernel` on `device` by `strategy`.
    ///
    /// # Errors
    /// As for [`FrameRing::with_stage`].
    pub fn new(
        device: &Device,
        strategy: Strategy,
        format: FrameFormat,
        kernel: &Gaussian,
        options: RingOptions,
    ) -> Result<Self> {
        FrameRing::with_stage(device, strategy, GaussianStage::new(format, kernel)?.streamed(), options)
    }
}

impl FanOutRing<GaussianStage> {
    /// One ring per device, all blurring `format` frames with `kernel` by `strategy`.
    ///
    /// # Errors
    /// As for [`FanOutRing::with_stage`].
    pub fn new(
        devices: &[Device],
        strategy: Strategy,
        format: FrameFormat,
        kernel: &Gaussian,
        options: RingOptions,
    ) -> Result<Self> {
        FanOutRing::with_stage(devices, strategy, &GaussianStage::new(format, kernel)?.streamed(), options)
    }
}
