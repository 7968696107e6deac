#!/usr/bin/env bash
# Device call 4 (a DALI piece travels with it): the ring's conv bench again, a second sample of
# the conv-alone bound; the Ctrl-C tests again.
CALL=c4; BUDGET=200; . bench/results/2026-12-03b-h200/common.sh
step 120 python3 crates/hetmem-py/bench/ring_conv.py --frames 2000 --repeats 2 --json $R/ring_conv.json > $R/ring.txt 2>&1; tail -24 $R/ring.txt
(cd /tmp && HETMEM_REQUIRE_GPU=1 step 60 python3 -m pytest -q -rs --tb=short -p no:cacheprovider $T/test_interrupts.py) > $R/pytest-interrupts.txt 2>&1; tail -5 $R/pytest-interrupts.txt
tar czf $OUT/c4.tgz -C $OUT c4 && rm -rf $R
