// A resident worker: one block that takes work from the CPU through one mailbox and answers
// through another, until a message tells it to stop (examples/mailbox_worker.rs runs it;
// examples/support/mailbox.rs holds the message types and the same computation on the CPU).
//
// Thread 0 plays the mailboxes' ends (one thread per end, as hetmem/mapped.cuh asks) and
// hands the message to the block through shared memory; the block computes, reduces in
// shared memory, and thread 0 sends the reply.
#include <hetmem/mapped.cuh>

#define THREADS 256
#define DATA_WORDS 12

struct Work {
    unsigned int id;
    unsigned int stop;
    unsigned int seed;
    unsigned int scale;
    unsigned int data[DATA_WORDS];
};

struct Reply {
    unsigned int id;
    unsigned int sum;
    unsigned int max;
    unsigned int data_sum;
};

// A 32-bit mix (lowbias32): the same arithmetic as the CPU's `mix`.
__device__ __forceinline__ unsigned int mix(unsigned int x) {
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

extern "C" __global__ void mailbox_worker(unsigned int* inbox_words, unsigned int* outbox_words) {
    __shared__ Work work;
    __shared__ unsigned int sums[THREADS];
    __shared__ unsigned int maxima[THREADS];
    const unsigned int t = threadIdx.x;
    hetmem_mailbox inbox;
    hetmem_mailbox outbox;
    if (t == 0) {
        inbox = hetmem_mailbox_open_for<Work>(inbox_words);
        outbox = hetmem_mailbox_open_for<Reply>(outbox_words);
    }
    for (unsigned int seq = 1;; ++seq) {
        if (t == 0) {
            hetmem_mailbox_recv(inbox, seq, reinterpret_cast<unsigned int*>(&work));
        }
        __syncthreads();
        if (work.stop != 0) {
            break;
        }
        const unsigned int value = mix(work.seed ^ (t * 0x9E3779B9u)) * work.scale + work.data[t % DATA_WORDS];
        sums[t] = value;
        maxima[t] = value;
        __syncthreads();
        for (unsigned int half = THREADS / 2; half > 0; half /= 2) {
            if (t < half) {
                sums[t] += sums[t + half];
                maxima[t] = max(maxima[t], maxima[t + half]);
            }
            __syncthreads();
        }
        if (t == 0) {
            Reply reply;
            reply.id = work.id;
            reply.sum = sums[0];
            reply.max = maxima[0];
            reply.data_sum = 0;
            for (unsigned int i = 0; i < DATA_WORDS; ++i) {
                reply.data_sum += work.data[i];
            }
            hetmem_mailbox_send(outbox, seq, reinterpret_cast<const unsigned int*>(&reply));
        }
        // Everyone has read `work`, `sums` and `maxima` before thread 0 overwrites them.
        __syncthreads();
    }
}
