#!/usr/bin/env python3
"""Checks that every #include between the library's rooms points down the data flow.

The rooms, lowest first (docs/DESIGN.md): base/ <- kernels/ <- runtime/ <- tape/ <- ops/ <-
backward/ <- capture/ <- dist/. A file of a room may include its own room's headers and those of
the rooms below it, never above. The build refuses the same (each room compiles with only the rooms below it on its include path); this
check names every offending line at once, and runs in CI as a test.

    python3 scripts/check_rooms.py [ROOT]     exit 0: all down; 1: each wrong-way include printed
    python3 scripts/check_rooms.py --self-test   the check on a made-up tree: finds what it must
"""
import contextlib
import pathlib
import re
import sys
import tempfile

ROOMS = ["base", "kernels", "runtime", "tape", "ops", "backward", "capture", "dist"]
SUFFIXES = {".h", ".cuh", ".cpp", ".cu"}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([a-z_]+)/[^"]+"')


def wrong_way(root: pathlib.Path):
    for room in ROOMS:
        level = ROOMS.index(room)
        for path in sorted((root / room).rglob("*")):
            if path.suffix not in SUFFIXES:
                continue
            for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                m = INCLUDE.match(line)
                if m and m.group(1) in ROOMS and ROOMS.index(m.group(1)) > level:
                    yield f"{path.relative_to(root)}:{n}: {room}/ includes {m.group(1)}/, a room above it: {line.strip()}"


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
    """A tree with one include of each kind: the check must name the two upward ones, only them."""
    files = {
        "base/a.h": '#include <string>\n',
        "kernels/k.h": '#include "base/a.h"\n#include "kernels/k2.h"\n',
        "kernels/k2.h": '#include "runtime/e.h"  // up\n',
        "runtime/e.h": '#include "kernels/k.h"\n#include "base/a.h"\n',
        "capture/c.cpp": '#include "runtime/e.h"\n  #  include "dist/d.h"\n',
        "dist/d.h": '#include "capture/c.h"\n#include "tests/t.h"\n',
    }
    with made_up_tree(files) as root:
        found = [line.split(":")[0] + ":" + line.split(":")[1] for line in wrong_way(root)]
    expected = ["kernels/k2.h:1", "capture/c.cpp:2"]
    if sorted(found) != sorted(expected):
        print(f"check_rooms self-test: found {found}; expected {expected}")
        return 1
    print("check_rooms self-test: the two upward includes were named, nothing else")
    return 0


def rooms_root(tool: str):
    """The tree to check (the first argument, else the repository): None, said why, if a room is
    missing there."""
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parent.parent)
    missing = [r for r in ROOMS if not (root / r).is_dir()]
    if missing:
        print(f"{tool}: no {', '.join(missing)} under {root}; expected the library's rooms "
              f"{' <- '.join(ROOMS)}")
        return None
    return root


def main() -> int:
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    root = rooms_root("check_rooms")
    if root is None:
        return 2
    bad = list(wrong_way(root))
    for b in bad:
        print(b)
    order = " <- ".join(f"{r}/" for r in ROOMS)
    if bad:
        print(f"check_rooms: {len(bad)} include(s) the wrong way; the rooms are {order}: move the "
              "code down, or what it needs down")
        return 1
    print(f"check_rooms: every include between {order} points down")
    return 0


if __name__ == "__main__":
    sys.exit(main())
