// The doorbell: a persistent kernel (one block) that serves small requests the CPU writes into
// mapped host memory, and replies there. Layout (resident/doorbell/protocol.rs mirrors it, in
// words):
//
//   control, 128 bytes at the start:
//     [0] stop     the CPU writes 1: exit once no request is waiting
//     [1] started  the kernel writes 1 when it runs
//     [2] exited   the kernel writes 1 as its last act
//   then `depth` slots of SLOT_WORDS words each; request k (k = 1, 2, ...) uses slot (k-1) % depth:
//     [0..32)      the request line: 128 bytes, four 32-byte sectors, each starting with the
//                  doorbell word (bits 0-15 k mod 2^16, bits 16-26 the sample count, bits 27-31
//                  the opcode; depth <= 256, so k mod 2^16 tells request k from the slot's
//                  previous one, k - depth), which the CPU writes after the sector's payload;
//                  [1] tap count, [2] gain (f32 bits; milliseconds for the test-only wedge);
//                  the other 26 words carry the taps, then the samples, when they fit
//     [32..96)     FIR taps (f32, at most 64), when the request does not fit its line
//     [96..1120)   samples (f32, at most 1024 = 4 KiB), likewise
//     [1120..1152) the reply line: each sector starts with k; [1] status: 0 done, 1 unknown
//                  opcode, 2 stopped while stalled; the other 27 words carry the reply samples
//                  when there are at most 27
//     [1152..2176) reply samples that do not fit the line
//
// Warp 0 polls the request line, one word per lane: one read over the link tells it that
// request k has arrived (all four sectors carry it, so no sector was read before the CPU
// finished writing it), what it is, and for a small request all of it. A larger request is
// staged from the slot's body in one parallel pass into shared memory (volatile loads, which
// bypass L1 so a slot reused `depth` requests later is never served from a stale line). The
// block computes; warp 0 writes the reply line with one store per lane, each sector's
// sequence word in the same 32-byte write as its payload, so the CPU takes the reply when all
// four sectors carry k. Replies outside the line are fenced at system scope before the line.
// Arithmetic: gain is one f32 multiply; FIR is y[i] = sum_j taps[j] * x[i-j] (x before the
// block is 0), accumulated from j = 0 up with fmaf: bit-exact with the CPU's mul_add.

#define STOP 0
#define STARTED 1
#define EXITED 2
#define CONTROL_WORDS 32
#define SLOT_WORDS 2176
#define LINE_WORDS 32
#define SECTOR_WORDS 8
#define SEQ_MASK 0xFFFFu
#define LEN_SHIFT 16
#define LEN_MASK 0x7FFu
#define OP_SHIFT 27
#define REQ_TAPS 1
#define REQ_GAIN 2
#define REQ_PAYLOAD_FROM 3
#define INLINE_REQUEST_WORDS 26
#define TAPS 32
#define SAMPLES 96
#define REPLY_LINE 1120
#define REPLY_STATUS 1
#define REPLY_PAYLOAD_FROM 2
#define INLINE_REPLY_WORDS 27
#define REPLY_SAMPLES 1152
#define MAX_SAMPLES 1024
#define MAX_TAPS 64
#define STOP_POLLS 256
#define FULL_WARP 0xFFFFFFFFu

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

// The index in the line's payload of word `lane` (words before `from` and each sector's first
// word carry none: -1).
__device__ __forceinline__ int payload_index(unsigned int lane, unsigned int from) {
    return (lane < from || lane % SECTOR_WORDS == 0) ? -1 : (int)(lane - from - lane / SECTOR_WORDS);
}

// Whether the request line warp 0 just read (lane `lane` holds `word`) is the one for round
// `expected`: its doorbell carries the round's sequence and every sector's first word matches
// it (each sector lands whole, in any order).
__device__ __forceinline__ bool line_landed(unsigned int word, unsigned int expected, unsigned int lane) {
    const unsigned int bell = __shfl_sync(FULL_WARP, word, 0);
    const bool fresh = (bell & SEQ_MASK) == (expected & SEQ_MASK) && (lane % SECTOR_WORDS != 0 || word == bell);
    return __all_sync(FULL_WARP, fresh);
}

