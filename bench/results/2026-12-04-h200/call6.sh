#!/usr/bin/env bash
# Device call 6: hetmem.nixl's staged write (Agent.write_staged) on the GPU: the NIXL test file
# with HETMEM_REQUIRE_GPU=1 (UCX as it comes, then the staged tests with the CUDA transports),
# and hetmem's staged write against the same two hops on plain torch tensors, turn about.
CALL=c6; BUDGET=${BUDGET:-330}; . bench/results/2026-12-04-h200/common.sh
(cd /tmp && HETMEM_REQUIRE_GPU=1 HETMEM_REQUIRE_NIXL=1 step 120 python3 -m pytest -q -rs --tb=short -p no:cacheprovider $T/test_nixl.py) > $R/pytest-nixl.txt 2>&1; tail -12 $R/pytest-nixl.txt
(cd /tmp && HETMEM_REQUIRE_GPU=1 HETMEM_REQUIRE_NIXL=1 UCX_TLS=cuda_copy,cuda_ipc,sm,self step 60 python3 -m pytest -q -rs --tb=short -p no:cacheprovider $T/test_nixl.py -k staged) > $R/pytest-nixl-staged-cuda-tls.txt 2>&1; tail -6 $R/pytest-nixl-staged-cuda-tls.txt
N=bench/peers/nixl_link.py
export UCX_TLS=cuda_copy,cuda_ipc,sm,self
{
for turn in 1 2 3; do
  for dir in h2d_staged h2d_hetmem; do echo "TURN $turn $dir"; timeout 60 python3 $N variant $UCX_TLS none two $dir 2>&1 | grep -v '^VERSIONS\|^CEILING_256MiB_END'; done
done
} > $R/staged-vs-hetmem.txt 2>&1
grep -E "TURN|GBps_median|rror|CEILING" $R/staged-vs-hetmem.txt | cut -c1-300
tar czf $OUT/c6.tgz -C $OUT c6 && rm -rf $R
