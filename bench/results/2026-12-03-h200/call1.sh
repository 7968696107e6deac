#!/usr/bin/env bash
# Device call 1: the staging ring's shape against `hetmem load`'s warm rate (depth apart from
# threads and chunk), the windows route alone and beside a staged load (scripts/probes/load_ring.py);
# hetmem.load against KvikIO in the same run; the GPU test suite and the Python suite.
set -u
R=$OUT/c1; mkdir -p $R
T0=$(date +%s); BUDGET=${BUDGET:-565}
# step LIMIT CMD...: runs CMD under LIMIT seconds, or skips it (saying so) when it could run past
# the call's budget, so that the results' tarball is always written.
step() { local t=$1; shift; local left=$((BUDGET - ($(date +%s) - T0))); if [ $t -gt $left ]; then echo "== SKIPPED (needs $t s, $left left): $*" | tee -a $R/steps.txt; return 0; fi; echo "== $* (limit $t s)" | tee -a $R/steps.txt; local s=$(date +%s.%N); timeout $t "$@"; local rc=$?; echo "   rc=$rc $(python3 -c "import time;print(round(time.time()-$s,1))") s" | tee -a $R/steps.txt; }
rm -rf gpu-bundle /tmp/site; tar xJf gpu-bundle.tar.xz
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/hetmem/*.whl .whl/peers/*.whl > $R/pip.txt 2>&1 || cat $R/pip.txt
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv > $R/gpu.txt; lscpu | head -20 >> $R/gpu.txt
step 70 python3 bench/peers/python_load.py --make /tmp/ck8 --gib 8 > $R/make8.txt 2>&1
step 200 python3 scripts/probes/load_ring.py --cli gpu-bundle/bin/hetmem --dir /tmp/ck8 --json $R/load_ring.json > $R/load_ring.txt 2>&1; cat $R/load_ring.txt
step 90 python3 bench/peers/load_sweep.py --dir /tmp/ck8 --threads 12,16 --chunks-mib 8,16 --json $R/load_sweep.json > $R/load_sweep.txt 2>&1; cat $R/load_sweep.txt
rm -rf /tmp/ck8
step 200 gpu-bundle/run-tests $R/logs > $R/run-tests.txt 2>&1; tail -15 $R/run-tests.txt
step 100 python3 -m pytest -q -rs -p no:cacheprovider crates/hetmem-py/tests --ignore=crates/hetmem-py/tests/test_nixl.py > $R/pytest.txt 2>&1; tail -15 $R/pytest.txt
tar czf $OUT/c1.tgz -C $OUT c1 && rm -rf $R
