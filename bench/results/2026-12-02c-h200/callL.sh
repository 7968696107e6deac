#!/usr/bin/env bash
# Device call L: the final check. The bundle's GPU tests (fd28e7f: the shared ring's spin and
# consumer limits, gathered loads), the cross-process ring once more, and the whole Python suite
# with the wheel of the merged review (af7add5), NIXL apart.
set -u
R=$OUT/l; mkdir -p $R
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
step 220 gpu-bundle/run-tests $R/logs > $R/run-tests.txt 2>&1; tail -32 $R/run-tests.txt | cut -c1-220
HETMEM_BACKEND=cuda step 40 gpu-bundle/examples/two_process_ring --strategy all --frames 5000 --latency 500 --json $R/two-process.json > $R/two-process.txt 2>&1; cat $R/two-process.txt
T=$repo/crates/hetmem-py/tests
(cd /tmp && HETMEM_REQUIRE_GPU=1 step 150 python3 -m pytest -q -rs -p no:cacheprovider $T --ignore=$T/test_nixl.py) > $R/pytest.txt 2>&1; tail -14 $R/pytest.txt
tar czf $OUT/l.tgz -C $OUT l && rm -rf $R
