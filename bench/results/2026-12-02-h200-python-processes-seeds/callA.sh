#!/usr/bin/env bash
# Device call A: the bundle's GPU tests, the mapped-words and managed-attach examples under the
# sanitizers, the cross-process example, and the link/claims measurements.
set -u
R=$OUT/a; mkdir -p $R
step() { local t=$1; shift; echo "== $* (limit $t s)" | tee -a $R/steps.txt; local s=$(date +%s.%N); timeout $t "$@"; local rc=$?; echo "   rc=$rc $(python3 -c "import time;print(round(time.time()-$s,1))") s" | tee -a $R/steps.txt; }
tar xJf gpu-bundle.tar.xz
nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv > $R/gpu.txt
step 300 gpu-bundle/run-tests $R/logs > $R/run-tests.txt 2>&1
tail -40 $R/run-tests.txt
cd gpu-bundle
export HETMEM_REQUIRE_GPU=1 HETMEM_REQUIRE_NVRTC=1
step 60 compute-sanitizer --tool racecheck --error-exitcode 99 examples/mailbox_worker 200 > $R/racecheck.txt 2>&1; tail -3 $R/racecheck.txt
step 60 compute-sanitizer --tool memcheck --error-exitcode 99 examples/mailbox_worker 200 > $R/memcheck.txt 2>&1; tail -3 $R/memcheck.txt
step 30 examples/mailbox_worker 100000 > $R/mailbox.txt 2>&1; tail -3 $R/mailbox.txt
step 60 examples/managed_pingpong --rounds 200 --bytes 4096,65536,1048576,16777216 --json $R/managed-pingpong.json > $R/pingpong.txt 2>&1; tail -8 $R/pingpong.txt
step 90 examples/shared_registration --gib 4 --runs 5 > $R/shared-registration.txt 2>&1; tail -6 $R/shared-registration.txt
step 60 examples/two_processes > $R/two-processes.txt 2>&1; tail -3 $R/two-processes.txt
cd ..
tar czf $OUT/a.tgz -C $OUT a && rm -rf $R
