"""Shared helpers: strip comments/strings from Rust source keeping line structure,
find test regions (#[cfg(test)] items), inline mod stack per offset."""
import re, os

def strip(src):
    """Replace comments and string/char literal contents with spaces (newlines kept)."""
    out = []; i = 0; n = len(src)
    while i < n:
        c = src[i]
        if src.startswith('//', i):
            j = src.find('\n', i);  j = n if j < 0 else j
            out.append(' ' * (j - i)); i = j; continue
        if src.startswith('/*', i):
            depth = 0; j = i
            while j < n:
                if src.startswith('/*', j): depth += 1; j += 2; continue
                if src.startswith('*/', j):
                    depth -= 1; j += 2
                    if depth == 0: break
                    continue
                j += 1
            out.append(''.join(ch if ch == '\n' else ' ' for ch in src[i:j])); i = j; continue
        m = re.match(r'(b|c)?r(#*)"', src[i:i+10])
        if m and (i == 0 or not (src[i-1].isalnum() or src[i-1] == '_')):
            hashes = m.group(2); start = i + len(m.group(0))
            end = src.find('"' + hashes, start); end = n if end < 0 else end + 1 + len(hashes)
            out.append('"' + ''.join(ch if ch == '\n' else ' ' for ch in src[i+1:end-1]) + '"'); i = end; continue
        if c == '"':
            j = i + 1
            while j < n and src[j] != '"':
                j += 2 if src[j] == '\\' else 1
            out.append('"' + ''.join(ch if ch == '\n' else ' ' for ch in src[i+1:j]) + '"'); i = j + 1; continue
        if c == "'":
            m = re.match(r"'(\\.[^']*|[^\\'])'", src[i:i+12])
            if m:
                out.append("'" + ' ' * (len(m.group(0)) - 2) + "'"); i += len(m.group(0)); continue
        out.append(c); i += 1
    return ''.join(out)

def match_brace(s, i):
    """s[i] == '{'; return index of matching '}'."""
    d = 0
    for j in range(i, len(s)):
        if s[j] == '{': d += 1
        elif s[j] == '}':
            d -= 1
            if d == 0: return j
    return len(s) - 1

def test_regions(s):
    """Return list of (start,end) offsets covered by #[cfg(test)]-gated items."""
    regs = []
    for m in re.finditer(r'#\[cfg\(([^\]]*)\)\]', s):
        cond = m.group(1)
        if not re.search(r'(^|[(,\s])test([),\s]|$)', cond) or 'not(test' in cond: continue
        j = m.end()
        # next '{' or ';' at depth 0 decides
        k = j
        while k < len(s) and s[k] not in '{;': k += 1
        if k < len(s) and s[k] == '{':
            regs.append((m.start(), match_brace(s, k)))
        else:
            regs.append((m.start(), k))
    return regs

def in_regions(off, regs):
    return any(a <= off <= b for a, b in regs)

def line_of(s, off):
    return s.count('\n', 0, off) + 1

def inline_mods(s):
    """list of (name, open, close) for inline `mod name {` blocks."""
    res = []
    for m in re.finditer(r'\bmod\s+(\w+)\s*\{', s):
        o = m.end() - 1
        res.append((m.group(1), o, match_brace(s, o)))
    return res

def file_modpath(root, path):
    rel = os.path.relpath(path, root)[:-3].split(os.sep)
    if rel[-1] in ('mod', 'lib', 'main'): rel = rel[:-1]
    return rel

def strongly_connected(nodes, adj):
    """Tarjan's strongly connected components of the graph `adj` (node -> set of nodes)."""
    import sys
    sys.setrecursionlimit(10000)
    idx, low, st, on, sccs, counter = {}, {}, [], set(), [], [0]
    def strong(v):
        idx[v] = low[v] = counter[0]; counter[0] += 1; st.append(v); on.add(v)
        for w in adj[v]:
            if w not in idx: strong(w); low[v] = min(low[v], low[w])
            elif w in on: low[v] = min(low[v], idx[w])
        if low[v] == idx[v]:
            comp = []
            while True:
                w = st.pop(); on.discard(w); comp.append(w)
                if w == v: break
            sccs.append(sorted(comp))
    for v in nodes:
        if v not in idx: strong(v)
    return sccs
