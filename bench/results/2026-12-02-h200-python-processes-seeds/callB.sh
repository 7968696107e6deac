#!/usr/bin/env bash
# Device call B: the Python suite with the wheel on the GPU, hetmem.load against its peers
# (8 and 16 GiB, cold and warm), the Python ring against the 3-stream PyTorch loop, NIXL overhead.
set -u
R=$OUT/b; mkdir -p $R
step() { local t=$1; shift; echo "== $* (limit $t s)" | tee -a $R/steps.txt; local s=$(date +%s.%N); timeout $t "$@"; local rc=$?; echo "   rc=$rc $(python3 -c "import time;print(round(time.time()-$s,1))") s" | tee -a $R/steps.txt; }
repo=$PWD
tar xJf gpu-bundle.tar.xz gpu-bundle/bin/hetmem
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/hetmem/*.whl .whl/peers/*.whl > $R/pip.txt 2>&1 || { cat $R/pip.txt; }
python3 -c "import zipfile,glob;zipfile.ZipFile(glob.glob('.whl/nixl/*.whl')[0]).extractall('/tmp/nixl-site')"
export PYTHONPATH=/tmp/site:/tmp/nixl-site PYTHONUNBUFFERED=1
python3 -c "import hetmem,torch,sys;print(hetmem.__file__, torch.__version__, sys.version)" | tee $R/versions.txt
(cd /tmp && HETMEM_REQUIRE_GPU=1 HETMEM_REQUIRE_NIXL=1 step 240 python3 -m pytest -q -rs -x --timeout=120 $repo/crates/hetmem-py/tests) > $R/pytest.txt 2>&1 || true
grep -q "unrecognized arguments: --timeout" $R/pytest.txt && (cd /tmp && HETMEM_REQUIRE_GPU=1 HETMEM_REQUIRE_NIXL=1 step 240 python3 -m pytest -q -rs $repo/crates/hetmem-py/tests) > $R/pytest.txt 2>&1
tail -25 $R/pytest.txt
step 200 python3 crates/hetmem-py/bench/ring_conv.py --json $R/ring_conv.json > $R/ring.txt 2>&1; tail -15 $R/ring.txt
step 60 python3 crates/hetmem-py/bench/nixl_overhead.py --reps 5 > $R/nixl-overhead.txt 2>&1; tail -8 $R/nixl-overhead.txt
UCX_TLS=cuda_copy,cuda_ipc,sm,self step 60 python3 crates/hetmem-py/bench/nixl_overhead.py --ucx-none --reps 5 > $R/nixl-overhead-none.txt 2>&1; tail -8 $R/nixl-overhead-none.txt
step 60 python3 bench/peers/python_load.py --make /tmp/ck8 --gib 8 > $R/make8.txt 2>&1
step 200 python3 bench/peers/python_load.py --dir /tmp/ck8 --cli gpu-bundle/bin/hetmem --json $R/load8.json > $R/load8.txt 2>&1; tail -30 $R/load8.txt
tar czf $OUT/b.tgz -C $OUT b && rm -rf $R
