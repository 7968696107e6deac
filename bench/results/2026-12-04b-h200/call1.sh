#!/usr/bin/env bash
# Device call 1 (carry gpu-bundle.tar.xz and .whl): the resident blur on the GPU (its tests in
# the bundle, then the frame_latency example's rows beside the filter's, PyTorch's fp16 peer in
# the same call, and the probe's resident kernel at the same shape), then why UCX emulates on
# hetmem's device memory (probe, with UCX's debug log for the slow pairs), hetmem.nixl's tests
# and the PyTorch-staged write_staged against the plain hops, turn about.
CALL=c1; BUDGET=${BUDGET:-570}; . bench/results/2026-12-04-h200/common.sh
B=gpu-bundle; P=scripts/probes
TESTS=$(ls $B/tests/tests-* | head -1)
HETMEM_REQUIRE_GPU=1 step 90 $TESTS --test-threads=1 resident_blur > $R/resident-tests.txt 2>&1; tail -5 $R/resident-tests.txt
HETMEM_REQUIRE_GPU=1 step 90 $B/examples/frame_latency 300 > $R/frame-latency.jsonl 2> $R/frame-latency.err; cat $R/frame-latency.jsonl | cut -c1-200; tail -3 $R/frame-latency.err
for size in "1920 1080" "3840 2160"; do set -- $size
  step 40 python3 bench/peers/torch_gaussian.py --width $1 --height $2 --frames 1000 --dtype fp16 --json $R/torch-fp16-$1x$2.json > $R/torch-fp16-$1x$2.txt 2>&1; tail -2 $R/torch-fp16-$1x$2.txt
done
step 60 nvcc -O3 -arch=sm_90 -lcuda -Xptxas -dlcm=cg -DCHUNK=8 -o /tmp/fl8 $P/frame_latency.cu
(BAND=256 TILES=48 step 40 /tmp/fl8 resident; BAND=256 TILES=48 step 40 /tmp/fl8 mapped) > $R/probe-frame-latency.txt 2>&1; grep -E "==|resident|launch" $R/probe-frame-latency.txt
step 120 python3 $P/ucx_hetmem_memory.py > $R/ucx-hetmem-memory.txt 2>&1; cut -c1-400 $R/ucx-hetmem-memory.txt
UCX_LOG_LEVEL=debug step 60 python3 $P/ucx_hetmem_memory.py torch:hetmem hetmem:torch > $R/ucx-hetmem-debug.txt 2>&1
grep -iE "primary context|cuda_ipc|cuIpc|unreachable|GBps" $R/ucx-hetmem-debug.txt | sort | uniq -c | sort -rn | head -20
# hetmem-nixl (Rust) with device memory: host memory into another process's DeviceBuf and back.
for t in $B/nixl/*; do LD_LIBRARY_PATH=/tmp/nixl-site/.nixl_cu13.mesonpy.libs HETMEM_REQUIRE_GPU=1 HETMEM_REQUIRE_NIXL=1 step 90 $t --test-threads=1; done > $R/hetmem-nixl-tests.txt 2>&1; grep -E "^test |test result" $R/hetmem-nixl-tests.txt | tail -12
(cd /tmp && HETMEM_REQUIRE_GPU=1 HETMEM_REQUIRE_NIXL=1 step 100 python3 -m pytest -q -rs --tb=short -p no:cacheprovider $T/test_nixl.py) > $R/pytest-nixl.txt 2>&1; tail -6 $R/pytest-nixl.txt
N=bench/peers/nixl_link.py
{ for turn in 1 2; do for dir in h2d_staged h2d_hetmem; do echo "TURN $turn $dir"
    UCX_TLS=cuda_copy,cuda_ipc,sm,self timeout 45 python3 $N variant cuda_copy,cuda_ipc,sm,self none two $dir 2>&1 | grep -v '^VERSIONS\|^CEILING_256MiB_END'
done; done; } > $R/staged-vs-hetmem.txt 2>&1
grep -E "TURN|GBps_median|rror|CEILING" $R/staged-vs-hetmem.txt | cut -c1-300
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt 2>&1
tar czf $OUT/c1.tgz -C $OUT c1 && rm -rf $R
