#!/usr/bin/env bash
# Device call F: the bundle's GPU tests (the shared ring's fixes, the shard plans), the whole
# Python suite with the wheel on the GPU (load's shard=/dtype=/into=, the ring's graph=, the
# worker loader, the shared ring), NIXL's suite, and hetmem filter against the shell's clock.
set -u
R=$OUT/f; mkdir -p $R
step() { local t=$1; shift; echo "== $* (limit $t s)" | tee -a $R/steps.txt; local s=$(date +%s.%N); timeout $t "$@"; local rc=$?; echo "   rc=$rc $(python3 -c "import time;print(round(time.time()-$s,1))") s" | tee -a $R/steps.txt; }
repo=$PWD
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
rm -rf gpu-bundle /tmp/site /tmp/nixl-site; tar xJf gpu-bundle.tar.xz
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/hetmem/*.whl .whl/peers/*.whl > $R/pip.txt 2>&1 || cat $R/pip.txt
python3 -c "import zipfile,glob;zipfile.ZipFile(glob.glob('.whl/nixl/*.whl')[0]).extractall('/tmp/nixl-site')"
export PYTHONPATH=/tmp/site:/tmp/nixl-site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv > $R/gpu.txt
step 280 gpu-bundle/run-tests $R/logs > $R/run-tests.txt 2>&1; tail -32 $R/run-tests.txt | cut -c1-220
T=$repo/crates/hetmem-py/tests
(cd /tmp && HETMEM_REQUIRE_GPU=1 step 200 python3 -m pytest -q -rs -p no:cacheprovider $T --ignore=$T/test_nixl.py) > $R/pytest.txt 2>&1; tail -15 $R/pytest.txt
(cd /tmp && HETMEM_REQUIRE_GPU=1 HETMEM_REQUIRE_NIXL=1 step 90 python3 -m pytest -q -rs -p no:cacheprovider $T/test_nixl.py) > $R/pytest-nixl.txt 2>&1; tail -4 $R/pytest-nixl.txt
HETMEM=gpu-bundle/bin/hetmem step 200 scripts/bench-seed-claims $R/seeds filter 100 > $R/filter-run.txt 2>&1; cat $R/seeds/filter.txt
tar czf $OUT/f.tgz -C $OUT f && rm -rf $R
