// The CT computation's kernels (hetmem::ops::ct): per-organ statistics read through a label
// template, a masked separable 3-D Gaussian, and a maximum-intensity projection.
//
// Every volume pointer may be device memory or mapped host memory (zero-copy): placement
// chooses, the kernels read either the same way. Loads are 16 bytes wide where they can be, so
// a mapped buffer crosses the link in whole transactions; the volume of HU values is read only
// where the template says the organ is (a masked read), which is why the template is the hot
// buffer and the volume the cold one.
//
// The f32 arithmetic uses __fmul_rn / __fadd_rn / __fdiv_rn so the compiler does not contract
// it into FMAs: the CPU reference performs the same operations in the same order.

#define HISTOGRAM_BINS 256
// count, sum, sum of squares, then the histogram.
#define STATS_WORDS (3 + HISTOGRAM_BINS)

extern "C" __global__ void zero_u64(unsigned long long* __restrict__ out, unsigned long long n) {
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        out[i] = 0;
    }
}

__device__ __forceinline__ void accumulate(int v, int lo, int hi, long long span, unsigned long long* count,
                                           unsigned long long* sum, unsigned long long* squares,
                                           unsigned long long* bins) {
    *count += 1;
    *sum += (unsigned long long)(long long)v;
    *squares += (unsigned long long)((long long)v * v);
    if (v >= lo && v <= hi) {
        atomicAdd(&bins[((long long)(v - lo) * HISTOGRAM_BINS) / span], 1ull);
    }
}

// Adds the statistics of the voxels labelled `organ` into out[0..STATS_WORDS): count, sum and
// sum of squares of their HU values (sums modulo 2^64, two's complement), and a 256-bin
// histogram of those within [lo, hi]. `out` starts zeroed (zero_u64). hu and labels hold n
// voxels and are 16-byte aligned.
extern "C" __global__ void organ_window_stats(const short* __restrict__ hu, const unsigned char* __restrict__ labels,
                                              unsigned long long n, unsigned int organ, int lo, int hi,
                                              unsigned long long* __restrict__ out) {
    __shared__ unsigned long long bins[HISTOGRAM_BINS];
    __shared__ unsigned long long totals[3];
    for (unsigned int i = threadIdx.x; i < HISTOGRAM_BINS; i += blockDim.x) bins[i] = 0;
    if (threadIdx.x < 3) totals[threadIdx.x] = 0;
    __syncthreads();

    const long long span = (long long)hi - lo + 1;
    const unsigned char wanted = (unsigned char)organ;
    unsigned long long count = 0, sum = 0, squares = 0;
    const unsigned long long groups = n / 16;
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    const unsigned long long first = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (unsigned long long g = first; g < groups; g += stride) {
        const uint4 label_words = reinterpret_cast<const uint4*>(labels)[g];
        const unsigned char* l = reinterpret_cast<const unsigned char*>(&label_words);
        for (int half = 0; half < 2; ++half) {
            bool any = false;
            for (int k = 0; k < 8; ++k) any |= l[half * 8 + k] == wanted;
            if (!any) continue;
            const uint4 hu_words = reinterpret_cast<const uint4*>(hu)[g * 2 + half];
            const short* h = reinterpret_cast<const short*>(&hu_words);
            for (int k = 0; k < 8; ++k) {
                if (l[half * 8 + k] == wanted) accumulate(h[k], lo, hi, span, &count, &sum, &squares, bins);
            }
        }
    }
    for (unsigned long long i = groups * 16 + first; i < n; i += stride) {
        if (labels[i] == wanted) accumulate(hu[i], lo, hi, span, &count, &sum, &squares, bins);
    }
    atomicAdd(&totals[0], count);
    atomicAdd(&totals[1], sum);
    atomicAdd(&totals[2], squares);
    __syncthreads();
    if (threadIdx.x < 3) atomicAdd(&out[threadIdx.x], totals[threadIdx.x]);
    for (unsigned int i = threadIdx.x; i < HISTOGRAM_BINS; i += blockDim.x) {
        if (bins[i] != 0) atomicAdd(&out[3 + i], bins[i]);
    }
}

// The masked Gaussian's start: num = hu where the label is `organ`, else 0; den = 1 there,
// else 0.
extern "C" __global__ void mask_organ(const short* __restrict__ hu, const unsigned char* __restrict__ labels,
                                      unsigned long long n, unsigned int organ, float* __restrict__ num,
                                      float* __restrict__ den) {
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const bool in = labels[i] == (unsigned char)organ;
        num[i] = in ? (float)hu[i] : 0.0f;
        den[i] = in ? 1.0f : 0.0f;
    }
}

// One axis of the separable Gaussian over num and den (depth x height x width, x fastest):
// out[v] = sum over k = -radius..radius, in that order, of weights[k + radius] * in[v + k along
// the axis], taps outside the volume skipped. axis 0 = x, 1 = y, 2 = z.
extern "C" __global__ void smooth_axis(const float* __restrict__ num_in, const float* __restrict__ den_in,
                                       float* __restrict__ num_out, float* __restrict__ den_out,
                                       unsigned long long depth, unsigned long long height,
                                       unsigned long long width, unsigned int axis,
                                       const float* __restrict__ weights, int radius) {
    const unsigned long long n = depth * height * width;
    const unsigned long long extent = axis == 0 ? width : axis == 1 ? height : depth;
    const unsigned long long step = axis == 0 ? 1 : axis == 1 ? width : width * height;
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const long long at = (long long)((i / step) % extent);
        float num = 0.0f, den = 0.0f;
        for (int k = -radius; k <= radius; ++k) {
            const long long j = at + k;
            if (j < 0 || j >= (long long)extent) continue;
            const unsigned long long source = i + (unsigned long long)((long long)k * (long long)step);
            const float w = weights[k + radius];
            num = __fadd_rn(num, __fmul_rn(w, num_in[source]));
            den = __fadd_rn(den, __fmul_rn(w, den_in[source]));
        }
        num_out[i] = num;
        den_out[i] = den;
    }
}

// The masked Gaussian's end: out = num / den inside the organ, the HU value outside.
extern "C" __global__ void masked_finish(const short* __restrict__ hu, const unsigned char* __restrict__ labels,
                                         unsigned long long n, unsigned int organ, const float* __restrict__ num,
                                         const float* __restrict__ den, float* __restrict__ out) {
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        out[i] = labels[i] == (unsigned char)organ ? __fdiv_rn(num[i], den[i]) : (float)hu[i];
    }
}

// Maximum-intensity projection through the height (front to back): out[z][x] = max over y of
// hu[z][y][x], a depth x width picture.
extern "C" __global__ void mip_height(const short* __restrict__ hu, unsigned long long depth,
                                      unsigned long long height, unsigned long long width,
                                      short* __restrict__ out) {
    const unsigned long long n = depth * width;
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const unsigned long long z = i / width, x = i % width;
        const short* column = hu + z * height * width + x;
        short best = column[0];
        for (unsigned long long y = 1; y < height; ++y) {
            const short v = column[y * width];
            best = v > best ? v : best;
        }
        out[i] = best;
    }
}
