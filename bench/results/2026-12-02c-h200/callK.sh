#!/usr/bin/env bash
# Device call K: the cross-process ring again with the 50 us spin before poll (the example built
# from a later commit than the bundle, carried in .devcarry/), then WorkerLoader against
# DataLoader: JPEG decode and a copy-bound array set, with ResNet-50/18 and loader-only, N=4,8,12.
set -u
R=$OUT/k; mkdir -p $R
T0=$(date +%s); BUDGET=${BUDGET:-560}
# step LIMIT CMD...: runs CMD under LIMIT seconds, or skips it (saying so) when it could run past
# the call's budget, so that the results' tarball is always written.
step() { local t=$1; shift; local left=$((BUDGET - ($(date +%s) - T0))); if [ $t -gt $left ]; then echo "== SKIPPED (needs $t s, $left left): $*" | tee -a $R/steps.txt; return 0; fi; echo "== $* (limit $t s)" | tee -a $R/steps.txt; local s=$(date +%s.%N); timeout $t "$@"; local rc=$?; echo "   rc=$rc $(python3 -c "import time;print(round(time.time()-$s,1))") s" | tee -a $R/steps.txt; }
repo=$PWD
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
rm -rf /tmp/site
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/hetmem/*.whl .whl/peers/*.whl > $R/pip.txt 2>&1 || cat $R/pip.txt
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
for run in 1 2; do
HETMEM_BACKEND=cuda step 60 .devcarry/two_process_ring --strategy all --frames 5000 --latency 500 --json $R/two-process-spin$run.json > $R/two-process-spin$run.txt 2>&1; cat $R/two-process-spin$run.txt
done
B=$repo/crates/hetmem-py/bench/worker_loader.py
step 60 python3 $B --make /tmp/jpegs --dataset jpeg --count 1500 > $R/make-jpegs.txt 2>&1
step 40 python3 $B --make /tmp/arrays --dataset arrays --count 500 > $R/make-arrays.txt 2>&1
step 200 python3 $B --dataset jpeg --data /tmp/jpegs --workers 4,8,12 --json $R/jpeg.json > $R/jpeg.txt 2>&1; grep -v Warning $R/jpeg.txt | grep -v collate | tail -16
step 100 python3 $B --dataset arrays --data /tmp/arrays --workers 4,8,12 --json $R/arrays.json > $R/arrays.txt 2>&1; grep -v Warning $R/arrays.txt | grep -v collate | tail -16
step 40 python3 $B --dataset arrays --data /tmp/arrays --workers 4,8,12 --loader-only --json $R/arrays-lo.json > $R/arrays-lo.txt 2>&1; grep -v Warning $R/arrays-lo.txt | grep -v collate | tail -8
step 60 python3 $B --dataset jpeg --data /tmp/jpegs --workers 4,8,12 --loader-only --json $R/jpeg-lo.json > $R/jpeg-lo.txt 2>&1; grep -v Warning $R/jpeg-lo.txt | grep -v collate | tail -8
tar czf $OUT/k.tgz -C $OUT k && rm -rf $R
