#!/usr/bin/env bash
# Device call 2 (carry gpu-bundle.tar.xz and .whl): the whole Rust bundle with
# HETMEM_REQUIRE_GPU=1, the Python suite on the GPU, then kernel_tour (with the resident
# kernels) under compute-sanitizer.
CALL=c2; BUDGET=${BUDGET:-570}; . bench/results/2026-12-04-h200/common.sh
step 260 gpu-bundle/run-tests $R/logs > $R/run-tests.txt 2>&1; tail -6 $R/run-tests.txt; grep -E "^fail" $R/run-tests.txt
(cd /tmp && HETMEM_REQUIRE_GPU=1 step 200 python3 -m pytest -q -rs --tb=short -o faulthandler_timeout=40 -p no:cacheprovider $T --ignore=$T/test_nixl.py) > $R/pytest.txt 2>&1; tail -8 $R/pytest.txt
step 100 gpu-bundle/run-tests --sanitize $R/sanitize > $R/sanitize.txt 2>&1; tail -8 $R/sanitize.txt
tar czf $OUT/c2.tgz -C $OUT c2 && rm -rf $R
