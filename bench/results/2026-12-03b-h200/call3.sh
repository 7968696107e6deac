#!/usr/bin/env bash
# Device call 3: the Rust bundle's tests and examples with HETMEM_REQUIRE_GPU=1 (the doorbell
# kernel's fix among them).
CALL=c3; BUDGET=300; . bench/results/2026-12-03b-h200/common.sh
step 260 gpu-bundle/run-tests $R/logs > $R/run-tests.txt 2>&1; tail -6 $R/run-tests.txt; grep -E "^fail" $R/run-tests.txt
tar czf $OUT/c3.tgz -C $OUT c3 && rm -rf $R
