#!/usr/bin/env python3
"""Every Error::invalid(what, problem) in crates/*/src outside #[cfg(test)] items, with the
problem text's start, flagged RUNTIME? when the text reads as a state (stopped, closed, lent,
in flight, on the CPU backend, already, poisoned, finished...) rather than a bad argument.
Usage: python3 invalid_uses.py [WORKSPACE]"""
import os, re, sys, collections
sys.path.insert(0, os.path.dirname(__file__))
from rustlex import *
WS = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), '../..')
STATE = re.compile(r'stopp|closed|lent|in flight|still|already|CPU backend|CPU queue|cpu backend|cuda backend|needs a GPU|poison|finished|shut|busy|another queue|not started|was taken|no longer|running|lost|dropped|reclaim', re.I)
tot = collections.Counter(); flagged = []
for dp, dn, fn in os.walk(os.path.join(WS, 'crates')):
    if '/src' not in dp + '/': continue
    for f in sorted(fn):
        if not f.endswith('.rs'): continue
        p = os.path.join(dp, f); raw = open(p).read(); regs = test_regions(strip(raw))
        crate = os.path.relpath(p, WS).split(os.sep)[1]
        for m in re.finditer(r'Error::invalid\(\s*("([^"]*)"|\w+)\s*,\s*((?:format!\(\s*)?"?((?:[^"\\]|\\.){0,140}))', raw):
            if in_regions(m.start(), regs): continue
            tot[crate] += 1
            what, prob = m.group(2) or m.group(1), m.group(4).replace('\\\n', ' ')
            prob = re.sub(r'\s+', ' ', prob)
            if STATE.search(prob) or STATE.search(what):
                flagged.append(f'{os.path.relpath(p, WS)}:{line_of(raw, m.start())}: ({what!r}) {prob[:100]}')
print('## Error::invalid calls outside tests, per crate:', dict(tot), 'total', sum(tot.values()))
print(f'## {len(flagged)} read as run-time states (candidates for their own variant):')
for x in flagged: print('  ', x)
