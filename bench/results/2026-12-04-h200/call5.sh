#!/usr/bin/env bash
# Device call 5: DALI (its pieces carried one per call, joined and checked here) beside
# DataLoader and WorkerLoader at N=12 on the JPEG set, ResNet-50 and ResNet-18 at batch 256
# (the rows the last session's call could not run), then NIXL follow-ups.
CALL=c5; BUDGET=${BUDGET:-420}; . bench/results/2026-12-04-h200/common.sh
ls -la .dali > $R/dali-pieces.txt
cat .dali/part-* > /tmp/dali-site.tar.xz && (cd /tmp && sha256sum -c $OLDPWD/.dali/SHA256SUMS) > $R/dali-sum.txt 2>&1; cat $R/dali-sum.txt
rm -rf /tmp/dali-site && mkdir -p /tmp/dali-site && tar xJf /tmp/dali-site.tar.xz -C /tmp/dali-site
export PYTHONPATH=/tmp/site:/tmp/dali-site PYTHONUNBUFFERED=1
LOADERS=torch,hetmem,dali
python3 -c "import nvidia.dali as d; print('DALI', d.__version__)" > $R/dali-version.txt 2>&1 || LOADERS=torch,hetmem
tail -3 $R/dali-version.txt; echo "loaders: $LOADERS"
step 40 python3 crates/hetmem-py/bench/worker_loader.py --make /tmp/jpegs --count 1500 > $R/make.txt 2>&1
step 240 python3 crates/hetmem-py/bench/worker_loader.py --data /tmp/jpegs --loaders $LOADERS --workers 12 --iters 20 --json $R/worker_loader.json > $R/worker_loader.txt 2>&1; tail -24 $R/worker_loader.txt
[ -x bench/results/2026-12-04-h200/call5-extra.sh ] && . bench/results/2026-12-04-h200/call5-extra.sh
tar czf $OUT/c5.tgz -C $OUT c5 && rm -rf $R
