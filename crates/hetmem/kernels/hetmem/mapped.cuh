// hetmem/mapped.cuh: the GPU side of hetmem's mapped flags, counters and mailboxes
// (crates/hetmem/src/resident/mapped mirrors the layout and states the ordering contract).
//
// Include it in a kernel compiled by hetmem (`#include <hetmem/mapped.cuh>`: hetmem's NVRTC
// compiles give every source this header), and pass the view's address with
// KernelArgs::mapped or Param::Mapped. Every word is 32 bits, written by one side at a time:
// published with st.release.sys (what cuda::atomic_ref<unsigned, cuda::thread_scope_system>
// emits for store(memory_order_release)) and observed with ld.acquire.sys (its
// load(memory_order_acquire)), so what one side wrote before publishing is seen by the side
// that observed it. Over PCIe (host_native_atomic = 0) a GPU atomic on host memory is atomic
// among the GPU's threads only, never with the CPU's: a counter has one writing side.
//
// One thread per side runs a mailbox's or flag's protocol (typically thread 0 of a block),
// and shares what it received through shared memory and __syncthreads().
#pragma once

// ---- ordering primitives, system scope ---------------------------------------------------

__device__ __forceinline__ unsigned int hetmem_load_acquire(const unsigned int* address) {
    unsigned int value;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(value) : "l"(address) : "memory");
    return value;
}

__device__ __forceinline__ void hetmem_store_release(unsigned int* address, unsigned int value) {
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(address), "r"(value) : "memory");
}

// Whether sequence number `value` has reached `target`, modulo 2^32.
__device__ __forceinline__ bool hetmem_reached(unsigned int value, unsigned int target) {
    return (int)(value - target) >= 0;
}

// ---- SeqFlag: one word, one writer ---------------------------------------------------------

__device__ __forceinline__ void hetmem_flag_publish(unsigned int* flag, unsigned int value) {
    hetmem_store_release(flag, value);
}

__device__ __forceinline__ unsigned int hetmem_flag_load(const unsigned int* flag) {
    return hetmem_load_acquire(flag);
}

// Spins until the flag reaches `target` (modulo 2^32); returns its value then.
__device__ __forceinline__ unsigned int hetmem_flag_wait(const unsigned int* flag, unsigned int target) {
    unsigned int value;
    while (!hetmem_reached(value = hetmem_load_acquire(flag), target)) {
    }
    return value;
}

// ---- Counter: one word, one writing side ---------------------------------------------------

__device__ __forceinline__ unsigned int hetmem_counter_load(const unsigned int* counter) {
    return hetmem_load_acquire(counter);
}

// Adds n; only on a counter the GPU writes (Writer::Gpu, or Writer::Both where the link has
// native atomics). Atomic among this GPU's threads, and with the CPU's where the link performs
// atomics natively: that takes a system-scope atomic (a plain atomicAdd is atomic among the
// device's threads only, whatever the link). The fence makes this thread's earlier writes
// visible to a CPU that sees the new count.
__device__ __forceinline__ unsigned int hetmem_counter_add(unsigned int* counter, unsigned int n) {
    __threadfence_system();
    return atomicAdd_system(counter, n);
}

// ---- Mailbox: fixed-size messages with sequence numbers ----------------------------------
// Words: [0] depth (a power of two), [1] message words, [2] slot words (constants); [16] the
// receiver's count of messages taken; from [32] the slots, slot i at 32 + i * slot words: its
// sequence word, then the message's words. Message k (from 1) uses slot (k - 1) % depth.

#define HETMEM_MAILBOX_TAKEN 16u
#define HETMEM_MAILBOX_SLOTS 32u

// A mailbox as a kernel holds it: its address and its constants, read once.
struct hetmem_mailbox {
    unsigned int* words;
    unsigned int depth;
    unsigned int message_words;
    unsigned int slot_words;
};

// Opens the mailbox at `words` (the address KernelArgs::mapped passed) for messages of
// `message_words` words; traps when that is not the mailbox's message size (the kernel's
// message type is not the CPU's).
__device__ __forceinline__ hetmem_mailbox hetmem_mailbox_open(unsigned int* words, unsigned int message_words) {
    hetmem_mailbox mailbox;
    mailbox.words = words;
    mailbox.depth = hetmem_load_acquire(words + 0);
    mailbox.message_words = hetmem_load_acquire(words + 1);
    mailbox.slot_words = hetmem_load_acquire(words + 2);
    if (mailbox.message_words != message_words || mailbox.depth == 0 || (mailbox.depth & (mailbox.depth - 1)) != 0) {
        __trap();
    }
    return mailbox;
}

__device__ __forceinline__ unsigned int* hetmem_mailbox_slot(const hetmem_mailbox& mailbox, unsigned int seq) {
    return mailbox.words + HETMEM_MAILBOX_SLOTS + (size_t)((seq - 1u) & (mailbox.depth - 1u)) * mailbox.slot_words;
}

// Receives message `seq` into `message` (the mailbox's message_words words) if it has
// arrived, and acknowledges it; false otherwise. One receiving thread, seq = 1, 2, ...
__device__ __forceinline__ bool hetmem_mailbox_try_recv(const hetmem_mailbox& mailbox, unsigned int seq,
                                                        unsigned int* message) {
    const unsigned int* slot = hetmem_mailbox_slot(mailbox, seq);
    if (hetmem_load_acquire(slot) != seq) {
        return false;
    }
    for (unsigned int i = 0; i < mailbox.message_words; ++i) {
        message[i] = ((const volatile unsigned int*)slot)[1 + i];
    }
    // The words are read (the release orders the loads above before it): the sender may
    // reuse the slot.
    hetmem_store_release(mailbox.words + HETMEM_MAILBOX_TAKEN, seq);
    return true;
}

// Spins until message `seq` arrives, then receives it.
__device__ __forceinline__ void hetmem_mailbox_recv(const hetmem_mailbox& mailbox, unsigned int seq,
                                                    unsigned int* message) {
    while (!hetmem_mailbox_try_recv(mailbox, seq, message)) {
    }
}

// Sends `message` as message `seq` if its slot is free (message seq - depth taken); false
// otherwise. One sending thread, seq = 1, 2, ...
__device__ __forceinline__ bool hetmem_mailbox_try_send(const hetmem_mailbox& mailbox, unsigned int seq,
                                                        const unsigned int* message) {
    if (seq - hetmem_load_acquire(mailbox.words + HETMEM_MAILBOX_TAKEN) > mailbox.depth) {
        return false;
    }
    unsigned int* slot = hetmem_mailbox_slot(mailbox, seq);
    for (unsigned int i = 0; i < mailbox.message_words; ++i) {
        ((volatile unsigned int*)slot)[1 + i] = message[i];
    }
    // Orders the message's words before the sequence word, at system scope.
    hetmem_store_release(slot, seq);
    return true;
}

// Spins until the slot is free, then sends.
__device__ __forceinline__ void hetmem_mailbox_send(const hetmem_mailbox& mailbox, unsigned int seq,
                                                    const unsigned int* message) {
    while (!hetmem_mailbox_try_send(mailbox, seq, message)) {
    }
}

// Typed forms: T is the message type, a whole number of 32-bit words, as on the CPU side.
template <typename T>
__device__ __forceinline__ hetmem_mailbox hetmem_mailbox_open_for(unsigned int* words) {
    static_assert(sizeof(T) % 4 == 0, "a mailbox message is a whole number of 32-bit words");
    return hetmem_mailbox_open(words, sizeof(T) / 4);
}
