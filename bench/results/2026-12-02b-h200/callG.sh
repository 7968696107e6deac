#!/usr/bin/env bash
# Device call G: the Python ring with graph=True against the 3-stream loop (and that loop with
# graphs), hetmem.load against its peers at 8 and 16 GiB warm (KvikIO now with its logger), the
# sweep again with the new default, a 2-rank shard= load's bytes, and WorkerLoader against
# DataLoader.
set -u
R=$OUT/g; mkdir -p $R
step() { local t=$1; shift; echo "== $* (limit $t s)" | tee -a $R/steps.txt; local s=$(date +%s.%N); timeout $t "$@"; local rc=$?; echo "   rc=$rc $(python3 -c "import time;print(round(time.time()-$s,1))") s" | tee -a $R/steps.txt; }
repo=$PWD
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
[ -x gpu-bundle/bin/hetmem ] || tar xJf gpu-bundle.tar.xz
[ -d /tmp/site/hetmem ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/hetmem/*.whl .whl/peers/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
step 200 python3 crates/hetmem-py/bench/ring_conv.py --frames 2000 --repeats 2 --json $R/ring_conv.json > $R/ring.txt 2>&1; tail -22 $R/ring.txt
[ -d /tmp/ck8 ] || step 60 python3 bench/peers/python_load.py --make /tmp/ck8 --gib 8 > $R/make8.txt 2>&1
step 100 python3 bench/peers/load_sweep.py --dir /tmp/ck8 --threads 8,16 --chunks-mib 8 --json $R/load_sweep.json > $R/load_sweep.txt 2>&1; cat $R/load_sweep.txt
step 120 python3 bench/peers/python_load.py --dir /tmp/ck8 --loaders hetmem,kvikio,torch_pread,fastsafetensors,runai,safetensors --cold 0 --warm 2 --threads 16 --json $R/load8.json > $R/load8.txt 2>&1; tail -14 $R/load8.txt
python3 - > $R/shard.txt 2>&1 <<'PY'
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
step 90 python3 bench/peers/python_load.py --make /tmp/ck16 --gib 16 > $R/make16.txt 2>&1
step 120 python3 bench/peers/python_load.py --dir /tmp/ck16 --loaders hetmem,kvikio,torch_pread --cold 0 --warm 2 --threads 16 --json $R/load16.json > $R/load16.txt 2>&1; tail -8 $R/load16.txt
rm -rf /tmp/ck16
step 40 python3 crates/hetmem-py/bench/worker_loader.py --make /tmp/jpegs --count 1500 > $R/jpegs.txt 2>&1
step 200 python3 crates/hetmem-py/bench/worker_loader.py --data /tmp/jpegs --workers 4,8,12 --iters 12 --warmup 3 --json $R/worker_loader.json > $R/worker_loader.txt 2>&1; tail -22 $R/worker_loader.txt
tar czf $OUT/g.tgz -C $OUT g && rm -rf $R
