#!/usr/bin/env bash
# Device call D: the Python tests not yet run on the GPU (ring attacks, shared ring, NIXL with
# device memory), NIXL host<->device between two processes, and where hetmem.load's warm rate
# goes (threads x chunk against KvikIO, and the two halves' ceilings), plus the CLI on the same files.
set -u
R=$OUT/d; mkdir -p $R
step() { local t=$1; shift; echo "== $* (limit $t s)" | tee -a $R/steps.txt; local s=$(date +%s.%N); timeout $t "$@"; local rc=$?; echo "   rc=$rc $(python3 -c "import time;print(round(time.time()-$s,1))") s" | tee -a $R/steps.txt; }
repo=$PWD
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
tar xJf gpu-bundle.tar.xz gpu-bundle/bin/hetmem
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/hetmem/*.whl .whl/peers/*.whl > $R/pip.txt 2>&1 || cat $R/pip.txt
python3 -c "import zipfile,glob;zipfile.ZipFile(glob.glob('.whl/nixl/*.whl')[0]).extractall('/tmp/nixl-site')"
export PYTHONPATH=/tmp/site:/tmp/nixl-site PYTHONUNBUFFERED=1
python3 -c "import hetmem,torch,sys;print(hetmem.__file__, torch.__version__, sys.version)" | tee $R/versions.txt
nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv > $R/gpu.txt
T=$repo/crates/hetmem-py/tests
(cd /tmp && HETMEM_REQUIRE_GPU=1 step 150 python3 -m pytest -q -rs -p no:cacheprovider $T/test_ring_attacks.py $T/test_shared.py) > $R/pytest-ring-shared.txt 2>&1; tail -12 $R/pytest-ring-shared.txt
(cd /tmp && HETMEM_REQUIRE_GPU=1 HETMEM_REQUIRE_NIXL=1 UCX_TLS=cuda_copy,cuda_ipc,sm,self step 120 python3 -m pytest -q -rs -p no:cacheprovider $T/test_nixl.py) > $R/pytest-nixl.txt 2>&1; tail -12 $R/pytest-nixl.txt
UCX_TLS=cuda_copy,cuda_ipc,sm,self step 90 python3 crates/hetmem-py/bench/nixl_vram.py --ucx-none --json > $R/nixl_vram.json 2>$R/nixl_vram.txt; tail -14 $R/nixl_vram.txt; tail -c 1500 $R/nixl_vram.json
step 60 python3 bench/peers/python_load.py --make /tmp/ck8 --gib 8 > $R/make8.txt 2>&1
step 200 python3 bench/peers/load_sweep.py --dir /tmp/ck8 --json $R/load_sweep.json > $R/load_sweep.txt 2>&1; cat $R/load_sweep.txt
for t in 16 32; do step 30 gpu-bundle/bin/hetmem load --json --threads $t $(ls /tmp/ck8/*.safetensors) > $R/cli-load-$t.json 2>$R/cli-load-$t.err; python3 -c "import json;r=json.load(open('$R/cli-load-$t.json'));print('CLI load threads=$t', r.get('gb_per_s'), r.get('method'), r.get('link_gb_per_s'))"; done
tar czf $OUT/d.tgz -C $OUT d && rm -rf $R
