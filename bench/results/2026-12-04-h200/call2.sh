#!/usr/bin/env bash
# Device call 2: the Rust bundle's tests (the doorbell waits' fix among them); NIXL between two
# processes device to device (cuda_ipc?) and host to a peer's device staged through a device
# buffer of the initiator, with the protocols UCX picks; the emulated put's fragment size.
CALL=c2; BUDGET=${BUDGET:-500}; . bench/results/2026-12-04-h200/common.sh
step 330 gpu-bundle/run-tests > $R/run-tests.txt 2>&1; tail -15 $R/run-tests.txt
N=bench/peers/nixl_link.py
export UCX_TLS=cuda_copy,cuda_ipc,sm,self
v() { local name=$1; shift; echo "VARIANT $name: $*"; env "$@" timeout 60 python3 $N variant $UCX_TLS none $WHERE $DIR 2>&1 | grep -v '^VERSIONS\|^CEILING_256MiB_END'; }
mkdir -p $R/protos-d2d $R/protos-staged
{
WHERE=two DIR=d2d v d2d_two UCX_PROTO_INFO=y UCX_PROTO_INFO_DIR=$R/protos-d2d
WHERE=one DIR=d2d v d2d_one
WHERE=two DIR=h2d_staged v staged_two UCX_PROTO_INFO=y UCX_PROTO_INFO_DIR=$R/protos-staged
WHERE=two DIR=h2d_staged v staged_two_16 NIXL_LINK_STAGE_PIECES=16
WHERE=two DIR=h2d_staged v staged_two_4 NIXL_LINK_STAGE_PIECES=4
WHERE=two DIR=h2d_staged v staged_two_1 NIXL_LINK_STAGE_PIECES=1
WHERE=two DIR=h2d v seg1m_two UCX_MM_SEG_SIZE=1m UCX_SYSV_SEG_SIZE=1m UCX_POSIX_SEG_SIZE=1m
WHERE=two DIR=h2d v seg256k_two UCX_MM_SEG_SIZE=256k UCX_SYSV_SEG_SIZE=256k UCX_POSIX_SEG_SIZE=256k
WHERE=two DIR=both v base_two
} > $R/variants.txt 2>&1
grep -E "VARIANT|GBps_median|rror|CEILING" $R/variants.txt | cut -c1-360
for d in protos-d2d protos-staged; do echo "== $d: $(ls $R/$d | wc -l) files"; ls $R/$d | grep -v am_send | grep -i "cuda" | head -20; done
tar czf $OUT/c2.tgz -C $OUT c2 && rm -rf $R
