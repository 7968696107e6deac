#!/usr/bin/env python3
"""Lines outside crates/hetmem/src/backend/ that discriminate on the backend.
Tier A: the public Device API: Device::Cpu / Device::Cuda (patterns or constructors),
        .as_cuda(), BackendKind::Cpu|Cuda, and .backend() compared (== / !=) or matched on.
        A bare .backend() that passes the kind on (a getter, a log line) decides nothing and
        is not counted; a comparison with a BackendKind is, through BackendKind::.
Tier B: the hand-off's internal mirror of it: QueueCore::is_cpu(), .cuda_ordinal(),
        the Option<&Stream> of QueueCore::stream(), QueueBackend::{Cuda,Cpu}, stream_fence().
Tier C: the Queue's public backend accessors used above the queue: .cuda_device(), queue.stream().
A+C: distinct lines matching A or C (the headline figure).
Comments and strings stripped; lines inside #[cfg(test)] items are reported apart.
Usage: python3 device_matches.py [SRC_ROOT]"""
import os, re, sys, collections
sys.path.insert(0, os.path.dirname(__file__))
from rustlex import *
ROOT = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), '../../crates/hetmem/src')
A = re.compile(r'\bDevice::(Cpu|Cuda)\b|\.as_cuda\(\)|\.backend\(\)\s*(==|!=)|\bmatch\b.*\.backend\(\)\s*\{|\bBackendKind::(Cpu|Cuda)\b')
B = re.compile(r'\.is_cpu\(\)|\.cuda_ordinal\(\)|\bQueueBackend::(Cuda|Cpu)\b|\.stream_fence\(\)|\bcore\(\)\.stream\(\)|\.core\.stream\(\)|\bself\.stream\(\)')
C = re.compile(r'\.cuda_device\(\)|\bqueue\.stream\(\)|queue\.stream\(\)')
res = {'A': collections.defaultdict(list), 'B': collections.defaultdict(list), 'C': collections.defaultdict(list), 'A+C': collections.defaultdict(list)}
for dp, dn, fn in os.walk(ROOT):
    for f in sorted(fn):
        if not f.endswith('.rs'): continue
        p = os.path.join(dp, f); rel = os.path.relpath(p, ROOT)
        if rel.startswith('backend' + os.sep): continue
        raw = open(p).read(); s = strip(raw); regs = test_regions(s)
        mod = rel.split(os.sep)[0].removesuffix('.rs')
        off = 0
        for ln, (sl, rl) in enumerate(zip(s.split('\n'), raw.split('\n')), 1):
            t = in_regions(off + len(sl) // 2, regs)
            for tier, rx in (('A', A), ('B', B), ('C', C)):
                if rx.search(sl) and not (tier == 'C' and rel.endswith('queue.rs')):
                    res[tier][(mod, t)].append(f'{rel}:{ln}: {rl.strip()[:100]}')
            if A.search(sl) or (C.search(sl) and not rel.endswith('queue.rs')):
                res['A+C'][(mod, t)].append(f'{rel}:{ln}: {rl.strip()[:100]}')
            off += len(sl) + 1
for tier in ('A', 'B', 'C', 'A+C'):
    d = res[tier]
    mods = sorted({m for m, _ in d})
    tot = sum(len(v) for (m, t), v in d.items() if not t)
    tott = sum(len(v) for (m, t), v in d.items() if t)
    print(f'## Tier {tier}: {tot} lines in library code, {tott} in unit tests')
    for m in mods:
        print(f'  {m:10} code {len(d.get((m, False), [])):3}  tests {len(d.get((m, True), [])):3}')
    for m in mods:
        for line in d.get((m, False), []): print('   ', line)
        for line in d.get((m, True), []): print('   ', line, '[test]')
