#!/usr/bin/env bash
# Device call H: the bundle's GPU tests (the data-set kernel rewritten), that kernel under
# compute-sanitizer (memcheck, racecheck) on unaligned frames, `bench dataset` twice, the whole
# Python suite with a fresh wheel (NIXL apart), a 2-rank shard= load's bytes along dims 0 and 1,
# and the parallel-registration probe on a cached 4 GiB file.
set -u
R=$OUT/h; mkdir -p $R
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
bin=$(for t in gpu-bundle/tests/tests-*; do "$t" --list 2>/dev/null | grep -q frames_of_several_unaligned_tiles && echo "$t"; done | head -1)
for tool in memcheck racecheck; do
  HETMEM_REQUIRE_GPU=1 step 90 compute-sanitizer --tool $tool --error-exitcode 99 --print-limit 20 "$bin" bench_dataset --test-threads=1 > $R/sanitize-dataset-$tool.txt 2>&1; tail -4 $R/sanitize-dataset-$tool.txt
done
for run in 1 2; do
  HETMEM=gpu-bundle/bin/hetmem step 120 scripts/bench-seed-claims $R/seeds$run dataset > $R/dataset-run$run.txt 2>&1; cat $R/seeds$run/dataset/dataset.md | head -12
done
T=$repo/crates/hetmem-py/tests
(cd /tmp && HETMEM_REQUIRE_GPU=1 step 170 python3 -m pytest -q -rs -p no:cacheprovider $T --ignore=$T/test_nixl.py) > $R/pytest.txt 2>&1; tail -12 $R/pytest.txt
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
rm -rf /tmp/ck8
step 30 python3 -c "
import numpy as np
rng = np.random.default_rng(7)
with open('/tmp/probe.bin', 'wb') as f:
    for _ in range(16):
        f.write(rng.integers(0, 256, 256 << 20, dtype=np.uint8).tobytes())
"
cat /tmp/probe.bin > /dev/null
step 90 python3 scripts/probes/register_parallel.py /tmp/probe.bin --piece-mib 64 > $R/register_parallel.txt 2>&1; cat $R/register_parallel.txt
step 60 python3 scripts/probes/register_parallel.py /tmp/probe.bin --piece-mib 16 --threads 4,8,16 > $R/register_parallel_16m.txt 2>&1; cat $R/register_parallel_16m.txt
rm -f /tmp/probe.bin
tar czf $OUT/h.tgz -C $OUT h && rm -rf $R
