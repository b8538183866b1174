#!/usr/bin/env python3
"""Checks that the library never acts on the whole process: no call that changes the process's
environment (setenv, putenv, unsetenv, clearenv), ends it (exit, _Exit, quick_exit, abort,
std::terminate) or runs a shell (system, popen). A library is linked into someone's training
loop: what it needs from the environment it reads, and it reports errors by throwing.

The library is its rooms (scripts/check_rooms.py) and the public headers at the root. Comments
and string literals are not calls.

    python3 scripts/check_library.py [ROOT]       exit 0: none; 1: each call printed
    python3 scripts/check_library.py --self-test  the check on a made-up tree: finds what it must
"""
import pathlib
import re
import sys

from check_rooms import DIRS, ROOMS, SUFFIXES, made_up_tree, rooms_root

CALLS = ["setenv", "putenv", "unsetenv", "clearenv", "exit", "_Exit", "quick_exit", "abort",
         "terminate", "system", "popen"]
# A call: the name, not part of a longer identifier or a member access, then "(".
CALL = re.compile(r"(?<![\w.>])(?:::)?(?:std::)?(" + "|".join(CALLS) + r")\s*\(")
STRING = re.compile(r'"(?:[^"\\]|\\.)*"')


def code_of(line: str) -> str:
    """The line without its string literals and its // comment."""
    line = STRING.sub('""', line)
    return line.split("//", 1)[0]


def files(root: pathlib.Path):
    for room in ROOMS:
        for path in sorted((root / DIRS[room]).rglob("*")):
            if path.suffix in SUFFIXES:
                yield path
    for path in sorted(root.glob("graphward*.h")):
        yield path


def process_wide_calls(root: pathlib.Path):
    for path in files(root):
        in_block = False
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if in_block:  # inside a /* */ comment
                if "*/" not in line:
                    continue
                line, in_block = line.split("*/", 1)[1], False
            while "/*" in line:
                head, rest = line.split("/*", 1)
                if "*/" in rest:
                    line = head + " " + rest.split("*/", 1)[1]
                else:
                    line, in_block = head, True
            m = CALL.search(code_of(line))
            if m:
                yield f"{path.relative_to(root)}:{n}: calls {m.group(1)}(): {line.strip()}"


def self_test() -> int:
    """A tree with each kind of line: the check must name the calls, and nothing else."""
    files_in = {
        "base/a.h": "inline void f() { ::setenv(\"X\", \"1\", 0); }\n",
        "kernels/k.cu": "// exit(1) in a comment\n  std::exit(2);\n",
        "engine/runtime/r.cpp": 'const char* s = "abort()";\nvoid quick_exit_soon();\n',
        "engine/tape/t.cpp": "/* system(\"ls\")\n   popen() */ int x = obj.exit(3);\n",
        "engine/ops/o.cpp": "void g() { putenv(buf); }\n",
        "engine/backward/b.cpp": "x->abort();  // a member: not the process's\n",
        "capture/c.cpp": "std::terminate();\n",
        "dist/d.cpp": "const char* v = std::getenv(\"NCCL\");\n",
        "graphward.h": "#include <cstdlib>\n",
    }
    with made_up_tree(files_in) as root:
        found = sorted(":".join(line.split(":")[:2]) for line in process_wide_calls(root))
    expected = sorted(["base/a.h:1", "kernels/k.cu:2", "engine/ops/o.cpp:1", "capture/c.cpp:1"])
    if found != expected:
        print(f"check_library self-test: found {found}; expected {expected}")
        return 1
    print("check_library self-test: the four process-wide calls were named, nothing else")
    return 0


def main() -> int:
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    root = rooms_root("check_library")
    if root is None:
        return 2
    bad = list(process_wide_calls(root))
    for b in bad:
        print(b)
    if bad:
        print(f"check_library: {len(bad)} process-wide call(s) in the library: read the "
              "environment instead of writing it, and throw instead of ending the process")
        return 1
    print("check_library: no call in the library changes the environment, ends the process or "
          "runs a shell")
    return 0


if __name__ == "__main__":
    sys.exit(main())
