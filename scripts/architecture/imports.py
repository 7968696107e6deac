#!/usr/bin/env python3
"""Module import graph of crates/hetmem/src (top-level module = first folder/file under src/).
Parses `use crate::..`, `use super::..` (resolved from the file's module path, inline mods
included) and inline `crate::x::` / `super::super::x::` paths, outside comments and strings.
Usage: python3 imports.py [--no-tests]  (prints edges, per-edge sites, SCCs)"""
import os, re, sys, json, collections
sys.path.insert(0, os.path.dirname(__file__))
from rustlex import *
ROOT = sys.argv[1] if len(sys.argv) > 1 and not sys.argv[1].startswith('--') else os.path.join(os.path.dirname(os.path.abspath(__file__)), '../../crates/hetmem/src')
NOTEST = '--no-tests' in sys.argv

# root names re-exported by lib.rs -> module
lib = strip(open(os.path.join(ROOT, 'lib.rs')).read())
rootmap = {}
def expand(tree):
    """expand a use tree text into list of segment lists"""
    tree = tree.strip()
    # find top-level '{'
    depth = 0
    for i, c in enumerate(tree):
        if c == '{':
            prefix = tree[:i].rstrip(':').strip(); body = tree[i+1:tree.rindex('}')]
            parts, d, cur = [], 0, ''
            for ch in body:
                if ch == '{': d += 1
                if ch == '}': d -= 1
                if ch == ',' and d == 0: parts.append(cur); cur = ''
                else: cur += ch
            parts.append(cur)
            pre = [p for p in prefix.split('::') if p] if prefix else []
            out = []
            for p in parts:
                if p.strip():
                    for e in expand(p): out.append(pre + e)
            return out
    t = re.sub(r'\s+as\s+\w+$', '', tree)
    return [[p.strip() for p in t.split('::') if p.strip()]]
for m in re.finditer(r'\bpub\s+use\s+([^;]+);', lib):
    for segs in expand(m.group(1)):
        if segs and segs[-1] != '*': rootmap[segs[-1]] = segs[0]
topmods = set()
for e in os.listdir(ROOT):
    if e.endswith('.rs') and e != 'lib.rs': topmods.add(e[:-3])
    elif os.path.isdir(os.path.join(ROOT, e)): topmods.add(e)

def resolve(modpath, segs):
    if not segs: return None
    if segs[0] == 'crate': abs_ = segs[1:]
    elif segs[0] in ('super', 'self'):
        cur = list(modpath); k = 0
        while k < len(segs) and segs[k] in ('super', 'self'):
            if segs[k] == 'super':
                if not cur: return None
                cur.pop()
            k += 1
        abs_ = cur + segs[k:]
    else: return None
    if not abs_: return None
    head = abs_[0]
    if head in topmods: return head
    if head in rootmap: return rootmap[head]
    return '(root:' + head + ')'

edges = collections.defaultdict(list)   # (a,b) -> [(file,line,text)]
for dp, dn, fn in os.walk(ROOT):
    for f in sorted(fn):
        if not f.endswith('.rs'): continue
        p = os.path.join(dp, f); raw = open(p).read(); s = strip(raw)
        fmod = file_modpath(ROOT, p)
        if not fmod: continue  # lib.rs
        me = fmod[0]
        regs = test_regions(s); mods = inline_mods(s)
        rawlines = raw.split('\n')
        def mp_at(off):
            extra = [name for name, o, c in mods if o < off < c]
            return fmod + extra
        seen = set()
        def add(off, segs):
            if NOTEST and in_regions(off, regs): return
            tgt = resolve(mp_at(off), segs)
            if tgt and tgt != me:
                ln = line_of(s, off)
                key = (me, tgt, p, ln)
                if key in seen: return
                seen.add(key)
                tag = ' [test]' if in_regions(off, regs) else ''
                edges[(me, tgt)].append((os.path.relpath(p, ROOT), ln, rawlines[ln-1].strip()[:110] + tag))
        uses = []
        for m in re.finditer(r'\buse\s+((?:crate|super|self)\b[^;]*);', s):
            uses.append((m.start(), m.end()))
            for segs in expand(m.group(1)): add(m.start(), segs)
        for m in re.finditer(r'(?<![\w$])(crate|super)((?:::\w+)+)', s):
            if any(a <= m.start() < b for a, b in uses): continue
            segs = [m.group(1)] + [x for x in m.group(2).split('::') if x]
            add(m.start(), segs)

nodes = sorted(topmods | {b for _, b in edges})
adj = collections.defaultdict(set)
for a, b in edges: adj[a].add(b)
sccs = strongly_connected(nodes, adj)
print('## imports (module -> modules it imports, #sites)')
for a in nodes:
    outs = sorted(adj[a])
    print(f'{a:10} -> ' + ', '.join(f'{b}({len(edges[(a,b)])})' for b in outs))
print('\n## SCCs with >1 module')
big = [c for c in sccs if len(c) > 1]
for c in big: print(' ', c)
print('\n## edges inside each SCC, with sites')
for c in big:
    cs = set(c)
    for (a, b), sites in sorted(edges.items()):
        if a in cs and b in cs:
            print(f'-- {a} -> {b} ({len(sites)})')
            for f, l, t in sites: print(f'     {f}:{l}: {t}')
json.dump({f'{a}->{b}': v for (a, b), v in edges.items()}, open(os.path.join(os.environ.get('ARCH_OUT', '.'), 'edges%s.json' % ('_notest' if NOTEST else '')), 'w'), indent=1)
