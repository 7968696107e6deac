// A kernel that really faults, for tests of what a lost GPU context does to hetmem (feature
// `testing` only): one thread stores to an address no allocation covers, so the launch ends
// with CUDA_ERROR_ILLEGAL_ADDRESS and the context is lost for the rest of the process.

extern "C" __global__ void illegal_store(unsigned long long address) {
    *(volatile unsigned int*)address = 0xDEAD;
}
