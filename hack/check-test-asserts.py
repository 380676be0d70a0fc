#!/usr/bin/env python3
"""Fails when a test asserts only inside a condition that may be false.

The pattern it catches: an `if` (or `if let`) branch that does nothing but
assert (its statements are `let`s, assertions and prints), in a chain that
lets the test pass without any assertion when the condition is false: no
final `else`, or an `else` that neither asserts nor fails. For example

    if replaced { assert_ne!(old_id, new_id); }         // replaced may be false
    if let Err(r) = got { assert!(r.message.contains("x")); }

Not flagged: a branch that acts (the assertion checks what that branch did),
a guard that returns (a skipped test), if/else chains whose every branch
asserts or fails, and loops (a polling loop asserts its deadline).

Scope: the integration suites (tests/tests/*.rs) and the unit tests of every
crate (`#[cfg(test)]` modules and files named tests.rs).

Usage: check-test-asserts.py [ROOT]   (the repository root; default .)
"""
import importlib.util
import pathlib
import re
import sys

HERE = pathlib.Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location('check_bounds', HERE / 'check-bounds.py')
check_bounds = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check_bounds)

ASSERTION = re.compile(r'\b(?:assert|assert_eq|assert_ne|assert_matches|debug_assert|ensure)!')
FAILS = re.compile(r'\b(?:assert|assert_eq|assert_ne|assert_matches|ensure|panic|unreachable|bail)!|\breturn\s+Err\b')
QUIET = re.compile(r'^(?:let\b|(?:assert|assert_eq|assert_ne|assert_matches|debug_assert|ensure|println|eprintln|print|eprint|dbg)!)')
GUARD = re.compile(r'^(?:return|continue|break)\b')


def test_regions(path, lines):
    """Line ranges [start, end) of test code in one file."""
    if path.name == 'tests.rs' or 'tests' in path.parts[-3:-1]:
        return [(0, len(lines))]
    regions, i = [], 0
    while i < len(lines):
        if lines[i].strip().startswith('#[cfg(test)]'):
            j = i + 1
            while j < len(lines) and (not lines[j].strip() or lines[j].strip().startswith('#[')):
                j += 1
            end = check_bounds.closing_line(lines, j)
            end = len(lines) - 1 if end is None else end
            regions.append((j, end + 1))
            i = end + 1
        else:
            i += 1
    return regions


def block_after(lines, line):
    """(open line, close line) of the block whose `{` ends the header starting
    at `line` (the last `{` of the header's last line opens it)."""
    k = line
    while k < len(lines) and not lines[k].rstrip().endswith('{'):
        k += 1
    if k >= len(lines):
        return None
    depth = 0
    for j in range(k + 1, len(lines)):
        for ch in lines[j]:
            if ch == '{':
                depth += 1
            elif ch == '}':
                if depth == 0:
                    return (k, j)
                depth -= 1
    return None


def statements(lines, open_line, close_line):
    """First lines (stripped) of the statements directly in a block."""
    out, depth, starting = [], 0, True
    for k in range(open_line + 1, close_line):
        text = lines[k].strip()
        if not text:
            continue
        if depth == 0 and starting:
            out.append(text)
        depth += text.count('{') + text.count('(') + text.count('[')
        depth -= text.count('}') + text.count(')') + text.count(']')
        starting = depth <= 0 and (text.endswith(';') or text.endswith('}') or text.endswith(','))
        depth = max(depth, 0)
    return out


def if_chains(lines, start, end):
    """Each if-chain in [start, end) as a list of branches (open, close, is_else)."""
    chains, k = [], start
    seen = set()
    while k < end:
        text = lines[k].strip()
        if k not in seen and re.match(r'^(?:if|let\s+.*=\s*if)\b', text):
            chain, at, is_else = [], k, False
            while True:
                block = block_after(lines, at)
                if block is None:
                    break
                chain.append((block[0], block[1], is_else))
                closing = lines[block[1]].strip()
                if closing.startswith('} else if'):
                    seen.add(block[1])
                    at, is_else = block[1], False
                elif closing.startswith('} else'):
                    at, is_else = block[1], True
                else:
                    break
            if chain:
                chains.append((k, chain))
        k += 1
    return chains


def findings(path):
    lines = check_bounds.blank_out(path.read_text()).split('\n')
    raw = path.read_text().split('\n')
    out = []
    for start, end in test_regions(path, lines):
        for first, chain in if_chains(lines, start, end):
            branches = []
            for open_line, close_line, is_else in chain:
                body = '\n'.join(lines[open_line + 1:close_line])
                stmts = statements(lines, open_line, close_line)
                branches.append({
                    'asserts': bool(ASSERTION.search(body)),
                    'fails': bool(FAILS.search(body)),
                    'quiet': all(QUIET.match(s) for s in stmts),
                    'guard': any(GUARD.match(s) for s in stmts),
                    'is_else': is_else,
                })
            covered = branches[-1]['is_else'] and all(b['fails'] for b in branches)
            for b in branches:
                if b['asserts'] and b['quiet'] and not b['guard'] and not covered:
                    out.append(f'{path}:{first + 1}: asserts only when `{raw[first].strip()[:70]}` holds')
                    break
    return out


def main(argv):
    root = pathlib.Path(argv[0] if argv else '.')
    files = sorted(root.glob('tests/tests/*.rs'))
    for crate in ('controllers/src', 'api/src', 'tests/src'):
        files += sorted((root / crate).rglob('*.rs'))
    problems = [f for p in files for f in findings(p)]
    for p in problems:
        print(p)
    if problems:
        print('make each assertion unconditional (assert the condition too), or delete it')
    return 1 if problems else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
