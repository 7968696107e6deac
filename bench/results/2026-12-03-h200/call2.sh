#!/usr/bin/env bash
# Device call 2: the free staging buffers handed out newest first (LIFO) against oldest first (the old
# FIFO, by a temporary variable of this build), ring by ring; hetmem.load against KvikIO; the
# Python suite with tracebacks (it failed on the GPU in call 1).
set -u
R=$OUT/c2; mkdir -p $R
T0=$(date +%s); BUDGET=${BUDGET:-565}
# step LIMIT CMD...: runs CMD under LIMIT seconds, or skips it (saying so) when it could run past
# the call's budget, so that the results' tarball is always written.
step() { local t=$1; shift; local left=$((BUDGET - ($(date +%s) - T0))); if [ $t -gt $left ]; then echo "== SKIPPED (needs $t s, $left left): $*" | tee -a $R/steps.txt; return 0; fi; echo "== $* (limit $t s)" | tee -a $R/steps.txt; local s=$(date +%s.%N); timeout $t "$@"; local rc=$?; echo "   rc=$rc $(python3 -c "import time;print(round(time.time()-$s,1))") s" | tee -a $R/steps.txt; }
rm -rf gpu-bundle /tmp/site; tar xJf gpu-bundle.tar.xz
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/hetmem/*.whl .whl/peers/*.whl > $R/pip.txt 2>&1 || cat $R/pip.txt
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv > $R/gpu.txt; lscpu | head -20 >> $R/gpu.txt
step 70 python3 bench/peers/python_load.py --make /tmp/ck8 --gib 8 > $R/make8.txt 2>&1
T=$PWD/crates/hetmem-py/tests
(cd /tmp && HETMEM_REQUIRE_GPU=1 step 60 python3 -m pytest -q -rs --tb=short -o faulthandler_timeout=25 -p no:cacheprovider $T/test_ring_attacks.py $T/test_ring_feed.py) > $R/pytest-ring.txt 2>&1; tail -40 $R/pytest-ring.txt
step 200 python3 scripts/probes/load_ring.py --cli gpu-bundle/bin/hetmem --dir /tmp/ck8 --reps 4 --only-ring --ab HETMEM_FREE_ORDER_FIFO --ring 8x8x16,8x8x32,8x16x16,8x4x16,8x4x32,12x4x24,16x4x32,12x8x24,16x8x32,16x16x32,8x2x32 --json $R/load_ring.json > $R/load_ring.txt 2>&1; cat $R/load_ring.txt
step 120 python3 bench/peers/load_sweep.py --dir /tmp/ck8 --reps 5 --threads 8,12 --chunks-mib 4,8,16 --json $R/load_sweep.json > $R/load_sweep.txt 2>&1; cat $R/load_sweep.txt
rm -rf /tmp/ck8
(cd /tmp && HETMEM_REQUIRE_GPU=1 step 150 python3 -m pytest -q -rs --tb=short -o faulthandler_timeout=25 -p no:cacheprovider $T --ignore=$T/test_nixl.py --ignore=$T/test_ring_attacks.py --ignore=$T/test_ring_feed.py) > $R/pytest.txt 2>&1; tail -30 $R/pytest.txt
tar czf $OUT/c2.tgz -C $OUT c2 && rm -rf $R
