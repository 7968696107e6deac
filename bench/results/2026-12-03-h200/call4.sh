#!/usr/bin/env bash
# Device call 4: the whole Python suite on the GPU with HETMEM_REQUIRE_GPU=1, the ring_feed
# tests' stages now copying tensors too (call 3's wheel: the Rust code it holds is this commit's
# but for the free stack's temporary FIFO variable, unset here).
set -u
R=$OUT/c4; mkdir -p $R
rm -rf /tmp/site
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/hetmem/*.whl .whl/peers/*.whl > $R/pip.txt 2>&1 || cat $R/pip.txt
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 HETMEM_REQUIRE_GPU=1
T=$PWD/crates/hetmem-py/tests
(cd /tmp && timeout 200 python3 -m pytest -q -rs --tb=short -o faulthandler_timeout=40 -p no:cacheprovider $T --ignore=$T/test_nixl.py) > $R/pytest.txt 2>&1; echo "rc=$?" >> $R/pytest.txt; tail -25 $R/pytest.txt
tar czf $OUT/c4.tgz -C $OUT c4 && rm -rf $R
