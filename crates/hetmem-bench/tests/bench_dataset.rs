//! `hetmem_bench::dataset` run small on every backend: each method filters every frame, and
//! its sample matches the CPU's blur (the check inside `measure` fails the run otherwise).

use hetmem::Device;
use hetmem_bench::dataset::sparse::SparseMethod;
use hetmem_bench::dataset::{self, Backing, DatasetOptions, Method};

use crate::support::on_every_backend;

fn small(backing: Backing) -> DatasetOptions {
    // 37 x 19: rows and columns that fill no kernel block evenly. A device budget of three
    // frames, half the set; sparse chunks of 64 bytes, one in every 1,280.
    let frame = 37 * 19 * 3;
    DatasetOptions {
        frames: 6,
        width: 37,
        height: 19,
        backing,
        dir: None,
        verify: 3,
        device_budget: Some(3 * frame),
        sparse_chunk: 64,
    }
}

fn check(device: &Device, options: &DatasetOptions) {
    let report = dataset::measure(device, options).unwrap();
    let (width, height) = (options.width, options.height);
    let frame_bytes = (width * height * 3) as u64;
    assert_eq!((report.frames, report.width, report.height), (6, width, height));
    assert_eq!(report.frame_bytes, frame_bytes);
    assert_eq!(report.dataset_bytes, 6 * frame_bytes);
    assert_eq!(report.backing, options.backing);
    let methods: Vec<Method> = report.runs.iter().map(|run| run.method).collect();
    assert_eq!(methods, [Method::Mapped, Method::CopyEach]);
    for run in &report.runs {
        assert_eq!(run.verified_frames, [0, 2, 5], "{:?}", run.method);
        assert!(run.frames_s > 0.0 && run.seconds > 0.0, "{run:?}");
        let device_frames = if run.method == Method::Mapped { 0 } else { 2 };
        assert_eq!(run.device_bytes, device_frames * report.frame_bytes, "{run:?}");
    }
    // The sparse pass: both ways checked against the CPU's XOR (inside `measure`), about 5% of
    // the bytes touched, the whole set copied by copy-all within the budget it exceeds.
    let budget = options.device_budget.unwrap();
    assert!(report.dataset_bytes > budget, "the set is larger than the budget");
    assert_eq!(report.device_budget_bytes, budget);
    let methods: Vec<SparseMethod> = report.sparse.iter().map(|run| run.method).collect();
    assert_eq!(methods, [SparseMethod::Mapped, SparseMethod::CopyAll]);
    for run in &report.sparse {
        assert!(run.verified && run.seconds > 0.0, "{run:?}");
        assert!((0.04..0.07).contains(&run.share_touched), "{run:?}");
        assert!(run.device_bytes <= budget, "{run:?}");
    }
    assert_eq!((report.sparse[0].copied_bytes, report.sparse[1].copied_bytes), (0, report.dataset_bytes));
}

#[test]
fn a_small_data_set_in_pinned_memory_is_filtered_frame_by_frame_like_the_cpu() {
    on_every_backend("a_small_data_set_in_pinned_memory_is_filtered_frame_by_frame_like_the_cpu", |device| {
        check(device, &small(Backing::Host));
    });
}

#[test]
fn a_small_data_set_in_a_file_is_filtered_and_the_file_removed() {
    on_every_backend("a_small_data_set_in_a_file_is_filtered_and_the_file_removed", |device| {
        let dir = std::env::temp_dir().join(format!(
            "hetmem-dataset-test-{}-{}",
            std::process::id(),
            fastrand::u64(..)
        ));
        std::fs::create_dir(&dir).unwrap();
        check(device, &DatasetOptions { dir: Some(dir.clone()), ..small(Backing::File) });
        let left = std::fs::read_dir(&dir).unwrap().count();
        std::fs::remove_dir(&dir).unwrap();
        assert_eq!(left, 0, "the data set's file is removed");
    });
}

/// Frames wider and taller than a kernel tile (128 x 32), with rows of 903 bytes: rows and
/// frames start at every misalignment, so the kernel's 16-byte loads, and its bytes before and
/// after them, all run, at the frame's edges and between tiles.
#[test]
fn frames_of_several_unaligned_tiles_are_filtered_like_the_cpu() {
    on_every_backend("frames_of_several_unaligned_tiles_are_filtered_like_the_cpu", |device| {
        let budget = Some(3 * 301 * 37 * 3);
        check(
            device,
            &DatasetOptions { width: 301, height: 37, device_budget: budget, ..small(Backing::Host) },
        );
    });
}
