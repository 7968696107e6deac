#!/usr/bin/env bash
# The second H200 call: UCX tuning variants at 256 MiB (one process), then the best
# configuration of the first call from 1 MiB to 1 GiB between two processes.
r=.devcarry/nixl/run.sh; T=cuda_copy,cuda_ipc,sm,self
for v in UCX_RNDV_SCHEME=put_zcopy UCX_RNDV_SCHEME=get_zcopy UCX_PROTO_ENABLE=n UCX_RNDV_FRAG_MEM_TYPE=cuda; do
  echo "=== variant $v"; env "$v" NIXL_LINK_BUDGET_S=30 bash $r variant $T none 2>&1 | grep -v INFO | grep -E '^\{|CEILING|ARGS|VERSIONS' | grep -v '"rc 0: "'
done
echo "=== sweep"; NIXL_LINK_SIZES_MIB=1,16,256,1024 NIXL_LINK_BUDGET_S=90 bash $r sweep $T none 2>&1 | grep -v INFO | grep -v '"rc 0: "'
