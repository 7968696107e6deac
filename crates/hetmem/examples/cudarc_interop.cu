// A user's own kernels, launched through cudarc on memory hetmem lends: the cudarc_interop
// example and the tests in tests/cudarc_interop.rs.

// out[i] = in[i] * a + b (wrapping), over n words, grid-stride.
extern "C" __global__ void scale_add(const unsigned* in, unsigned* out, unsigned n, unsigned a, unsigned b) {
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        out[i] = in[i] * a + b;
    }
}

// scale_add after `nanos` nanoseconds of GPU time: slow enough that a CPU that did not wait for
// it would still see the output's old contents.
extern "C" __global__ void slow_scale_add(
    const unsigned* in, unsigned* out, unsigned n, unsigned a, unsigned b, unsigned long long nanos) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < nanos);
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        out[i] = in[i] * a + b;
    }
}
