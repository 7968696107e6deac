#!/usr/bin/env bash
# Device call 2: the Ctrl-C tests (timed to the KeyboardInterrupt now); NIXL's UCX, which protocol it picks for pinned host <-> device memory
# (UCX_PROTO_INFO), and tuning variants at 256 MiB; the host's half of a staged load alone.
CALL=c2; BUDGET=450; . bench/results/2026-12-03b-h200/common.sh
(cd /tmp && HETMEM_REQUIRE_GPU=1 step 60 python3 -m pytest -q -rs --tb=short -p no:cacheprovider $T/test_interrupts.py) > $R/pytest-interrupts.txt 2>&1; tail -25 $R/pytest-interrupts.txt
N=bench/peers/nixl_link.py; MiB256=268435456
export UCX_TLS=cuda_copy,cuda_ipc,sm,self
for where in one two; do
  UCX_PROTO_INFO=y UCX_LOG_LEVEL=info step 45 python3 $N case $where h2d $MiB256 none > $R/proto-$where.txt 2> $R/proto-$where.err
  grep RESULT $R/proto-$where.txt
done
v() { local name=$1; shift; echo "VARIANT $name: $*"; env "$@" timeout 40 python3 $N variant $UCX_TLS none 2>&1 | grep -v '^VERSIONS\|^CEILING_256MiB_END'; }
{
v base
v frag4m UCX_RNDV_FRAG_SIZE=host:4m,cuda:4m
v frag32m UCX_RNDV_FRAG_SIZE=host:32m,cuda:32m
v workers4 NIXL_LINK_UCX_PARAMS='{"num_workers": "4"}'
v cma UCX_TLS=cuda_copy,cuda_ipc,cma,self
v ipc_same UCX_CUDA_IPC_ENABLE_SAME_PROCESS=y
v nomemcache UCX_MEMTYPE_CACHE=n
v pipeline_off UCX_RNDV_PIPELINE_SEND_THRESH=inf
v get_zcopy_frag UCX_RNDV_SCHEME=get_zcopy UCX_RNDV_FRAG_SIZE=host:8m,cuda:8m
} > $R/variants.txt 2>&1
grep -E "VARIANT|GBps_median|error" $R/variants.txt | cut -c1-300
step 70 python3 bench/peers/python_load.py --make /tmp/ck8 --gib 8 > $R/make8.txt 2>&1
step 100 python3 scripts/probes/host_copy_ceiling.py --dir /tmp/ck8 --json $R/host_copy.json > $R/host_copy.txt 2>&1; tail -20 $R/host_copy.txt
tar czf $OUT/c2.tgz -C $OUT c2 && rm -rf $R
