// y[i] = x[i] * a + b (mod 2^32) over n 32-bit words.
//
// The smallest kernel that proves a path end to end: every input word is read once, every
// output word written once, and a wrong index or a missed word changes the result. The CUDA
// smoke test and the memory-kind tests run it against the same formula on the CPU.

extern "C" __global__ void affine_u32(const unsigned int* __restrict__ x,
                                      unsigned int* __restrict__ y,
                                      unsigned long long n,
                                      unsigned int a,
                                      unsigned int b) {
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        y[i] = x[i] * a + b;
    }
}
