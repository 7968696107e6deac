#!/usr/bin/env bash
# Device call 4: carries DALI's site tree piece 4 (the pieces stay on the warm machine); nothing else.
CALL=c4; BUDGET=60; . bench/results/2026-12-04-h200/common.sh
ls -la .dali | tee $R/dali-pieces.txt
tar czf $OUT/c4.tgz -C $OUT c4 && rm -rf $R
