#!/usr/bin/env python3
"""File-level import graph inside crates/hetmem-cli/src/filter (+ filter.rs as `filter`):
`use super::x`, `super::x::`, `crate::filter::x`, `self::x` (in filter.rs); what each file uses
from the CLI crate outside filter/ (crate::choices, crate::ui, ...), and cycles (Tarjan).
Usage: python3 cli_filter_graph.py [CLI_SRC]"""
import os, re, sys, collections
sys.path.insert(0, os.path.dirname(__file__))
from rustlex import *
SRC = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), '../../crates/hetmem-cli/src')
files = {'filter': os.path.join(SRC, 'filter.rs')}
for f in os.listdir(os.path.join(SRC, 'filter')):
    if f.endswith('.rs'): files[f[:-3]] = os.path.join(SRC, 'filter', f)
edges = collections.defaultdict(set); outside = collections.defaultdict(set); lines = {}
for name, p in files.items():
    s = strip(open(p).read()); regs = test_regions(s); lines[name] = open(p).read().count('\n')
    pre = r'(?:self|crate::filter)' if name == 'filter' else r'(?:super|crate::filter)'
    for m in re.finditer(r'\buse\s+([^;]+);', s):
        if in_regions(m.start(), regs): continue
        t = re.sub(r'\s+', '', m.group(1))
        mm = re.match(pre.replace('(?:', '(?:') + r'::(.*)', t)
        if mm:
            rest = mm.group(1)
            heads = re.findall(r'(?:^|[{,])(\w+)', rest) if rest.startswith('{') else [rest.split('::')[0]]
            for h in heads:
                if h in files and h != name: edges[name].add(h)
        mc = re.match(r'crate::(\w+)|crate::\{(.*)\}', t)
        if mc and not t.startswith('crate::filter'):
            for h in ([mc.group(1)] if mc.group(1) else re.findall(r'(?:^|,)(\w+)', mc.group(2))):
                if h != 'filter': outside[name].add(h)
    for m in re.finditer(r'(?<![\w])(?:super|crate::filter)::(\w+)::', s):
        if not in_regions(m.start(), regs) and m.group(1) in files and m.group(1) != name: edges[name].add(m.group(1))
sccs = strongly_connected(sorted(files), edges)
print(f'## filter/ files: {len(files)}, {sum(lines.values())} lines')
for n in sorted(files): print(f'  {n:22} {lines[n]:4}  -> {", ".join(sorted(edges[n]))}' + (f'   | crate::{{{", ".join(sorted(outside[n]))}}}' if outside[n] else ''))
print('## cycles:', [sorted(x) for x in sccs if len(x) > 1])