extern "C" __global__ void doorbell(unsigned int* words, unsigned int depth) {
    __shared__ float samples[MAX_SAMPLES];
    __shared__ float taps[MAX_TAPS];
    __shared__ float reply[INLINE_REPLY_WORDS];
    // go (0: exit, 1: serve), opcode, samples, taps, gain bits, inline request
    __shared__ unsigned int command[6];
    unsigned int* control = words;
    const unsigned int lane = threadIdx.x;
    if (lane == 0) {
        store_release(&control[STARTED], 1);
    }
    for (unsigned int expected = 1;; ++expected) {
        unsigned int* slot = words + CONTROL_WORDS + (size_t)((expected - 1) % depth) * SLOT_WORDS;
        if (lane < 32) {
            unsigned int word = 0;
            unsigned int go = 0;
            // One read of the line over the link per poll; the stop word only every STOP_POLLS
            // polls, so the request is seen as soon as it lands.
            for (unsigned int polls = 1;; ++polls) {
                word = ((const volatile unsigned int*)slot)[lane];
                if (line_landed(word, expected, lane)) {
                    go = 1;
                    break;
                }
                if (polls % STOP_POLLS == 0) {
                    const unsigned int stop = lane == 0 ? load_acquire(&control[STOP]) : 0;
                    if (__shfl_sync(FULL_WARP, stop, 0) != 0) {
                        // Orders every lane's read of the line below after lane 0's acquire.
                        __syncwarp();
                        // A request that landed between this poll's read of the line and the
                        // stop's is served all the same: shutdown serves every request made
                        // before it.
                        word = ((const volatile unsigned int*)slot)[lane];
                        go = line_landed(word, expected, lane) ? 1 : 0;
                        break;
                    }
                }
            }
            const unsigned int bell = __shfl_sync(FULL_WARP, word, 0);
            const unsigned int tap_count = min(__shfl_sync(FULL_WARP, word, REQ_TAPS), (unsigned int)MAX_TAPS);
            const unsigned int len = min((bell >> LEN_SHIFT) & LEN_MASK, (unsigned int)MAX_SAMPLES);
            const unsigned int gain = __shfl_sync(FULL_WARP, word, REQ_GAIN);
            const bool in_line = tap_count + len <= INLINE_REQUEST_WORDS;
            const int at = payload_index(lane, REQ_PAYLOAD_FROM);
            if (go && in_line && at >= 0) {
                if ((unsigned int)at < tap_count) {
                    taps[at] = __uint_as_float(word);
                } else if ((unsigned int)at - tap_count < len) {
                    samples[at - tap_count] = __uint_as_float(word);
                }
            }
            if (lane == 0) {
                if (go && !in_line) {
                    // Orders the reads of the slot's body below after the doorbell word.
                    load_acquire(&slot[0]);
                }
                command[0] = go;
                command[1] = bell >> OP_SHIFT;
                command[2] = len;
                command[3] = tap_count;
                command[4] = gain;
                command[5] = in_line;
            }
        }
        __syncthreads();
        if (command[0] == 0) {
            break;
        }
        const unsigned int opcode = command[1];
        const unsigned int len = command[2];
        const unsigned int tap_count = command[3];
        if (!command[5]) {
            // One parallel pass over the link for the rest: samples and taps.
            const volatile float* in = (const volatile float*)(slot + SAMPLES);
            const volatile float* in_taps = (const volatile float*)(slot + TAPS);
            for (unsigned int i = lane; i < len; i += blockDim.x) {
                samples[i] = in[i];
            }
            if (opcode == OP_FIR) {
                for (unsigned int j = lane; j < tap_count; j += blockDim.x) {
                    taps[j] = in_taps[j];
                }
            }
            __syncthreads();
        }
        const bool reply_in_line = len <= INLINE_REPLY_WORDS;
        float* out = reply_in_line ? reply : (float*)(slot + REPLY_SAMPLES);
        unsigned int status = 0;
        if (opcode == OP_GAIN) {
            const float gain = __uint_as_float(command[4]);
            for (unsigned int i = lane; i < len; i += blockDim.x) {
                out[i] = __fmul_rn(gain, samples[i]);
            }
        } else if (opcode == OP_FIR) {
            for (unsigned int i = lane; i < len; i += blockDim.x) {
                float acc = 0.0f;
                const unsigned int last = min(tap_count, i + 1);
                for (unsigned int j = 0; j < last; ++j) {
                    acc = fmaf(taps[j], samples[i - j], acc);
                }
                out[i] = acc;
            }
        } else if (opcode == OP_STALL) {
            status = 2;
            if (lane == 0) {
                while (load_acquire(&control[STOP]) == 0) {
                }
            }
        } else if (opcode == OP_WEDGE) {
            status = 2;
            if (lane == 0) {
                const unsigned long long until = global_ns() + (unsigned long long)command[4] * 1000000ull;
                while (global_ns() < until) {
                }
            }
        } else {
            status = 1;
        }
        // The reply samples (in shared memory or in the slot) are all written before warp 0
        // writes the line.
        __syncthreads();
        if (lane < 32) {
            if (!reply_in_line) {
                // Every lane of warp 0 fences (one instruction for the warp): the samples the
                // block wrote to the slot reach host memory before any sector of the line.
                __threadfence_system();
            }
            const int at = payload_index(lane, REPLY_PAYLOAD_FROM);
            unsigned int value = 0;
            if (lane % SECTOR_WORDS == 0) {
                value = expected;
            } else if (lane == REPLY_STATUS) {
                value = status;
            } else if (reply_in_line && status == 0 && (unsigned int)at < len) {
                value = __float_as_uint(reply[at]);
            }
            ((volatile unsigned int*)(slot + REPLY_LINE))[lane] = value;
        }
        // `command`, the staged samples and `reply` are rewritten next round only after all
        // have read them.
        __syncthreads();
    }
    if (lane == 0) {
        __threadfence_system();
        store_release(&control[EXITED], 1);
    }
}
