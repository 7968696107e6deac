#!/usr/bin/env bash
# Device call 1: installs (bundle, wheel, NIXL); the whole Python suite with HETMEM_REQUIRE_GPU=1
# (NIXL apart), then NIXL's (the in-flight hand-off test over TCP + cuda_copy); the ring's conv
# bench with the conv-alone bound.
CALL=c1; BUDGET=420; . bench/results/2026-12-03b-h200/common.sh
nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv > $R/gpu.txt 2>&1
(cd /tmp && HETMEM_REQUIRE_GPU=1 step 230 python3 -m pytest -q -rs --tb=short -o faulthandler_timeout=40 -p no:cacheprovider $T --ignore=$T/test_nixl.py) > $R/pytest.txt 2>&1; tail -30 $R/pytest.txt
(cd /tmp && HETMEM_REQUIRE_GPU=1 HETMEM_REQUIRE_NIXL=1 step 90 python3 -m pytest -q -rs --tb=short -p no:cacheprovider $T/test_nixl.py) > $R/pytest-nixl.txt 2>&1; tail -12 $R/pytest-nixl.txt
step 120 python3 crates/hetmem-py/bench/ring_conv.py --frames 2000 --repeats 2 --json $R/ring_conv.json > $R/ring.txt 2>&1; tail -24 $R/ring.txt
tar czf $OUT/c1.tgz -C $OUT c1 && rm -rf $R
