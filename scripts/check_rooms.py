#!/usr/bin/env python3
"""Checks that every #include between the library's rooms points down the data flow, and that
every include of a graphward header anywhere in the tree names it under graphward/.

The rooms, lowest first (docs/DESIGN.md): base/ <- kernels/ <- engine/runtime/ <- engine/tape/ <-
engine/ops/ <- engine/backward/ <- capture/ <- dist/. A file of a room may include its own room's
headers and those of the rooms below it, never above. The build refuses the same (each room
compiles with only the rooms below it on its include path); this check names every offending line
at once, and runs in CI as a test. Every graphward header is included by its path from the
repository's root under graphward/ ("graphward/engine/ops/ops.h"); an include without the prefix
("engine/ops/ops.h", "ops/ops.h", "base/error.h") is one a consumer's own file of that name could
stand in for, and is named too, wherever it is (library, tests, benchmarks, examples).

    python3 scripts/check_rooms.py [ROOT]     exit 0: all down; 1: each bad include printed
    python3 scripts/check_rooms.py --self-test   the check on a made-up tree: finds what it must
"""
import contextlib
import pathlib
import re
import sys
import tempfile

ROOMS = ["base", "kernels", "runtime", "tape", "ops", "backward", "capture", "dist"]
DIRS = {r: (f"engine/{r}" if r in ("runtime", "tape", "ops", "backward") else r) for r in ROOMS}
SUFFIXES = {".h", ".cuh", ".cpp", ".cu"}
INCLUDE = re.compile(r'^\s*#\s*include\s+["<]graphward/(?:engine/)?([a-z_]+)/[^">]+[">]')
# An include of a graphward header without the graphward/ prefix.
UNPREFIXED = re.compile(
    r'^\s*#\s*include\s+"((?:engine/)?(?:' + "|".join(ROOMS) + r')/[^"]+|graphward(?:_dist)?\.h)"')
SKIP = {".git", ".deps", "build"}


def wrong_way(root: pathlib.Path):
    for room in ROOMS:
        level = ROOMS.index(room)
        for path in sorted((root / DIRS[room]).rglob("*")):
            if path.suffix not in SUFFIXES:
                continue
            for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                m = INCLUDE.match(line)
                if m and m.group(1) in ROOMS and ROOMS.index(m.group(1)) > level:
                    yield (f"{path.relative_to(root)}:{n}: {DIRS[room]}/ includes "
                           f"{DIRS[m.group(1)]}/, a room above it: {line.strip()}")


def prefixed(target: str) -> str:
    """The name a graphward header is included by: "ops/ops.h" -> "graphward/engine/ops/ops.h"."""
    first = target.split("/")[0]
    if first in DIRS and not target.startswith("engine/"):
        target = DIRS[first] + target[len(first):]
    return "graphward/" + target


def unprefixed(root: pathlib.Path):
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if path.suffix not in SUFFIXES or SKIP & set(rel.parts) or rel.parts[0].startswith("build"):
            continue
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            m = UNPREFIXED.match(line)
            # "ops/..." beside a file of tests/ or examples/ may be that folder's own; a graphward
            # header is one that exists at the root under its prefixed name.
            if m and (root / prefixed(m.group(1))[len("graphward/"):]).exists():
                yield (f"{rel}:{n}: includes a graphward header without graphward/: "
                       f"{line.strip()} (expected \"{prefixed(m.group(1))}\")")


@contextlib.contextmanager
def made_up_tree(files: dict):
    """A temporary tree of `files` ({relative path: text}) for a check's self-test: its root."""
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        for name, text in files.items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text(text)
        yield root


def self_test() -> int:
    """A tree with one include of each kind: the check must name the two upward ones and the two
    unprefixed ones, only them."""
    files = {
        "base/a.h": '#include <string>\n',
        "kernels/k.h": '#include "graphward/base/a.h"\n#include "graphward/kernels/k2.h"\n',
        "kernels/k2.h": '#include "graphward/engine/runtime/e.h"  // up\n',
        "engine/runtime/e.h": '#include "graphward/kernels/k.h"\n#include <graphward/base/a.h>\n',
        "capture/c.cpp": '#include "graphward/engine/runtime/e.h"\n  #  include "graphward/dist/d.h"\n',
        "dist/d.h": '#include "graphward/capture/c.h"\n#include "tests/t.h"\n',
        "tests/t.cpp": '#include "base/a.h"\n#include "ops/local.h"\n#include "graphward/base/a.h"\n',
        "tests/ops/local.h": "\n",
        "examples/x.cpp": '#include "runtime/e.h"\n',
    }
    with made_up_tree(files) as root:
        found = [line.split(":")[0] + ":" + line.split(":")[1]
                 for line in list(wrong_way(root)) + list(unprefixed(root))]
    expected = ["kernels/k2.h:1", "capture/c.cpp:2", "tests/t.cpp:1", "examples/x.cpp:1"]
    if sorted(found) != sorted(expected):
        print(f"check_rooms self-test: found {found}; expected {expected}")
        return 1
    print("check_rooms self-test: the two upward includes and the two without graphward/ were "
          "named, nothing else")
    return 0


def rooms_root(tool: str):
    """The tree to check (the first argument, else the repository): None, said why, if a room is
    missing there."""
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parent.parent)
    missing = [DIRS[r] for r in ROOMS if not (root / DIRS[r]).is_dir()]
    if missing:
        print(f"{tool}: no {', '.join(missing)} under {root}; expected the library's rooms "
              f"{' <- '.join(DIRS[r] for r in ROOMS)}")
        return None
    return root


def main() -> int:
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    root = rooms_root("check_rooms")
    if root is None:
        return 2
    bad = list(wrong_way(root))
    loose = list(unprefixed(root))
    for b in bad + loose:
        print(b)
    order = " <- ".join(f"{DIRS[r]}/" for r in ROOMS)
    if bad:
        print(f"check_rooms: {len(bad)} include(s) the wrong way; the rooms are {order}: move the "
              "code down, or what it needs down")
    if loose:
        print(f"check_rooms: {len(loose)} include(s) of a graphward header without graphward/")
    if bad or loose:
        return 1
    print(f"check_rooms: every include between {order} points down, and every one names "
          "graphward/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
