#!/usr/bin/env bash
# Device call 1: the mapped blur's shape below half a tile per SM (tiles, bands, CHUNK), beside
# plain copies of several shapes, with the input as a producer leaves it; what UCX inside NIXL's
# wheel loads (memory domains, transports), and NIXL transfer variants around it.
CALL=c1; BUDGET=540; . bench/results/2026-12-04-h200/common.sh
nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv > $R/gpu.txt
P=scripts/probes/blur_mapped_shape.cu
for c in 16 8 32; do step 120 nvcc -O3 -arch=sm_90 -DCHUNK=$c -o /tmp/bms$c $P; done
step 150 /tmp/bms16 > $R/blur-shape-chunk16.txt 2>&1; cat $R/blur-shape-chunk16.txt
for c in 8 32; do step 60 /tmp/bms$c 256 > $R/blur-shape-chunk$c.txt 2>&1; cat $R/blur-shape-chunk$c.txt; done
export UCX_TLS=cuda_copy,cuda_ipc,sm,self
step 30 python3 scripts/probes/ucx_resources.py /tmp/nixl-site > $R/ucx-resources.txt 2>&1
grep -v "^UCX_" $R/ucx-resources.txt | head -50
LD_LIBRARY_PATH=/usr/local/cuda/lib64 step 30 python3 scripts/probes/ucx_resources.py /tmp/nixl-site > $R/ucx-resources-cudart.txt 2>&1
grep -E "component|md |resource" $R/ucx-resources-cudart.txt
N=bench/peers/nixl_link.py
v() { local name=$1; shift; echo "VARIANT $name: $*"; env "$@" timeout 40 python3 $N variant $UCX_TLS none 2>&1 | grep -v '^VERSIONS\|^CEILING_256MiB_END'; }
mkdir -p $R/protos
{
v base
v protoinfo UCX_PROTO_INFO=y UCX_PROTO_INFO_DIR=$R/protos UCX_LOG_LEVEL=info
v cudart LD_LIBRARY_PATH=/usr/local/cuda/lib64
v proto_v1 UCX_PROTO_ENABLE=n
v put_zcopy UCX_RNDV_SCHEME=put_zcopy
v cuda_copy_only_sm UCX_TLS=cuda_copy,sm,self
v cudart_v1 LD_LIBRARY_PATH=/usr/local/cuda/lib64 UCX_PROTO_ENABLE=n
} > $R/variants.txt 2>&1
grep -E "VARIANT|GBps_median|error|Error" $R/variants.txt | cut -c1-300
ls -la $R/protos | head; head -c 3000 $R/protos/* 2>/dev/null
tar czf $OUT/c1.tgz -C $OUT c1 && rm -rf $R
