#!/usr/bin/env bash
# Device call 3: carries DALI's site tree piece 3 (the pieces stay on the warm machine); nothing else.
CALL=c3; BUDGET=60; . bench/results/2026-12-04-h200/common.sh
ls -la .dali | tee $R/dali-pieces.txt
tar czf $OUT/c3.tgz -C $OUT c3 && rm -rf $R
