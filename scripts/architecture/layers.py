#!/usr/bin/env python3
"""Layer number of each module (longest import chain beneath it, SCCs merged), from
imports.py --no-tests's edges (edges_notest.json, in ARCH_OUT). Compare with lib.rs's 'Layers'."""
import json, collections, sys
E = json.load(open(sys.argv[1] if len(sys.argv) > 1 else 'edges_notest.json'))
adj = collections.defaultdict(set); nodes = set()
for k in E:
    a, b = k.split('->'); adj[a].add(b); nodes |= {a, b}
# merge SCCs
def reach(a):
    seen, st = set(), [a]
    while st:
        v = st.pop()
        for w in adj[v]:
            if w not in seen: seen.add(w); st.append(w)
    return seen
R = {v: reach(v) for v in nodes}
comp = {v: frozenset([v] + [w for w in nodes if w in R[v] and v in R[w]]) for v in nodes}
memo = {}
def level(c):
    if c in memo: return memo[c]
    memo[c] = 0
    below = {comp[w] for v in c for w in adj[v]} - {c}
    memo[c] = 1 + max((level(b) for b in below), default=-1)
    return memo[c]
by = collections.defaultdict(list)
for c in set(comp.values()): by[level(c)].append('+'.join(sorted(c)))
for l in sorted(by): print(f'layer {l}: ' + ', '.join(sorted(by[l])))
