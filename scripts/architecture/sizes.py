#!/usr/bin/env python3
"""Files over 600 lines and functions over 120 lines, outside tests.
Files: every .rs under crates/*/src (and examples/, fuzz/ reported apart); 'code' = lines not in a
#[cfg(test)] item. Functions: `fn name ... {` brace-matched on comment/string-stripped text, not in
a #[cfg(test)] item, length = lines from the `fn` line to its closing brace (doc comments excluded).
Usage: python3 sizes.py [WORKSPACE] [FILE_LIMIT] [FN_LIMIT]"""
import os, re, sys
sys.path.insert(0, os.path.dirname(__file__))
from rustlex import *
WS = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), '../..')
FL = int(sys.argv[2]) if len(sys.argv) > 2 else 600
FNL = int(sys.argv[3]) if len(sys.argv) > 3 else 120
files, fns = [], []
for base in ('crates', 'fuzz'):
    for dp, dn, fn in os.walk(os.path.join(WS, base)):
        if '/target' in dp: continue
        for f in fn:
            if not f.endswith('.rs'): continue
            p = os.path.join(dp, f); rel = os.path.relpath(p, WS)
            if '/tests/' in rel or rel.endswith('_tests.rs'): continue
            raw = open(p).read(); s = strip(raw); regs = test_regions(s)
            total = raw.count('\n')
            testl = sum(s.count('\n', a, b) + 1 for a, b in regs)
            files.append((total - testl, total, rel))
            for m in re.finditer(r'\bfn\s+(\w+)', s):
                if in_regions(m.start(), regs): continue
                # find body start: first '{' or ';' after the signature at paren depth 0
                j = m.end(); d = 0
                while j < len(s):
                    c = s[j]
                    if c in '([<': d += 1
                    elif c in ')]>' and d > 0:
                        if not (c == '>' and s[j-1] == '-'): d -= 1
                    elif c == ';' and d == 0: j = -1; break
                    elif c == '{' and d == 0: break
                    j += 1
                if j < 0 or j >= len(s): continue
                e = match_brace(s, j)
                n = line_of(s, e) - line_of(s, m.start()) + 1
                if n > FNL:
                    # enclosing impl type, for names like Rig::bandwidth
                    before = s[:m.start()]
                    owner = ''
                    for im in re.finditer(r'\bimpl\b(?:\s*<[^{]*?>)?\s+(?:[\w:<>, ]+\s+for\s+)?([\w:]+)[^{;]*\{', before):
                        if match_brace(s, im.end() - 1) > m.start(): owner = im.group(1).split('::')[-1] + '::'
                    fns.append((n, f'{owner}{m.group(1)}', f'{rel}:{line_of(s, m.start())}'))
print(f'## files over {FL} lines (code = without #[cfg(test)] items)')
print('| code | total | file |'); print('|---:|---:|---|')
for c, t, r in sorted(files, reverse=True):
    if c > FL or t > FL: print(f'| {c} | {t} | {r} |')
print(f'\n## functions over {FNL} lines, outside tests')
print('| lines | fn | where |'); print('|---:|---|---|')
for n, name, w in sorted(fns, reverse=True): print(f'| {n} | {name} | {w} |')
