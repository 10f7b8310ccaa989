#!/usr/bin/env python3
"""Summarizes engine_bench's host samples (--host-sample-out FILE).

    host_profile.py FILE BINARY [--steps N] [--top K]

BINARY is the unstripped engine_bench the samples came from (addresses in
it are symbolized with addr2line; other modules are named by their file).
Prints, as milliseconds of the stepping thread's wall time per step: the
time per tag (loop part or phase being issued), the innermost frame's
module and function per tag, and the functions of the binary by inclusive
time (every function on the sampled stack; inlined code counts as its
caller's). Each sample counts for the wall time it stands for (the file's
second column, microseconds), so signals that merged while the thread
waited for a core do not shrink that part.
"""
import argparse
import collections
import os
import subprocess
import sys


def parse(path):
    maps, samples, section = [], [], None
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if line in ("maps", "samples"):
                section = line
                continue
            if section == "maps":
                parts = line.split(None, 5)
                if len(parts) < 6 or not parts[5].startswith("/"):
                    continue
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                maps.append((lo, hi, int(parts[2], 16), parts[5]))
            elif section == "samples" and line:
                parts = line.split()
                samples.append((parts[0], int(parts[1]),
                                [int(a, 16) for a in parts[2:]]))
    return maps, samples


def module_of(addr, maps):
    for lo, hi, off, path in maps:
        if lo <= addr < hi:
            return path, addr - lo + off
    return None, addr


def symbolize(binary, offsets):
    """file offset -> [function name] (the function the address is in)."""
    offsets = sorted(set(offsets))
    out = {}
    for i in range(0, len(offsets), 5000):
        chunk = offsets[i:i + 5000]
        # Return addresses point after the call: look up the byte before.
        proc = subprocess.run(["addr2line", "-f", "-C", "-e", binary] +
                              [hex(max(o - 1, 0)) for o in chunk],
                              capture_output=True, text=True, check=True)
        lines = proc.stdout.splitlines()
        for j, o in enumerate(chunk):
            out[o] = [lines[2 * j] if 2 * j < len(lines) else "??"]
    return out


def short(name, width=110):
    return name if len(name) <= width else name[:width - 3] + "..."


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("binary")
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--top", type=int, default=40)
    a = ap.parse_args()
    maps, samples = parse(a.file)
    exe = os.path.basename(a.binary)
    per = 1e-3 / a.steps  # ms per step per sampled microsecond
    exe_offsets = []
    for _, _, frames in samples:
        for addr in frames:
            path, off = module_of(addr, maps)
            if path and os.path.basename(path) == exe:
                exe_offsets.append(off)
    names = symbolize(a.binary, exe_offsets)

    def frame_names(addr):
        path, off = module_of(addr, maps)
        if path and os.path.basename(path) == exe:
            return names.get(off, ["??"])
        return ["[" + (os.path.basename(path) if path else "?") + "]"]

    by_tag = collections.Counter()
    leaf = collections.defaultdict(collections.Counter)
    first_exe = collections.defaultdict(collections.Counter)
    inclusive = collections.Counter()
    for tag, us, frames in samples:
        by_tag[tag] += us
        if not frames:
            continue
        leaf[tag][frame_names(frames[0])[0]] += us
        seen = set()
        first = None
        for addr in frames:
            for n in frame_names(addr):
                if first is None and not n.startswith("["):
                    first = n
                if n not in seen:
                    seen.add(n)
                    inclusive[n] += us
        first_exe[tag][first or "?"] += us
    total = sum(us for _, us, _ in samples)
    print(f"{len(samples)} samples, {a.steps} steps: "
          f"{total * per:.3f} ms per step sampled")
    print("\n== per tag (ms per step)")
    for tag, n in by_tag.most_common():
        print(f"{n * per:8.3f}  {tag}")
    for tag, _ in by_tag.most_common():
        print(f"\n== {tag}: innermost frame (module or function), ms per step")
        for name, n in leaf[tag].most_common(12):
            print(f"{n * per:8.3f}  {short(name)}")
        print(f"-- {tag}: innermost function of the binary")
        for name, n in first_exe[tag].most_common(12):
            print(f"{n * per:8.3f}  {short(name)}")
    print("\n== innermost function of the binary (all tags), ms per step")
    overall = collections.Counter()
    for c in first_exe.values():
        overall.update(c)
    for name, n in overall.most_common(a.top):
        print(f"{n * per:8.3f}  {short(name)}")
    print("\n== inclusive, ms per step")
    for name, n in inclusive.most_common(a.top):
        print(f"{n * per:8.3f}  {short(name)}")


if __name__ == "__main__":
    sys.exit(main())
