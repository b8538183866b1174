#!/usr/bin/env python3
"""Symbolizes the samples of scripts/host_sampler.cpp (scripts/host_profile.sh runs both) and
prints where the sampled thread's time went: by library (the innermost frame's), by function
(innermost frame: self time) and inclusive (a function anywhere on the stack), as shares of the
samples; with --callers, who called the functions that match.

    python3 scripts/host_profile.py BASE [--within TEXT] [--top N] [--callers TEXT]...

BASE.samples (one line of hexadecimal return addresses a sample, innermost first, the sampler's
own two frames first) and BASE.maps (the process's /proc/self/maps). --within: only samples with
a function whose name holds TEXT (the steady loop, say). Functions are named by addr2line from
the symbol tables; a stripped library's are named after it ("libcuda.so.1!?"). Needs readelf and
addr2line (binutils)."""
import argparse
import bisect
import collections
import os
import subprocess
import sys


def load_maps(path):
    maps = []
    for line in open(path):
        p = line.split()
        if len(p) < 6 or 'x' not in p[1]:
            continue
        start, end = (int(x, 16) for x in p[0].split('-'))
        maps.append((start, end, int(p[2], 16), p[5]))
    maps.sort()
    return maps


def load_segments(path, cache):
    """(file offset, virtual address, size) of each PT_LOAD segment of an ELF file."""
    if path not in cache:
        segments = []
        try:
            out = subprocess.run(['readelf', '-lW', path], capture_output=True, text=True).stdout
            for line in out.splitlines():
                f = line.split()
                if f and f[0] == 'LOAD':
                    segments.append((int(f[1], 16), int(f[2], 16), int(f[4], 16)))
        except OSError:
            pass
        cache[path] = segments
    return cache[path]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    ap.add_argument('base')
    ap.add_argument('--within')
    ap.add_argument('--top', type=int, default=40)
    ap.add_argument('--callers', action='append', default=[])
    args = ap.parse_args()
    for suffix in ('.samples', '.maps'):
        if not os.path.exists(args.base + suffix):
            sys.exit('host_profile.py: %s%s does not exist (was the program run with '
                     'scripts/host_profile.sh, and did it exit normally?)' % (args.base, suffix))
    maps = load_maps(args.base + '.maps')
    starts = [m[0] for m in maps]
    segments = {}
    stacks = []
    wanted = collections.defaultdict(set)
    for line in open(args.base + '.samples'):
        frames = []
        for k, address in enumerate(int(x, 16) for x in line.split()[2:]):
            if k > 0:
                address -= 1  # a return address: the call is the byte before
            i = bisect.bisect_right(starts, address) - 1
            if i < 0 or not maps[i][0] <= address < maps[i][1]:
                frames.append(('?', address))
                continue
            path, offset = maps[i][3], address - maps[i][0] + maps[i][2]
            for file_offset, vaddr, size in load_segments(path, segments):
                if file_offset <= offset < file_offset + size:
                    offset = offset - file_offset + vaddr
                    break
            frames.append((path, offset))
            wanted[path].add(offset)
        stacks.append(frames)
    if not stacks:
        sys.exit('host_profile.py: no samples were taken (the program ran shorter than one '
                 'interval, or its main thread exited before the sampler wrote them)')
    names = {}
    for path, offsets in wanted.items():
        offsets = sorted(offsets)
        lines = []
        if os.path.exists(path):
            lines = subprocess.run(['addr2line', '-f', '-C', '-e', path],
                                   input='\n'.join('%x' % o for o in offsets),
                                   capture_output=True, text=True).stdout.splitlines()
        for i, o in enumerate(offsets):
            name = lines[2 * i] if 2 * i < len(lines) else '??'
            names[(path, o)] = name if name != '??' else os.path.basename(path) + '!?'
    named = []
    for frames in stacks:
        syms = [names.get(f, '?') for f in frames]
        if args.within and not any(args.within in s for s in syms):
            continue
        named.append((frames, syms))
    n = len(named)
    print('%d samples%s (of %d)' % (n, ' within %r' % args.within if args.within else '',
                                    len(stacks)))
    if n == 0:
        return

    def table(title, counter, top):
        print('\n== ' + title)
        for name, c in counter.most_common(top):
            print('%6.1f%%  %s' % (100.0 * c / n, name[:160]))

    table('self time by library', collections.Counter(
        os.path.basename(f[0][0]) if f else '?' for f, _ in named), 12)
    table('self time by function', collections.Counter(s[0] for _, s in named if s), args.top)
    inclusive = collections.Counter()
    for _, syms in named:
        inclusive.update(set(syms))
    table('inclusive time by function', inclusive, args.top)
    for text in args.callers:
        callers = collections.Counter()
        for _, syms in named:
            for k, s in enumerate(syms):
                if text in s:
                    outer = next((t for t in syms[k + 1:] if text not in t), '(the stack\'s end)')
                    callers[outer] += 1
                    break
        table('callers of %r (share of all samples)' % text, callers, args.top)


if __name__ == '__main__':
    main()
