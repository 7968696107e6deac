//! A user stage that moves the same bytes as the built-in blur, for `hetmem bench pipeline
//! --pipelined --stage user`: the ring's cost with a user's kernel, against the built-in
//! stage's in the same run.
//!
//! The kernel reads each 16-byte unit of the frame and writes it XORed with a key: one read and
//! one write of every byte, in whole aligned vectors, the access pattern a link-bound user
//! kernel has. It is given to hetmem as CUDA C through [`KernelStage`], as a user would, with
//! its CPU closure as the check.

use hetmem::backend::cuda::LaunchConfig;
use hetmem::error::Result;
use hetmem::stage::{FrameLayout, KernelCode, KernelStage, Param, ScalarType};

/// The kernel: whole 16-byte units, then the tail bytes.
const SOURCE: &str = r#"
extern "C" __global__ void xor_frame(const unsigned char* in, unsigned char* out,
                                     unsigned long long bytes, unsigned int key) {
    unsigned long long units = bytes / 16;
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    const uint4* in4 = (const uint4*)in;
    uint4* out4 = (uint4*)out;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < units; i += stride) {
        uint4 v = in4[i];
        v.x ^= key; v.y ^= key; v.z ^= key; v.w ^= key;
        out4[i] = v;
    }
    if (blockIdx.x == 0) {
        for (unsigned long long i = units * 16 + threadIdx.x; i < bytes; i += blockDim.x)
            out[i] = in[i] ^ (unsigned char)(key >> (8 * (i % 4)));
    }
}
"#;

/// The XOR stage over frames of `bytes` bytes, launched on `multiprocessors` SMs.
///
/// # Errors
/// Zero bytes.
pub fn xor_stage(bytes: usize, multiprocessors: u32, key: u32) -> Result<KernelStage> {
    let layout = FrameLayout::samples(bytes, ScalarType::U8)?;
    let config = LaunchConfig::linear(bytes / 16, 512, multiprocessors.max(1) * 8);
    // SAFETY: xor_frame(const u8* in, u8* out, u64 bytes, u32 key) takes these parameters in
    // order; with bytes = the frame's length it reads in[0..bytes) and writes out[0..bytes),
    // whole 16-byte units first (hetmem's buffers are 256-byte aligned, so uint4 accesses are
    // aligned), the tail bytes after.
    let stage = unsafe {
        KernelStage::new(
            KernelCode::CudaC { name: "xor_frame".into(), source: SOURCE.into() },
            "xor_frame",
            vec![layout.clone()],
            vec![layout],
            vec![Param::Input(0), Param::Output(0), Param::value(bytes as u64), Param::value(key)],
            config,
        )?
    };
    Ok(stage.with_cpu(move |inputs, outputs| {
        let key = key.to_le_bytes();
        outputs[0].iter_mut().zip(inputs[0]).enumerate().for_each(|(i, (y, x))| *y = x ^ key[i % 4]);
        Ok(())
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use hetmem::stage::Stage;

    #[test]
    fn the_cpu_closure_xors_every_byte_with_the_key_in_order() {
        let stage = xor_stage(37, 1, 0x0403_0201).unwrap();
        let input: Vec<u8> = (0..37).map(|i| (i * 7 + 3) as u8).collect();
        let mut output = vec![0u8; 37];
        stage.run_cpu(&[&input], &mut [&mut output]).unwrap();
        let want: Vec<u8> = input.iter().enumerate().map(|(i, x)| x ^ (1 + (i % 4) as u8)).collect();
        assert_eq!(output, want);
    }
}
