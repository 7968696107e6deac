//! Shared test data: fresh random values every run, never zeros.

/// `len` random 32-bit words from a fresh seed; the seed is printed so a failure can be replayed.
pub fn random_words(len: usize) -> Vec<u32> {
    let seed = fastrand::u64(..);
    eprintln!("random_words: seed {seed:#x}");
    let mut rng = fastrand::Rng::with_seed(seed);
    (0..len).map(|_| rng.u32(..)).collect()
}

/// The index and values of the first difference between two slices, if any.
pub fn first_mismatch<T: PartialEq + Copy>(got: &[T], expected: &[T]) -> Option<(usize, T, T)> {
    assert_eq!(got.len(), expected.len(), "lengths differ");
    got.iter().zip(expected).position(|(g, e)| g != e).map(|index| (index, got[index], expected[index]))
}
