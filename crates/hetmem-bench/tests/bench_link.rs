//! `link` and `compare` end to end: a tiny measurement on each backend. On a GPU
//! every path runs, and the measurement itself fails if any kernel checksum, copy or written
//! pattern differs from the CPU's; here we also check the figures are real.

use hetmem::Device;
use hetmem_bench::compare;
use hetmem_bench::link::{self, Direction, LatencyPath, LinkOptions, LinkPath};

use hetmem::testing::cuda_device_or_skip;

use crate::support::{assert_child_passes, child_role, cpu_device, on_every_backend};

fn tiny() -> LinkOptions {
    LinkOptions {
        sizes: vec![64 << 10, 1 << 20],
        paths: LinkPath::ALL.to_vec(),
        repeats: 3,
        warm_up: 1,
        latency_sizes: vec![4, 4096],
        latency_samples: 20,
        completion: true,
        cold_cpu_cache: true,
    }
}

fn positive(value: f64) -> bool {
    value.is_finite() && value > 0.0
}

fn check_link(device: &Device) {
    let report = link::measure(device, &tiny()).unwrap();
    let gpu = device.as_cuda().is_some();
    assert_eq!(report.gpu_measured, gpu);
    assert_eq!(report.gpu_not_measured_because.is_some(), !gpu);
    let expected_paths = if gpu { LinkPath::ALL.len() } else { 1 };
    assert_eq!(report.bandwidth.len(), 2 * expected_paths, "one cell per path and size");
    for cell in &report.bandwidth {
        let what = format!("{} at {}", cell.path, cell.bytes);
        assert!(positive(cell.gb_s.min) && positive(cell.gb_s.median), "{what}: {:?}", cell.gb_s);
        assert!(cell.gb_s.min <= cell.gb_s.median && cell.gb_s.median <= cell.gb_s.p99, "{what}");
        assert_eq!(cell.gb_s.samples, tiny().repeats_at(cell.bytes), "{what}");
        assert!(cell.gb_s.samples > 3, "{what}: small cells take more than --repeats");
        assert!(!cell.verified_by.is_empty(), "{what}");
        // Host copies and device-memory reads cross no link: no copy-engine ceiling.
        let crosses_the_link = !matches!(cell.direction, Direction::Host | Direction::Device);
        assert_eq!(cell.ratio_to_ceiling.is_some(), crosses_the_link, "{what}");
        if let Some(ratio) = cell.ratio_to_ceiling {
            assert!(positive(ratio), "{what}: ratio {ratio}");
        }
    }
    assert_eq!(report.ceiling.is_some(), gpu);
    if let Some(ceiling) = report.ceiling {
        assert!(positive(ceiling.h2d_gb_s) && positive(ceiling.d2h_gb_s));
        let best_h2d = report.bandwidth.iter().filter(|c| c.path == LinkPath::PinnedAsyncH2d);
        assert!(best_h2d.map(|c| c.ratio_to_ceiling.unwrap()).any(|ratio| (ratio - 1.0).abs() < 1e-9));
    }
    for cell in &report.latency {
        match (cell.path, cell.us) {
            // Every doorbell reply was checked against the CPU while it was measured.
            (LatencyPath::Doorbell, us) => assert_eq!(us.is_some_and(|us| positive(us.median)), gpu),
            (path, Some(us)) => assert!(positive(us.median), "{path:?}: {us:?}"),
            (path, None) => panic!("{path:?} at {} bytes was not measured", cell.bytes),
        }
    }
    let host_latencies = report.latency.iter().filter(|cell| cell.path == LatencyPath::HostMemcpy).count();
    assert_eq!(host_latencies, 2);
    assert_eq!(report.completion.is_some(), gpu);
    // The placement profile comes from a GPU run's cells; a kernel reads device memory faster
    // than mapped host memory over the link.
    match report.profile() {
        Ok(profile) => {
            assert!(gpu);
            assert!(profile.device_read_gb_s > profile.mapped_read_gb_s, "{profile:?}");
        }
        Err(error) => assert!(!gpu && error.to_string().contains("device_read"), "{error}"),
    }
    if gpu {
        assert!(
            report
                .latency
                .iter()
                .any(|cell| cell.path == LatencyPath::MappedFlagRoundTrip && cell.us.is_some())
        );
        assert!(
            report.latency.iter().any(|cell| cell.path == LatencyPath::ZeroCopyKernelRead && cell.bytes == 4)
        );
    }
}

#[test]
fn a_tiny_link_measurement_is_checked_and_its_figures_are_real() {
    const TEST: &str = "bench_link::a_tiny_link_measurement_is_checked_and_its_figures_are_real";
    if child_role().as_deref() == Some("gpu") {
        let gpu = hetmem::backend::cuda::CudaDevice::open(0).unwrap();
        return check_link(&Device::Cuda(gpu));
    }
    check_link(&cpu_device());
    if cuda_device_or_skip("a_tiny_link_measurement_is_checked_and_its_figures_are_real").is_none() {
        return;
    }
    // In a process of its own: the completion signals are measured with a gate kernel, and
    // while it waits any other test's call that synchronises the device waits for it.
    assert_child_passes(TEST, "gpu");
}

#[test]
fn the_compare_table_takes_its_cells_from_the_link_measurement() {
    on_every_backend("the_compare_table_takes_its_cells_from_the_link_measurement", |device| {
        let mut options = tiny();
        options.latency_sizes = vec![compare::SMALL_BYTES];
        options.completion = false;
        let report = link::measure(device, &options).unwrap();
        let table = compare::table(&report, 1 << 20);
        assert_eq!(table.rows.len(), 5);
        for row in &table.rows {
            let measured = device.as_cuda().is_some() || row.method == "host_memcpy";
            assert_eq!(row.latency_us.is_some_and(positive), measured, "{}", row.method);
            assert_eq!(row.bandwidth_gb_s.is_some_and(positive), measured, "{}", row.method);
        }
    });
}
