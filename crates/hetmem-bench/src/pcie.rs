//! NVML's PCIe counters sampled on a thread while a measurement runs: all the link's traffic
//! in that time (protocol, read requests and page migrations included), kept in the reports
//! beside the bytes a run counted, which stay the headline.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hetmem::backend::nvml::NvmlSession;

/// Samples NVML's PCIe counters of one GPU every 20 ms on a thread, until [`PcieSampler::stop`].
#[derive(Debug)]
pub struct PcieSampler {
    stop: Arc<AtomicBool>,
    samples: Arc<Mutex<Vec<(u32, u32)>>>,
    thread: std::thread::JoinHandle<()>,
}

impl PcieSampler {
    /// Starts sampling the GPU at PCI bus id `bus`.
    pub fn start(nvml: &NvmlSession, bus: &str) -> PcieSampler {
        let stop = Arc::new(AtomicBool::new(false));
        let samples = Arc::new(Mutex::new(Vec::new()));
        // NVML handles are per session; the thread opens its own.
        let _ = nvml;
        let thread = {
            let (stop, samples, bus) = (Arc::clone(&stop), Arc::clone(&samples), bus.to_string());
            std::thread::spawn(move || {
                let Ok(nvml) = NvmlSession::open() else { return };
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(sample) = nvml.pcie_throughput(&bus) {
                        samples.lock().unwrap_or_else(|poison| poison.into_inner()).push(sample);
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            })
        };
        PcieSampler { stop, samples, thread }
    }

    /// Mean (GPU to host, host to GPU) in MB/s, if any sample came in.
    pub fn stop(self) -> Option<(f64, f64)> {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.thread.join();
        let samples = self.samples.lock().unwrap_or_else(|poison| poison.into_inner());
        if samples.is_empty() {
            return None;
        }
        let n = samples.len() as f64;
        let mean = |pick: fn(&(u32, u32)) -> u32| {
            samples.iter().map(|s| f64::from(pick(s))).sum::<f64>() / n / 1000.0
        };
        Some((mean(|s| s.0), mean(|s| s.1)))
    }
}
