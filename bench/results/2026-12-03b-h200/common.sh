# Sourced by every call's script: the results folder, the step helper, the installs.
# step LIMIT CMD...: runs CMD under LIMIT seconds, or skips it (saying so) when it could run past
# the call's budget, so that the results' tarball is always written.
set -u
R=$OUT/$CALL; mkdir -p $R
T0=$(date +%s); BUDGET=${BUDGET:-560}
step() { local t=$1; shift; local left=$((BUDGET - ($(date +%s) - T0))); if [ $t -gt $left ]; then echo "== SKIPPED (needs $t s, $left left): $*" | tee -a $R/steps.txt; return 0; fi; echo "== $* (limit $t s)" | tee -a $R/steps.txt; local s=$(date +%s.%N); timeout $t "$@"; local rc=$?; echo "   rc=$rc $(python3 -c "import time;print(round(time.time()-$s,1))") s" | tee -a $R/steps.txt; }
export PYTHONPATH=/tmp/site:/tmp/nixl-site PYTHONUNBUFFERED=1
