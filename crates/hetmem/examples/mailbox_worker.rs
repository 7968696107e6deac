//! A CPU producer and a resident GPU consumer exchanging work through mapped mailboxes: the
//! CPU sends pieces of fresh random work into one mailbox, a kernel that stays on the GPU
//! (examples/mailbox_worker.cu, which includes `hetmem/mapped.cuh`) takes each, computes with
//! its block, and answers through another; the CPU checks every answer against the same
//! computation of its own. No driver call per message. The kernel is CUDA C, compiled by NVRTC
//! (`hetmem::kernels::user_module`, in support/mailbox.rs). On the CPU backend a thread plays
//! the kernel's part with the same protocol.
//!
//! Run with `cargo run --release -p hetmem --example mailbox_worker [messages]` (default
//! 2000). Under `compute-sanitizer --tool racecheck` the kernel's shared-memory hand-offs are
//! checked as well.

#[path = "support/mailbox.rs"]
mod mailbox;
mod support;

use hetmem::Device;
use support::XorShift32;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let messages: usize = match std::env::args().nth(1) {
        Some(count) => count.parse().map_err(|_| format!("`{count}`: give a number of messages"))?,
        None => 2000,
    };
    if messages == 0 || messages >= u32::MAX as usize {
        return Err(format!("{messages} messages: give 1 to {}", u32::MAX - 1).into());
    }
    let device = Device::open_best()?;
    println!("device: {} ({} backend)", device.name(), device.backend());
    let mut rng = XorShift32::from_time();
    let done = mailbox::exchange(&device, messages, &mut || rng.next_u32())?;
    let micros = done.elapsed.as_secs_f64() * 1e6 / done.messages as f64;
    println!(
        "{} messages answered, each equal to the CPU's answer; {micros:.2} us per message with up to {} in flight",
        done.messages,
        mailbox::DEPTH
    );
    Ok(())
}
