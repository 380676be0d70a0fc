#!/usr/bin/env python3
"""Fails when the files of a crate import each other in a circle.

An edge A -> B is any path in A's code outside its tests (`use` lines and
paths written inline) that names B's module: `crate::x::y` (the longest prefix
that is a module file), `super::...` and `self::...` resolved the same way,
and a child module named from its parent (`plan::Step` in the parent's file).
A name a module only re-exports (`pub use child::Item;`) leads to the module
that defines it. `mod x;` declarations are not edges.
Usage: check-imports.py [--print] CRATE_SRC...   (default: controllers/src api/src tests/src)"""
import pathlib
import re
import sys

PATH_RE = re.compile(r'\b((?:crate|super|self)(?:::[A-Za-z_][A-Za-z0-9_]*)+|(?:crate|super|self)::\{[^;]*?\})')


def module_files(src):
    """Module path (tuple) -> file, for every .rs file under src."""
    mods = {}
    for p in src.rglob('*.rs'):
        rel = p.relative_to(src)
        if 'bin' in rel.parts:
            continue
        parts = list(rel.with_suffix('').parts)
        if parts[-1] in ('lib', 'main', 'mod'):
            parts = parts[:-1]
        if parts and parts[-1] == 'tests':
            continue
        mods[tuple(parts)] = p
    return mods


def code_outside_tests(text):
    """The file up to its test module, without comment lines."""
    lines = text.split('\n')
    out = []
    for line in lines:
        if line.startswith('#[cfg(test)]'):
            break
        if line.lstrip().startswith('//'):
            continue
        out.append(line)
    return '\n'.join(out)


def expand(path):
    """`crate::a::{b, c::d}` -> [crate::a::b, crate::a::c::d] (one level of braces)."""
    if '{' not in path:
        return [path]
    head, _, rest = path.partition('::{')
    inner = rest.rsplit('}', 1)[0]
    parts, depth, cur = [], 0, ''
    for ch in inner:
        if ch == ',' and depth == 0:
            parts.append(cur)
            cur = ''
            continue
        depth += ch == '{'
        depth -= ch == '}'
        cur += ch
    parts.append(cur)
    out = []
    for part in parts:
        part = re.sub(r'\s+', '', part).split(' as ')[0]
        if part:
            out.extend(expand(head + '::' + part))
    return out


REEXPORT_RE = re.compile(r'^pub use ([^;]+);', re.M)


def reexports_of(mod, text):
    """Names a module re-exports (`pub use path::{A, B as C};`) -> the full path each names."""
    out = {}
    for m in REEXPORT_RE.finditer(text):
        for path in expand(re.sub(r'\s+', ' ', m.group(1)).replace(' ', '')):
            if '::' not in path or path.endswith('::*'):
                continue
            name = path.rsplit('::', 1)[1]
            if '::' not in path.split('::', 1)[0] and not path.startswith(('crate', 'super', 'self')):
                path = 'self::' + path
            out[name] = path
    return out


def resolve(mod, path, mods, reexports, depth=0):
    """The module file a path names (following re-exports), or None."""
    segs = path.split('::')
    if segs[0] == 'crate':
        base, rest = [], segs[1:]
    else:
        base = list(mod)
        while segs and segs[0] in ('self', 'super'):
            if segs[0] == 'super':
                base = base[:-1]
            segs = segs[1:]
        rest = segs
    target = tuple(base)
    for seg in rest:
        if target + (seg,) in mods:
            target = target + (seg,)
            continue
        again = reexports.get(target, {}).get(seg)
        if again and depth < 8:
            return resolve(target, again, mods, reexports, depth + 1) or target
        break
    return target if target in mods else None


def edges_of(mod, text, mods, reexports):
    found = set()
    children = {m[-1] for m in mods if len(m) == len(mod) + 1 and m[:-1] == mod}
    paths = [p for m in PATH_RE.finditer(text) for p in expand(m.group(1))]
    # a child module named from its parent: `plan::Step`, `use plan::{...}`
    for child in children:
        if re.search(r'(?<![A-Za-z0-9_:])' + re.escape(child) + r'::', text):
            paths.append('self::' + child)
    for path in paths:
        target = resolve(mod, path, mods, reexports)
        if target is not None and target != mod:
            found.add(target)
    return found


def cycles(graph):
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)

    sys.setrecursionlimit(10000)
    for v in graph:
        if v not in index:
            visit(v)
    return out


def main(roots):
    bad = 0
    for root in roots:
        src = pathlib.Path(root)
        mods = module_files(src)
        code = {m: code_outside_tests(p.read_text()) for m, p in mods.items()}
        reexports = {m: reexports_of(m, c) for m, c in code.items()}
        graph = {m: edges_of(m, c, mods, reexports) for m, c in code.items()}
        if '--print' in sys.argv:
            for m in sorted(graph):
                for t in sorted(graph[m]):
                    print(f"{root}: {'::'.join(m) or 'crate'} -> {'::'.join(t) or 'crate'}")
        for comp in cycles(graph):
            bad = 1
            names = sorted(str(mods[m]) for m in comp)
            print(f'import circle: {" <-> ".join(names)}')
            for m in sorted(comp):
                for t in sorted(graph[m] & set(comp)):
                    print(f"    {mods[m]} -> {mods[t]}")
    return bad


if __name__ == '__main__':
    sys.exit(main([a for a in sys.argv[1:] if not a.startswith('--')] or ['controllers/src', 'api/src', 'tests/src']))
