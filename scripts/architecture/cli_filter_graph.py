#!/usr/bin/env python3
"""File-level import graph of `hetmem filter` and the media crate it stands on: the files of
crates/hetmem-cli/src/filter (+ filter.rs as `filter`) and of crates/hetmem-media/src (+ lib.rs
as `media`), nodes named `filter/x` and `media/x`. Edges come from `use` trees and paths outside
tests: `super::`, `self::`, `crate::`, a child module by its bare name, and `hetmem_media::`
(an item the media crate re-exports at its root counts as its file's). Items a file takes from
a module above it (`super::Job`, `crate::Budget` from a child) are no edge: a parent declares
its children, so that would make every parent and child a circle. Also what each CLI file uses
from the CLI crate outside filter/ (crate::choices, crate::ui, ...), and the cycles across both
crates (Tarjan). Usage: python3 cli_filter_graph.py [WORKSPACE]"""
import os, re, sys, collections
sys.path.insert(0, os.path.dirname(__file__))
from rustlex import *
WS = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), '../..')
CLI = os.path.join(WS, 'crates/hetmem-cli/src'); MEDIA = os.path.join(WS, 'crates/hetmem-media/src')

# Each node: (crate, module path) -> file. The CLI's filter module sits at ['filter'].
files = {}
def add_tree(krate, root, sub):
    top = os.path.join(root, *sub) if sub else root
    if sub: files[(krate, tuple(sub))] = top + '.rs'
    elif os.path.exists(os.path.join(root, 'lib.rs')): files[(krate, ())] = os.path.join(root, 'lib.rs')
    if os.path.isdir(top):
        for f in sorted(os.listdir(top)):
            if f.endswith('.rs') and f not in ('lib.rs', 'main.rs'): add_tree(krate, root, sub + [f[:-3]])
add_tree('filter', CLI, ['filter'])
if os.path.isdir(MEDIA): add_tree('media', MEDIA, [])
def label(node):
    krate, path = node
    rest = path[1:] if krate == 'filter' else path
    return '/'.join((krate,) + rest) if rest else krate

def use_paths(tree, prefix=()):
    """`a::{b, c::{d, e}}` -> [a::b, a::c::d, a::c::e] as tuples of segments."""
    tree = tree.strip()
    i = tree.find('{')
    if i < 0:
        segs = [x for x in re.sub(r'\s+as\s+\w+$', '', tree).split('::') if x]
        return [prefix + tuple(segs)]
    head = tuple(x for x in tree[:i].split('::') if x)
    body = tree[i + 1:match_brace(tree, i)]
    parts, depth, cur = [], 0, ''
    for ch in body:
        if ch == ',' and depth == 0: parts.append(cur); cur = ''; continue
        depth += ch == '{'; depth -= ch == '}'; cur += ch
    parts.append(cur)
    return [p for part in parts if part.strip() for p in use_paths(part, prefix + head)]

# The media crate's root re-exports: item -> the module path it comes from.
reexports = {}
if ('media', ()) in files:
    lib = strip(open(files[('media', ())]).read())
    for m in re.finditer(r'\bpub\s+use\s+([^;]+);', lib):
        for p in use_paths(m.group(1)):
            if p and p[0] == 'self': reexports[p[-1]] = p[1:-1]

def resolve(node, segs, children):
    """The node a path in `node`'s file reaches, or None (another crate, std)."""
    krate, path = node
    if not segs: return None
    first, rest = segs[0], list(segs[1:])
    if first == 'crate': base_krate, base = krate, (() if krate == 'media' else None)
    elif first == 'self': base_krate, base = krate, path
    elif first == 'super': base_krate, base = krate, path[:-1]
    elif first == 'hetmem_media': base_krate, base = 'media', ()
    elif first in children: base_krate, base, rest = krate, path + (first,), list(segs[1:])
    else: return None
    if base is None:  # crate:: in the CLI: only crate::filter::... is a node
        if not rest or rest[0] != 'filter': return None
        base, rest = ('filter',), rest[1:]
    while rest and rest[0] == 'super': base, rest = base[:-1], rest[1:]
    target = base
    for seg in rest:
        if (base_krate, target + (seg,)) in files: target = target + (seg,)
        else:
            if base_krate == 'media' and target == () and seg in reexports: target = reexports[seg]
            break
    return (base_krate, target) if (base_krate, target) in files else None

edges = collections.defaultdict(set); outside = collections.defaultdict(set); lines = {}
for node, p in files.items():
    text = open(p).read(); s = strip(text); regs = test_regions(s); lines[node] = text.count('\n')
    children = set(re.findall(r'^\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;', s, re.M))
    targets = []
    for m in re.finditer(r'\buse\s+([^;]+);', s):
        if in_regions(m.start(), regs): continue
        for segs in use_paths(m.group(1)):
            targets.append(segs)
            if node[0] == 'filter' and segs[:1] == ('crate',) and len(segs) > 1 and segs[1] != 'filter':
                outside[node].add(segs[1])
    for m in re.finditer(r'(?<![\w:])((?:\w+::)+)\w+(?![\w:])', s):
        if not in_regions(m.start(), regs): targets.append(tuple(m.group(0).split('::')))
    for segs in targets:
        t = resolve(node, segs, children)
        # Not an ancestor of this file (see above), nor the file itself.
        if t and not (t[0] == node[0] and node[1][:len(t[1])] == t[1]): edges[node].add(t)
    if node[0] == 'filter':
        for m in re.finditer(r'(?<![\w:])crate::(\w+)::', s):
            if not in_regions(m.start(), regs) and m.group(1) != 'filter': outside[node].add(m.group(1))
nodes = sorted(files, key=label)
sccs = strongly_connected(nodes, edges)
for krate, title in (('filter', 'crates/hetmem-cli/src/filter (+ filter.rs)'), ('media', 'crates/hetmem-media/src (+ lib.rs)')):
    mine = [n for n in nodes if n[0] == krate]
    print(f'## {title}: {len(mine)} files, {sum(lines[n] for n in mine)} lines')
    for n in mine:
        print(f'  {label(n):24} {lines[n]:4}  -> {", ".join(sorted(label(t) for t in edges[n]))}'
              + (f'   | crate::{{{", ".join(sorted(outside[n]))}}}' if outside[n] else ''))
print('## cycles:', [sorted(label(x) for x in c) for c in sccs if len(c) > 1])
