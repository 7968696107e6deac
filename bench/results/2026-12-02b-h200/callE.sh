#!/usr/bin/env bash
# Device call E: the NIXL suite as it is meant to run (host tests with UCX's own transports,
# device tests with UCX_TLS=cuda_copy,cuda_ipc,sm,self), KvikIO on the sweep's checkpoint, and
# `bench dataset` (500 8K frames under a 16 GiB device budget, and the sparse pass).
set -u
R=$OUT/e; mkdir -p $R
step() { local t=$1; shift; echo "== $* (limit $t s)" | tee -a $R/steps.txt; local s=$(date +%s.%N); timeout $t "$@"; local rc=$?; echo "   rc=$rc $(python3 -c "import time;print(round(time.time()-$s,1))") s" | tee -a $R/steps.txt; }
repo=$PWD
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
[ -x gpu-bundle/bin/hetmem ] || tar xJf gpu-bundle.tar.xz
[ -d gpu-bundle/examples ] || tar xJf gpu-bundle.tar.xz
[ -d /tmp/site/hetmem ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/hetmem/*.whl .whl/peers/*.whl
[ -d /tmp/nixl-site ] || python3 -c "import zipfile,glob;zipfile.ZipFile(glob.glob('.whl/nixl/*.whl')[0]).extractall('/tmp/nixl-site')"
export PYTHONPATH=/tmp/site:/tmp/nixl-site PYTHONUNBUFFERED=1
T=$repo/crates/hetmem-py/tests
(cd /tmp && HETMEM_REQUIRE_GPU=1 HETMEM_REQUIRE_NIXL=1 step 120 python3 -m pytest -q -rs -p no:cacheprovider $T/test_nixl.py) > $R/pytest-nixl.txt 2>&1; tail -8 $R/pytest-nixl.txt
(cd /tmp && HETMEM_REQUIRE_GPU=1 HETMEM_REQUIRE_NIXL=1 UCX_TLS=cuda_copy,cuda_ipc,sm,self step 120 python3 -m pytest -q -rs -p no:cacheprovider $T/test_nixl.py -k "device or loaded") > $R/pytest-nixl-vram.txt 2>&1; tail -8 $R/pytest-nixl-vram.txt
python3 -c "import kvikio" > $R/kvikio-import.txt 2>&1; tail -5 $R/kvikio-import.txt; ls /tmp/site | grep -i kvik >> $R/kvikio-import.txt
[ -d /tmp/ck8 ] || python3 bench/peers/python_load.py --make /tmp/ck8 --gib 8 > /dev/null 2>&1
step 120 python3 bench/peers/python_load.py --dir /tmp/ck8 --loaders kvikio,hetmem --cold 0 --warm 3 --json $R/load8-kvikio.json > $R/load8-kvikio.txt 2>&1; tail -8 $R/load8-kvikio.txt
step 330 scripts/bench-seed-claims $R/seeds dataset > $R/dataset.txt 2>&1; tail -30 $R/seeds/dataset/*.md 2>/dev/null | head -60
tar czf $OUT/e.tgz -C $OUT e && rm -rf $R
