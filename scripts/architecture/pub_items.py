#!/usr/bin/env python3
"""Approximate public API size per crate: items declared `pub` (not pub(crate)/pub(super)/pub(in ..))
of kind fn (incl. const/async/unsafe fn), struct, enum, trait, type, const, static, mod, use,
outside comments/strings and #[cfg(test)] items; `pub use a::{B, C}` counts each name.
Also lists lib.rs's root re-exports. Usage: python3 pub_items.py [WORKSPACE]"""
import os, re, sys, collections
sys.path.insert(0, os.path.dirname(__file__))
from rustlex import *
WS = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), '../..')
rx = re.compile(r'(?<![\w)])pub\s+(?:(?:const|async|unsafe|extern\s+"C")\s+)*(fn|struct|enum|trait|type|const|static|mod|use)\b([^;{]*)')
def count_names(tree):
    # number of leaf names in a use tree
    t = re.sub(r'\s+', '', tree)
    if '{' not in t: return 1
    body = t[t.index('{')+1:t.rindex('}')]
    d = 0; parts = ['']
    for ch in body:
        if ch == '{': d += 1
        if ch == '}': d -= 1
        if ch == ',' and d == 0: parts.append('')
        else: parts[-1] += ch
    return sum(count_names(p) for p in parts if p)
for crate in sorted(os.listdir(os.path.join(WS, 'crates'))):
    src = os.path.join(WS, 'crates', crate, 'src')
    kinds = collections.Counter(); permod = collections.Counter()
    for dp, dn, fn in os.walk(src):
        for f in fn:
            if not f.endswith('.rs'): continue
            p = os.path.join(dp, f); s = strip(open(p).read()); regs = test_regions(s)
            rel = os.path.relpath(p, src); top = rel.split(os.sep)[0].removesuffix('.rs')
            for m in rx.finditer(s):
                if in_regions(m.start(), regs): continue
                k = m.group(1)
                n = count_names(s[m.end(1):s.index(';', m.end(1))]) if k == 'use' else 1
                kinds[k] += n; permod[top] += n
    print(f'## {crate}: {sum(kinds.values())} pub items  ' + ', '.join(f'{k} {v}' for k, v in kinds.most_common()))
    print('   by top module: ' + ', '.join(f'{k} {v}' for k, v in sorted(permod.items())))
lib = strip(open(os.path.join(WS, 'crates/hetmem/src/lib.rs')).read())
names = []
for m in re.finditer(r'\bpub\s+use\s+([^;]+);', lib):
    t = re.sub(r'\s+', ' ', m.group(1))
    body = t[t.index('{')+1:t.rindex('}')] if '{' in t else t.split('::')[-1]
    pre = t[:t.index('{')] if '{' in t else t
    for n in body.split(','):
        if n.strip(): names.append((pre.strip(':').strip(), n.strip()))
print(f'\n## hetmem root re-exports (lib.rs): {len(names)}')
by = collections.defaultdict(list)
for pre, n in names: by[pre].append(n)
for pre, ns in by.items(): print(f'   {pre}: {len(ns)}: ' + ', '.join(ns))
