#!/usr/bin/env bash
# Device call 3: the new load defaults (the CPUs at most 12 threads, 4 MiB pieces, depth twice
# the threads) against KvikIO and torch pread in the same run, the CLI beside hetmem.load; the
# free stack's order once more at the defaults; the ring_feed tests with their fixed stage; the
# GPU test suite over the free stack.
set -u
R=$OUT/c3; mkdir -p $R
T0=$(date +%s); BUDGET=${BUDGET:-565}
# step LIMIT CMD...: runs CMD under LIMIT seconds, or skips it (saying so) when it could run past
# the call's budget, so that the results' tarball is always written.
step() { local t=$1; shift; local left=$((BUDGET - ($(date +%s) - T0))); if [ $t -gt $left ]; then echo "== SKIPPED (needs $t s, $left left): $*" | tee -a $R/steps.txt; return 0; fi; echo "== $* (limit $t s)" | tee -a $R/steps.txt; local s=$(date +%s.%N); timeout $t "$@"; local rc=$?; echo "   rc=$rc $(python3 -c "import time;print(round(time.time()-$s,1))") s" | tee -a $R/steps.txt; }
rm -rf gpu-bundle /tmp/site; tar xJf gpu-bundle.tar.xz
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/hetmem/*.whl .whl/peers/*.whl > $R/pip.txt 2>&1 || cat $R/pip.txt
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
T=$PWD/crates/hetmem-py/tests
(cd /tmp && HETMEM_REQUIRE_GPU=1 step 60 python3 -m pytest -q -rs --tb=short -o faulthandler_timeout=25 -p no:cacheprovider $T/test_ring_attacks.py $T/test_ring_feed.py) > $R/pytest-ring.txt 2>&1; tail -25 $R/pytest-ring.txt
step 70 python3 bench/peers/python_load.py --make /tmp/ck8 --gib 8 > $R/make8.txt 2>&1
step 60 python3 scripts/probes/load_ring.py --cli gpu-bundle/bin/hetmem --dir /tmp/ck8 --reps 4 --only-ring --ab HETMEM_FREE_ORDER_FIFO --ring 12x4x24,8x4x16,16x4x32 --json $R/load_ring.json > $R/load_ring.txt 2>&1; cat $R/load_ring.txt
step 90 python3 bench/peers/load_sweep.py --dir /tmp/ck8 --reps 5 --threads 12,16 --chunks-mib 4 --json $R/load_sweep.json > $R/load_sweep.txt 2>&1; cat $R/load_sweep.txt
step 100 python3 bench/peers/python_load.py --dir /tmp/ck8 --loaders hetmem,hetmem_cli,kvikio,torch_pread --cold 0 --warm 3 --threads 12 --cli gpu-bundle/bin/hetmem --json $R/load8.json > $R/load8.txt 2>&1; tail -12 $R/load8.txt
rm -rf /tmp/ck8
step 220 gpu-bundle/run-tests $R/logs > $R/run-tests.txt 2>&1; tail -4 $R/run-tests.txt; grep -E "^fail" $R/run-tests.txt
tar czf $OUT/c3.tgz -C $OUT c3 && rm -rf $R
