#!/usr/bin/env bash
# Device call 1: the resident blur's latency with the best mapped shape (probe), why UCX emulates
# on hetmem's device memory (probe), hetmem.nixl on the GPU (the PyTorch-staged write_staged
# against the plain hops, turn about), and the Python suite on the GPU.
CALL=c1; BUDGET=${BUDGET:-570}; . bench/results/2026-12-04b-h200/common.sh
P=scripts/probes
step 60 nvcc -O3 -arch=sm_90 -lcuda -Xptxas -dlcm=cg -DCHUNK=8 -o /tmp/fl8 $P/frame_latency.cu
step 60 nvcc -O3 -arch=sm_90 -lcuda -Xptxas -dlcm=cg -o /tmp/fl16 $P/frame_latency.cu
(BAND=256 TILES=40,48,56,64 step 50 /tmp/fl8 resident; BAND=256 TILES=48,64 step 40 /tmp/fl8 mapped; step 40 /tmp/fl16 resident) > $R/frame-latency.txt 2>&1; grep -E "==|resident|launch" $R/frame-latency.txt
step 150 python3 $P/ucx_hetmem_memory.py > $R/ucx-hetmem-memory.txt 2>&1; cat $R/ucx-hetmem-memory.txt | cut -c1-400
(cd /tmp && HETMEM_REQUIRE_GPU=1 HETMEM_REQUIRE_NIXL=1 step 100 python3 -m pytest -q -rs --tb=short -p no:cacheprovider $T/test_nixl.py) > $R/pytest-nixl.txt 2>&1; tail -8 $R/pytest-nixl.txt
N=bench/peers/nixl_link.py
{
for turn in 1 2; do
  for dir in h2d_staged h2d_hetmem; do echo "TURN $turn $dir"; UCX_TLS=cuda_copy,cuda_ipc,sm,self timeout 50 python3 $N variant cuda_copy,cuda_ipc,sm,self none two $dir 2>&1 | grep -v '^VERSIONS\|^CEILING_256MiB_END'; done
done
} > $R/staged-vs-hetmem.txt 2>&1
grep -E "TURN|GBps_median|rror|CEILING" $R/staged-vs-hetmem.txt | cut -c1-300
(cd /tmp && HETMEM_REQUIRE_GPU=1 step 200 python3 -m pytest -q -rs --tb=short -o faulthandler_timeout=40 -p no:cacheprovider $T --ignore=$T/test_nixl.py) > $R/pytest.txt 2>&1; tail -15 $R/pytest.txt
nvidia-smi --query-gpu=name,driver_version --format=csv > $R/gpu.txt 2>&1
tar czf $OUT/c1.tgz -C $OUT c1 && rm -rf $R
