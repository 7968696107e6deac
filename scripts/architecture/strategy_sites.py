#!/usr/bin/env python3
"""Where a frame Strategy's meaning is written or decided: lines (outside #[cfg(test)] items)
naming a concrete variant `Strategy::X` or matching on it, per file, across crates/*/src;
plus the doc tables (lines starting `/// | \`Cpu\`` or `//! | \`Cpu\``) and CLI help strings.
Usage: python3 strategy_sites.py [WORKSPACE]"""
import os, re, sys, collections
sys.path.insert(0, os.path.dirname(__file__))
from rustlex import *
WS = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), '../..')
V = re.compile(r'\bStrategy::(Cpu|Copy|PinnedAsync|ZeroCopy|Managed|Hybrid|Auto|ALL)\b')
T = re.compile(r'^\s*//[/!]\s*\|\s*`(Cpu|Copy|PinnedAsync|ZeroCopy|Managed|Hybrid)`')
per = collections.defaultdict(list); tables = collections.defaultdict(list)
for dp, dn, fn in os.walk(os.path.join(WS, 'crates')):
    for f in sorted(fn):
        if not f.endswith('.rs') or '/src' not in dp: continue
        p = os.path.join(dp, f); rel = os.path.relpath(p, WS)
        raw = open(p).read(); s = strip(raw); regs = test_regions(s)
        off = 0
        for ln, (sl, rl) in enumerate(zip(s.split('\n'), raw.split('\n')), 1):
            if not in_regions(off, regs):
                if V.search(sl): per[rel].append((ln, rl.strip()[:110]))
                if T.search(rl): tables[rel].append(ln)
            off += len(sl) + 1
print('## doc tables of the strategies (file: lines)')
for r, ls in tables.items(): print(f'  {r}: {ls[0]}-{ls[-1]} ({len(ls)} rows)')
print('\n## lines naming a concrete Strategy variant, outside tests (count per file, then sites)')
for r in sorted(per, key=lambda r: -len(per[r])): print(f'  {len(per[r]):3} {r}')
print()
for r in sorted(per):
    for ln, t in per[r]: print(f'  {r}:{ln}: {t}')
