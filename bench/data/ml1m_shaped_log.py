#!/usr/bin/env python3
"""Writes an event log shaped like MovieLens-1M's ratings.dat, for ingest and
loader benchmarks where the real file is not available.

`user::item::rating::timestamp` lines, 6,040 users, 3,706 items, 1,000,209
events; events per user log-normal (median 96, mean ~166, as in ML-1M),
clipped to [20, 2314]; items Zipf-like; ratings 1..5; each user's events
over a few months of Unix time, in random line order per user.

Usage: bench/data/ml1m_shaped_log.py OUT.dat [--seed 1]
"""
import argparse
import bisect
import math
import random

USERS, ITEMS, EVENTS = 6040, 3706, 1000209
MIN_PER_USER, MAX_PER_USER = 20, 2314


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    raw = [min(MAX_PER_USER, max(MIN_PER_USER, rng.lognormvariate(math.log(96), 1.04)))
           for _ in range(USERS)]
    scale = EVENTS / sum(raw)
    counts = [min(MAX_PER_USER, max(MIN_PER_USER, int(c * scale))) for c in raw]
    # Hand out the rounding remainder one event at a time.
    i = 0
    while sum(counts) < EVENTS:
        if counts[i % USERS] < MAX_PER_USER:
            counts[i % USERS] += 1
        i += 1
    while sum(counts) > EVENTS:
        if counts[i % USERS] > MIN_PER_USER:
            counts[i % USERS] -= 1
        i += 1
    weights = [1.0 / (k + 1) ** 0.9 for k in range(ITEMS)]
    cumulative = []
    total = 0.0
    for w in weights:
        total += w
        cumulative.append(total)
    with open(args.out, "w") as f:
        for u, n in enumerate(counts):
            start = 956703932 + rng.randrange(0, 86400 * 900)
            items = set()
            while len(items) < min(n, ITEMS):
                items.add(bisect.bisect_left(cumulative, rng.random() * total) + 1)
            lines = []
            for item in items:
                t = start + int(rng.expovariate(1.0 / (86400 * 30)))
                lines.append("%d::%d::%d::%d\n" % (u + 1, item, rng.randint(1, 5), t))
            f.writelines(lines)


if __name__ == "__main__":
    main()
