#!/usr/bin/env python3
"""Checks that the library's source files and functions stay small enough to read.

Every file of the rooms (base/ to dist/, scripts/check_rooms.py) has at most MAX_FILE_LINES
lines, and every function defined at the start of a line (the library's style: free functions and
out-of-class members, their body closed by a "}" alone on a line) at most MAX_FUNCTION_LINES, from
its first line to its closing brace. The functions in STILL_LONG are over the limit and are to be
split; each may not grow past the length it has now, and one no longer long must leave the
list, so the list only shrinks. Runs in CI as a test.

    python3 scripts/check_sizes.py [ROOT]     exit 0: all within; 1: each offender printed
    python3 scripts/check_sizes.py --self-test   the check on a made-up tree: finds what it must
"""
import pathlib
import re
import sys

from check_rooms import DIRS, ROOMS, SUFFIXES, made_up_tree, rooms_root  # the rooms, and where they are
MAX_FILE_LINES = 700
MAX_FUNCTION_LINES = 120
# (file, function): its length now, the most it may have until it is split.
STILL_LONG = {
}
# A line at the start of which no function begins.
NOT_A_FUNCTION = re.compile(
    r"^(namespace|struct|class|enum|union|template|extern|#|//|}|using|typedef|static_assert)")
NAME = re.compile(r"([\w:~]+)\s*\(")


def functions(text: str):
    """(name, first line, length) of every function defined at the start of a line."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if (line and not line[0].isspace() and not NOT_A_FUNCTION.match(line) and "(" in line
                and not line.rstrip().endswith(";")):
            j = i  # the signature may go on over several lines, up to its "{"
            while j < len(lines) and not lines[j].rstrip().endswith(("{", ";")):
                j += 1
            if j < len(lines) and lines[j].rstrip().endswith("{"):
                k = j + 1
                while k < len(lines) and lines[k] != "}":
                    k += 1
                name = NAME.search(line)
                yield (name.group(1) if name else line.strip()[:40]), i + 1, k - i + 1
                i = k + 1
                continue
        i += 1


def offenders(root: pathlib.Path, still_long=None):
    still_long = STILL_LONG if still_long is None else still_long
    seen_long = set()
    for room in ROOMS:
        for path in sorted((root / DIRS[room]).rglob("*")):
            if path.suffix not in SUFFIXES:
                continue
            rel = path.relative_to(root).as_posix()
            text = path.read_text(errors="replace")
            n = len(text.splitlines())
            if n > MAX_FILE_LINES:
                yield f"{rel}: {n} lines; at most {MAX_FILE_LINES}: split it by concern"
            for name, line, length in functions(text):
                if (rel, name) in still_long and length > MAX_FUNCTION_LINES:
                    seen_long.add((rel, name))
                limit = still_long.get((rel, name), MAX_FUNCTION_LINES)
                if length > limit:
                    what = ("grew past its listed length" if (rel, name) in still_long
                            else f"at most {MAX_FUNCTION_LINES}")
                    yield f"{rel}:{line}: {name} is {length} lines; {what}: split it"
    for rel, name in sorted(set(still_long) - seen_long):
        yield f"{rel}: {name} is listed as still long but is not over {MAX_FUNCTION_LINES} lines " \
              "(or is gone): take it off the list"


def self_test() -> int:
    """A tree with a long file, a long function, a listed one that grew and one that did not."""
    body = lambda n: "void f() {\n" + "  x();\n" * (n - 2) + "}\n"
    files = {
        "base/short.cpp": body(120),
        "kernels/long.cpp": "int g(int a,\n      int b) {\n" + "  x();\n" * 119 + "}\n",
        "engine/runtime/big.h": "// a line\n" * (MAX_FILE_LINES + 1),
        "capture/listed.cpp": body(130),
        "dist/grew.cpp": body(131),
        "dist/split.cpp": body(40),
    }
    listed = {("capture/listed.cpp", "f"): 130, ("dist/grew.cpp", "f"): 130,
              ("dist/split.cpp", "f"): 200}
    with made_up_tree(files) as root:
        found = sorted(o.split(":")[0] for o in offenders(root, listed))
    expected = sorted(["kernels/long.cpp", "engine/runtime/big.h", "dist/grew.cpp", "dist/split.cpp"])
    if found != expected:
        print(f"check_sizes self-test: found {found}; expected {expected}")
        return 1
    print("check_sizes self-test: the long file, the long function and the listed one that grew "
          "were named, and the listed one split, nothing else")
    return 0


def main() -> int:
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    root = rooms_root("check_sizes")
    if root is None:
        return 2
    bad = list(offenders(root))
    for b in bad:
        print(b)
    if bad:
        print(f"check_sizes: {len(bad)} file(s) or function(s) too long")
        return 1
    print(f"check_sizes: every file within {MAX_FILE_LINES} lines, every function within "
          f"{MAX_FUNCTION_LINES} (but {len(STILL_LONG)} listed to be split, none grown)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
