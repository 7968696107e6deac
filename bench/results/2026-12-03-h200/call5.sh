#!/usr/bin/env bash
# Device call 5: the host's half of a staged load alone (page cache into a pinned ring by Python
# threads' preadv, 4 MiB pieces, no GPU copy) for a 96 MiB ring and a 1 GiB one, and hetmem.load's
# wall time split into the stream's own seconds and the rest (call 3's wheel).
set -u
R=$OUT/c5; mkdir -p $R
rm -rf /tmp/site
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/hetmem/*.whl > $R/pip.txt 2>&1 || cat $R/pip.txt
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
timeout 70 python3 bench/peers/python_load.py --make /tmp/ck8 --gib 8 > $R/make8.txt 2>&1
timeout 100 python3 scripts/probes/host_copy_ceiling.py --dir /tmp/ck8 --json $R/host_copy.json 2>&1 | tee $R/host_copy.txt
tar czf $OUT/c5.tgz -C $OUT c5 && rm -rf $R
