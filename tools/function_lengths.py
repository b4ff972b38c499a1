#!/usr/bin/env python3
"""Lists the functions of C++ sources longer than a limit (lines from the signature's line to the
closing brace), for the house rules in docs/architecture.md: no function over 80 lines in src/app
or src/job, run_student at most 50. Exit code 1 when any is over.

usage: function_lengths.py [--max N] [--limit NAME=N ...] FILE_OR_DIR ...

The reader is a brace counter, not a parser: it strips comments and string literals, and takes a
`{` that follows `)` (with qualifiers such as const, noexcept, override, -> T between) at
namespace or class depth as a function body. Lambdas and blocks inside a body count toward the
enclosing function."""

import argparse
import pathlib
import re
import sys

SIGNATURE_TAIL = re.compile(r"\)\s*(const|noexcept|override|final|mutable|\s|->\s*[\w:<>,\s*&]+)*$")
NAME = re.compile(r"([~\w:]+)\s*\((?:[^()]|\([^()]*\))*\)\s*(const|noexcept|override|final|\s|->\s*[\w:<>,\s*&]+)*$",
                  re.S)


def strip(text):
    """Comments and string/char literals blanked, newlines kept (so line numbers hold)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif text.startswith('R"', i):
            m = re.match(r'R"([^(]*)\(', text[i:])
            end = text.find(")" + m.group(1) + '"', i) if m else -1
            j = n if end < 0 else end + len(m.group(1)) + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "'" and 0 < i < n - 1 and text[i - 1].isalnum() and text[i + 1].isalnum():
            out.append(c)  # a digit separator: 2'000'000
            i += 1
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(c + " " * (j - i - 1) + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def functions(path):
    """(name, first line, line count) of every function body in the file."""
    text = strip(path.read_text())
    found, stack, i = [], [], 0  # stack: "scope" or ("fn", name, line)
    for i, c in enumerate(text):
        if c == "{":
            in_fn = any(isinstance(s, tuple) for s in stack)
            head = text[max(0, i - 600):i]
            head = head[max(head.rfind(";"), head.rfind("}"), head.rfind("{")) + 1:]
            m = NAME.search(head.rstrip()) if not in_fn else None
            if m and not re.match(r"(if|for|while|switch|catch)$", m.group(1).split("::")[-1]):
                start = text.count("\n", 0, i - len(head) + m.start()) + 1
                stack.append(("fn", m.group(1), start))
            else:
                stack.append("scope")
        elif c == "}" and stack:
            top = stack.pop()
            if isinstance(top, tuple):
                end = text.count("\n", 0, i) + 1
                found.append((top[1], top[2], end - top[2] + 1))
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--max", type=int, default=80, help="the most lines a function may have (default 80)")
    ap.add_argument("--limit", action="append", default=[], metavar="NAME=N",
                    help="a tighter limit for the functions named NAME (the last part of a qualified name)")
    ap.add_argument("paths", nargs="+")
    args = ap.parse_args()
    limits = {k: int(v) for k, v in (s.split("=", 1) for s in args.limit)}
    files = []
    for p in map(pathlib.Path, args.paths):
        files += sorted(q for q in p.rglob("*") if q.suffix in (".cpp", ".hpp")) if p.is_dir() else [p]
    over, seen = [], set()
    for f in files:
        for name, line, count in functions(f):
            short = name.split("::")[-1]
            seen.add(short)
            limit = limits.get(short, args.max)
            if count > limit:
                over.append(f"{f}:{line}: {name} is {count} lines (limit {limit})")
    for name in limits:
        if name not in seen:
            over.append(f"--limit {name}: no function of that name in {' '.join(args.paths)}")
    print("\n".join(over) if over else f"{len(files)} file(s): every function within its limit")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
