#!/usr/bin/env python3
"""Fails when a function outside tests is longer than MAX_FN_LINES lines, or a
file is longer than MAX_FILE_LINES lines before its tests.

A function's length runs from its `fn` line to the line of its closing brace,
both included; braces are matched over the code with comments, strings and
character literals blanked out. Test code does not count: files named
`tests.rs`, and every item under `#[cfg(test)]` (a file's length is counted
up to its first top-level `#[cfg(test)]`).

Usage: check-bounds.py [--top N] DIR...   (default: controllers/src api/src tests/src)
"""
import pathlib
import re
import sys

MAX_FN_LINES = 120
MAX_FILE_LINES = 1000

FN_RE = re.compile(
    r'^\s*(?:pub(?:\([^)]*\))?\s+)?(?:(?:const|async|unsafe|extern\s+"[^"]*")\s+)*'
    r'fn\s+([A-Za-z_][A-Za-z0-9_]*)'
)
RAW_STRING_RE = re.compile(r'r(#*)"')
CHAR_RE = re.compile(r"'(?:\\u\{[0-9a-fA-F]+\}|\\.|[^\\'])'")


def spaces(text):
    """`text` with everything but newlines turned into spaces."""
    return re.sub(r'[^\n]', ' ', text)


def blank_out(text):
    """The text with comments, strings and char literals blanked (newlines
    kept, so line numbers stay)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        word_before = i > 0 and (text[i - 1].isalnum() or text[i - 1] == '_')
        if text.startswith('//', i):
            j = text.find('\n', i)
            j = n if j < 0 else j
        elif text.startswith('/*', i):
            depth, j = 1, i + 2
            while j < n and depth:
                step = 2 if text.startswith(('/*', '*/'), j) else 1
                depth += {'/*': 1, '*/': -1}.get(text[j:j + 2], 0) if step == 2 else 0
                j += step
        elif c in 'rb' and not word_before and RAW_STRING_RE.match(text, i + (c == 'b')):
            start = i + (c == 'b')
            hashes = RAW_STRING_RE.match(text, start).group(1)
            end = text.find('"' + hashes, start + 2 + len(hashes))
            j = n if end < 0 else end + 1 + len(hashes)
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == '\\' else 1
            j += 1
        elif c == "'" and CHAR_RE.match(text, i):
            # a char literal ('x', '\n', '\u{1F600}'), not a lifetime ('a)
            j = i + len(CHAR_RE.match(text, i).group(0))
        else:
            out.append(c)
            i += 1
            continue
        out.append(spaces(text[i:j]))
        i = j
    return ''.join(out)


def closing_line(lines, start):
    """Index of the line with the brace that closes the block opened at or
    after line `start`; None for a declaration without a body."""
    depth, opened = 0, False
    for k in range(start, len(lines)):
        for ch in lines[k]:
            if ch == '{':
                depth, opened = depth + 1, True
            elif ch == '}':
                depth -= 1
                if opened and depth == 0:
                    return k
            elif ch == ';' and not opened and depth == 0:
                return None
    return None


def measure(path):
    """(functions as (lines, name, line number), lines before the tests)."""
    lines = blank_out(path.read_text()).split('\n')
    before_tests = next(
        (i for i, line in enumerate(lines) if line.startswith('#[cfg(test)]')), len(lines)
    )
    fns, i = [], 0
    while i < len(lines):
        if lines[i].strip().startswith('#[cfg(test)]'):
            # skip the item under the attribute (a test module or function)
            j = i + 1
            while j < len(lines) and (not lines[j].strip() or lines[j].strip().startswith('#[')):
                j += 1
            end = closing_line(lines, j)
            i = (end if end is not None else j) + 1
            continue
        m = FN_RE.match(lines[i])
        if m:
            end = closing_line(lines, i)
            if end is not None:
                fns.append((end - i + 1, m.group(1), i + 1))
        i += 1
    return fns, before_tests


def main(argv):
    top = int(argv[argv.index('--top') + 1]) if '--top' in argv else 5
    roots = [a for k, a in enumerate(argv) if not a.startswith('--') and (k == 0 or argv[k - 1] != '--top')]
    rows, failures = [], []
    for root in roots or ['controllers/src', 'api/src', 'tests/src']:
        for path in sorted(pathlib.Path(root).rglob('*.rs')):
            if path.name == 'tests.rs':
                continue
            fns, before_tests = measure(path)
            if before_tests > MAX_FILE_LINES:
                failures.append(f'{path}: {before_tests} lines before its tests (at most {MAX_FILE_LINES})')
            for length, name, line in fns:
                rows.append((length, f'{path}:{line}', name))
                if length > MAX_FN_LINES:
                    failures.append(f'{path}:{line}: fn {name} is {length} lines (at most {MAX_FN_LINES})')
    rows.sort(reverse=True)
    print('longest functions outside tests:')
    for length, where, name in rows[:top]:
        print(f'{length:5d}  {name}  {where}')
    for failure in failures:
        print(failure)
    return 1 if failures else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
