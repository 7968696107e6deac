#!/usr/bin/env bash
# Device call I: the wheel with gathered small ranges (a dim-1 shard= ran at 0.4 GB/s in call H):
# a 2-rank shard= load along dims 0 and 1; hetmem.load's threads and chunk sizes against KvikIO's;
# hetmem.load against KvikIO and torch pread; `bench link` quick against full (the spread marks).
set -u
R=$OUT/i; mkdir -p $R
T0=$(date +%s); BUDGET=${BUDGET:-560}
# step LIMIT CMD...: runs CMD under LIMIT seconds, or skips it (saying so) when it could run past
# the call's budget, so that the results' tarball is always written.
step() { local t=$1; shift; local left=$((BUDGET - ($(date +%s) - T0))); if [ $t -gt $left ]; then echo "== SKIPPED (needs $t s, $left left): $*" | tee -a $R/steps.txt; return 0; fi; echo "== $* (limit $t s)" | tee -a $R/steps.txt; local s=$(date +%s.%N); timeout $t "$@"; local rc=$?; echo "   rc=$rc $(python3 -c "import time;print(round(time.time()-$s,1))") s" | tee -a $R/steps.txt; }
repo=$PWD
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
rm -rf gpu-bundle /tmp/site; tar xJf gpu-bundle.tar.xz
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/hetmem/*.whl .whl/peers/*.whl > $R/pip.txt 2>&1 || cat $R/pip.txt
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
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
step 100 python3 bench/peers/load_sweep.py --dir /tmp/ck8 --threads 8,16 --chunks-mib 8,16,32 --json $R/load_sweep.json > $R/load_sweep.txt 2>&1; cat $R/load_sweep.txt
step 100 python3 bench/peers/python_load.py --dir /tmp/ck8 --loaders hetmem,kvikio,torch_pread --cold 0 --warm 3 --threads 16 --json $R/load8.json > $R/load8.txt 2>&1; tail -10 $R/load8.txt
rm -rf /tmp/ck8
HETMEM=gpu-bundle/bin/hetmem step 240 scripts/bench-seed-claims $R/seeds link > $R/seed-link.txt 2>&1; tail -12 $R/seed-link.txt
tar czf $OUT/i.tgz -C $OUT i && rm -rf $R
