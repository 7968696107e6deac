#!/usr/bin/env bash
# Device call J: the bundle's GPU tests (with the cross-process bench and the gathered loads),
# the cross-process ring against the single-process FrameRing (two_process_ring, 4 and 3 slots),
# the loader / shared ring / load Python tests with the wheel (WorkerLoader timeout= and malloc
# settings), a 2-rank shard= load along dims 0 and 1 (residency sampled once per load now), and
# hetmem.load's threads and smaller chunks against KvikIO.
set -u
R=$OUT/j; mkdir -p $R
T0=$(date +%s); BUDGET=${BUDGET:-560}
# step LIMIT CMD...: runs CMD under LIMIT seconds, or skips it (saying so) when it could run past
# the call's budget, so that the results' tarball is always written.
step() { local t=$1; shift; local left=$((BUDGET - ($(date +%s) - T0))); if [ $t -gt $left ]; then echo "== SKIPPED (needs $t s, $left left): $*" | tee -a $R/steps.txt; return 0; fi; echo "== $* (limit $t s)" | tee -a $R/steps.txt; local s=$(date +%s.%N); timeout $t "$@"; local rc=$?; echo "   rc=$rc $(python3 -c "import time;print(round(time.time()-$s,1))") s" | tee -a $R/steps.txt; }
repo=$PWD
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
rm -rf gpu-bundle /tmp/site; tar xJf gpu-bundle.tar.xz
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/hetmem/*.whl .whl/peers/*.whl > $R/pip.txt 2>&1 || cat $R/pip.txt
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv > $R/gpu.txt
step 240 gpu-bundle/run-tests $R/logs > $R/run-tests.txt 2>&1; tail -32 $R/run-tests.txt | cut -c1-220
HETMEM_BACKEND=cuda step 60 gpu-bundle/examples/two_process_ring --strategy all --frames 5000 --latency 500 --json $R/two-process.json > $R/two-process.txt 2>&1; cat $R/two-process.txt
HETMEM_BACKEND=cuda step 60 gpu-bundle/examples/two_process_ring --strategy all --slots 3 --frames 5000 --latency 500 --json $R/two-process-3slots.json > $R/two-process-3slots.txt 2>&1; cat $R/two-process-3slots.txt
T=$repo/crates/hetmem-py/tests
(cd /tmp && HETMEM_REQUIRE_GPU=1 step 120 python3 -m pytest -q -rs -p no:cacheprovider $T/test_worker_loader.py $T/test_shared.py $T/test_ring_attacks.py $T/test_load.py) > $R/pytest.txt 2>&1; tail -8 $R/pytest.txt
[ -d /tmp/ck8 ] || step 70 python3 bench/peers/python_load.py --make /tmp/ck8 --gib 8 > $R/make8.txt 2>&1
step 60 python3 - > $R/shard.txt 2>&1 <<'PY'
import os, time, torch, hetmem
index = "/tmp/ck8/model.safetensors.index.json"
total = sum(os.path.getsize(os.path.join("/tmp/ck8", f)) for f in os.listdir("/tmp/ck8") if f.endswith(".safetensors"))
for dim in (0, 1):
    for rank in (0, 1):
        start = time.perf_counter()
        loaded = hetmem.load(index, device="cuda", shard=(rank, 2, dim), progress=False)
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
        r = loaded.report
        print(f"shard=({rank}, 2, {dim}): read {r.bytes / total:.3f} of the files ({r.bytes} of {total} bytes), "
              f"{r.gb_per_s:.1f} GB/s own, {r.bytes / wall / 1e9:.1f} GB/s wall")
        del loaded
PY
cat $R/shard.txt
step 100 python3 bench/peers/load_sweep.py --dir /tmp/ck8 --threads 8,12,16 --chunks-mib 2,4,8 --json $R/load_sweep.json > $R/load_sweep.txt 2>&1; cat $R/load_sweep.txt
rm -rf /tmp/ck8
tar czf $OUT/j.tgz -C $OUT j && rm -rf $R
