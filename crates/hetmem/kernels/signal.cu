// Signalling through mapped host memory, one thread, for latency measurements and tests.
//
// words points to mapped pinned memory shared with the CPU; each word sits on its own 64-byte
// line so the CPU's spinning on one never contends with the GPU's writes to another:
//   words[0]  started: the kernel writes 1 as soon as it runs
//   words[16] go:      the CPU writes non-zero to let the kernel finish
//   words[32] done:    the kernel writes 1 as its last act
// The kernel's end as the CPU sees it is the moment `done` turns 1; every completion signal
// (event, stream, flag, callback) is measured from `go` against that.

extern "C" __global__ void wait_for_go(volatile unsigned int* words) {
    words[0] = 1;
    __threadfence_system();
    while (words[16] == 0) {
    }
    __threadfence_system();
    words[32] = 1;
    __threadfence_system();
}
