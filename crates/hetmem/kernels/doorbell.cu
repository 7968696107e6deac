// The doorbell: a persistent kernel (one block) that serves small requests the CPU writes into
// mapped host memory, and replies there. Layout (resident/doorbell/protocol.rs mirrors it, in
// words):
//
//   control, 128 bytes at the start:
//     [0] stop     the CPU writes 1: exit once no request is waiting
//     [1] started  the kernel writes 1 when it runs
//     [2] exited   the kernel writes 1 as its last act
//   then `depth` slots of SLOT_WORDS words each; request k (k = 1, 2, ...) uses slot (k-1) % depth:
//     [0] the doorbell word, which the CPU writes LAST, with release semantics:
//         bits 0-15 k mod 2^16, bits 16-26 the sample count, bits 27-31 the opcode
//         (depth <= 256, so k mod 2^16 tells request k from the slot's previous one, k - depth)
//     [3] tap count  [4] gain (f32 bits; milliseconds for the test-only wedge)
//     [16..80)     FIR taps (f32, at most 64)
//     [80..1104)   samples (f32, at most 1024 = 4 KiB)
//     [1104] reply sequence  the kernel writes k LAST, after a system-scope fence
//     [1105] status: 0 done, 1 unknown opcode, 2 stopped while stalled
//     [1120..2144) reply samples
//
// Thread 0 polls the next slot's doorbell word with acquire loads at system scope: one read
// over the link tells it that request k has arrived, its opcode and its size. The block then
// stages the rest of the request (samples, taps, tap count, gain) in one parallel pass into
// shared memory (volatile loads, which bypass L1 so a slot
// reused `depth` requests later is never served from a stale line), computes, writes the
// reply, synchronises, and thread 0 fences at system scope once and publishes the reply
// sequence with a release store. Arithmetic: gain is one f32 multiply; FIR is y[i] = sum_j taps[j] * x[i-j] (x before
// the block is 0), accumulated from j = 0 up with fmaf: bit-exact with the CPU's mul_add.

#define STOP 0
#define STARTED 1
#define EXITED 2
#define CONTROL_WORDS 32
#define SLOT_WORDS 2144
#define REQ_SEQ 0
#define SEQ_MASK 0xFFFFu
#define LEN_SHIFT 16
#define LEN_MASK 0x7FFu
#define OP_SHIFT 27
#define REQ_TAPS 3
#define REQ_GAIN 4
#define TAPS 16
#define SAMPLES 80
#define REPLY_SEQ 1104
#define REPLY_STATUS 1105
#define REPLY_SAMPLES 1120
#define MAX_SAMPLES 1024
#define MAX_TAPS 64
#define STOP_POLLS 256

#define OP_GAIN 1
#define OP_FIR 2
// Tests only: spin until stop, so the CPU's watchdog can be seen to fire.
#define OP_STALL 3
// Tests only: spin for the gain word's milliseconds, ignoring stop: a kernel that does not
// stop when asked, for the bounded shutdown.
#define OP_WEDGE 4

__device__ __forceinline__ unsigned int load_acquire(const unsigned int* address) {
    unsigned int value;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(value) : "l"(address) : "memory");
    return value;
}

__device__ __forceinline__ unsigned long long global_ns() {
    unsigned long long ns;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
    return ns;
}

__device__ __forceinline__ void store_release(unsigned int* address, unsigned int value) {
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(address), "r"(value) : "memory");
}

extern "C" __global__ void doorbell(unsigned int* words, unsigned int depth) {
    __shared__ float samples[MAX_SAMPLES];
    __shared__ float taps[MAX_TAPS];
    // go (0: exit, 1: serve), opcode, samples, taps, gain bits
    __shared__ unsigned int command[5];
    unsigned int* control = words;
    if (threadIdx.x == 0) {
        store_release(&control[STARTED], 1);
    }
    for (unsigned int expected = 1;; ++expected) {
        unsigned int* slot = words + CONTROL_WORDS + (size_t)((expected - 1) % depth) * SLOT_WORDS;
        if (threadIdx.x == 0) {
            unsigned int bell = 0;
            unsigned int go = 0;
            // One read over the link per poll; the stop word only every STOP_POLLS polls, so
            // the request is seen as soon as it lands.
            for (unsigned int polls = 1;; ++polls) {
                bell = load_acquire(&slot[REQ_SEQ]);
                if ((bell & SEQ_MASK) == (expected & SEQ_MASK)) {
                    go = 1;
                    break;
                }
                if (polls % STOP_POLLS == 0 && load_acquire(&control[STOP]) != 0) {
                    break;
                }
            }
            command[0] = go;
            command[1] = bell >> OP_SHIFT;
            command[2] = min((bell >> LEN_SHIFT) & LEN_MASK, (unsigned int)MAX_SAMPLES);
        }
        __syncthreads();
        if (command[0] == 0) {
            break;
        }
        const unsigned int opcode = command[1];
        const unsigned int len = command[2];
        // One parallel pass over the link for the rest: samples, every tap word (the count is
        // read in the same pass), the tap count and the gain.
        const volatile unsigned int* header = slot;
        const volatile float* in = (const volatile float*)(slot + SAMPLES);
        const volatile float* in_taps = (const volatile float*)(slot + TAPS);
        for (unsigned int i = threadIdx.x; i < len; i += blockDim.x) {
            samples[i] = in[i];
        }
        if (opcode == OP_FIR) {
            for (unsigned int j = threadIdx.x; j < MAX_TAPS; j += blockDim.x) {
                taps[j] = in_taps[j];
            }
        }
        if (threadIdx.x == blockDim.x - 1) {
            command[3] = min(header[REQ_TAPS], (unsigned int)MAX_TAPS);
            command[4] = header[REQ_GAIN];
        }
        __syncthreads();
        const unsigned int tap_count = command[3];
        float* out = (float*)(slot + REPLY_SAMPLES);
        unsigned int status = 0;
        if (opcode == OP_GAIN) {
            const float gain = __uint_as_float(command[4]);
            for (unsigned int i = threadIdx.x; i < len; i += blockDim.x) {
                out[i] = __fmul_rn(gain, samples[i]);
            }
        } else if (opcode == OP_FIR) {
            for (unsigned int i = threadIdx.x; i < len; i += blockDim.x) {
                float acc = 0.0f;
                const unsigned int last = min(tap_count, i + 1);
                for (unsigned int j = 0; j < last; ++j) {
                    acc = fmaf(taps[j], samples[i - j], acc);
                }
                out[i] = acc;
            }
        } else if (opcode == OP_STALL) {
            status = 2;
            if (threadIdx.x == 0) {
                while (load_acquire(&control[STOP]) == 0) {
                }
            }
        } else if (opcode == OP_WEDGE) {
            status = 2;
            if (threadIdx.x == 0) {
                const unsigned long long until = global_ns() + (unsigned long long)command[4] * 1000000ull;
                while (global_ns() < until) {
                }
            }
        } else {
            status = 1;
        }
        if (threadIdx.x == 0) {
            ((volatile unsigned int*)slot)[REPLY_STATUS] = status;
        }
        // One system-scope fence for the whole reply: the barrier orders every thread's reply
        // samples before thread 0's fence, and fences are cumulative in the PTX memory model,
        // so the samples and the status reach host memory before the sequence that covers them.
        __syncthreads();
        if (threadIdx.x == 0) {
            __threadfence_system();
            store_release(&slot[REPLY_SEQ], expected);
        }
        // `command` and the staged samples are rewritten next round only after all have read them.
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        __threadfence_system();
        store_release(&control[EXITED], 1);
    }
}
