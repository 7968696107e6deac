#!/usr/bin/env bash
# Device call C: the seeds' link cells (quick against full, write-combined, page sizes, pinning,
# the demo's NVML column), then hetmem.load at 16 GiB.
set -u
R=$OUT/c; mkdir -p $R
step() { local t=$1; shift; echo "== $* (limit $t s)" | tee -a $R/steps.txt; local s=$(date +%s.%N); timeout $t "$@"; local rc=$?; echo "   rc=$rc $(python3 -c "import time;print(round(time.time()-$s,1))") s" | tee -a $R/steps.txt; }
[ -x gpu-bundle/bin/hetmem ] && [ -d gpu-bundle/tests ] || tar xJf gpu-bundle.tar.xz
[ -d /tmp/site/hetmem ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/hetmem/*.whl .whl/peers/*.whl
export PYTHONUNBUFFERED=1
repo=$PWD
(cd /tmp && PYTHONPATH=/tmp/site HETMEM_REQUIRE_GPU=1 step 90 python3 -m pytest -q -rs $repo/crates/hetmem-py/tests/test_ring.py $repo/crates/hetmem-py/tests/test_truncation.py) > $R/pytest-ring.txt 2>&1; tail -12 $R/pytest-ring.txt
ls /tmp/ck8 | head -3
[ -d /tmp/ck8 ] && PYTHONPATH=/tmp/site step 100 python3 bench/peers/python_load.py --dir /tmp/ck8 --loaders fastsafetensors,runai,kvikio,hetmem --cold 1 --warm 2 --json $R/load8-peers.json > $R/load8-peers.txt 2>&1; tail -14 $R/load8-peers.txt
step 200 scripts/bench-seed-claims $R/seed link > $R/seed-link.txt 2>&1; tail -8 $R/seed-link.txt
step 120 scripts/bench-seed-claims $R/seed claims > $R/seed-claims.txt 2>&1; tail -5 $R/seed-claims.txt
tar czf $OUT/c.tgz -C $OUT c && rm -rf $R
