# Sourced by every call's script: the results folder, the step helper, the installs present.
# step LIMIT CMD...: runs CMD under LIMIT seconds, or skips it (saying so) when it could run past
# the call's budget, so that the results' tarball is always written.
set -u
R=$OUT/$CALL; mkdir -p $R
T0=$(date +%s); BUDGET=${BUDGET:-560}
step() { local t=$1; shift; local left=$((BUDGET - ($(date +%s) - T0))); if [ $t -gt $left ]; then echo "== SKIPPED (needs $t s, $left left): $*" | tee -a $R/steps.txt; return 0; fi; echo "== $* (limit $t s)" | tee -a $R/steps.txt; local s=$(date +%s.%N); timeout $t "$@"; local rc=$?; echo "   rc=$rc $(python3 -c "import time;print(round(time.time()-$s,1))") s" | tee -a $R/steps.txt; }
export PYTHONPATH=/tmp/site:/tmp/nixl-site PYTHONUNBUFFERED=1
# What this call carried, installed once while the machine stays warm.
if [ -f gpu-bundle.tar.xz ] && [ ! -x gpu-bundle/run-tests ]; then tar xJf gpu-bundle.tar.xz; fi
if [ -d .whl/hetmem ] && [ ! -d /tmp/site/hetmem ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/hetmem/*.whl > $R/pip.txt 2>&1 || cat $R/pip.txt
fi
if [ -d .whl/nixl ] && [ ! -d /tmp/nixl-site/nixl_cu13 ]; then
  python3 -c "import zipfile,glob;zipfile.ZipFile(glob.glob('.whl/nixl/*.whl')[0]).extractall('/tmp/nixl-site')"
fi
T=$PWD/crates/hetmem-py/tests
git rev-parse HEAD > $R/COMMIT 2>/dev/null; git status --short >> $R/COMMIT 2>/dev/null
