"""Reads the collapsed stacks ``py-spy record --format raw`` wrote (``python -m bench.outbox
--profile DIR``) and prints where each process's samples went: the functions with the most
samples inclusive and exclusive, as a share of the process's samples and, given the
transactions of the window (``--transactions``), in µs per transaction.

    python -m bench.profile DIR/anchored-asyncio-1-256-broker-0.txt [--transactions N] [--top 25]
        [--rate 200] [--match grpc] [--drop-idle]

A sample is one thread's stack at one instant (py-spy skips idle threads unless told
otherwise), so samples ÷ rate is thread-seconds on CPU, close to the CPU time.
"""

from __future__ import annotations

import argparse
import collections
import re
import sys

#: Frames the event loop or a thread waits in: left out with --drop-idle.
IDLE = re.compile(r"\b(epoll_wait|select|poll|_run_once \(asyncio|wait \(threading|fdatasync)\b")


def read(path: str) -> list[tuple[list[str], int]]:
    stacks = []
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if not line:
                continue
            stack, _, count = line.rpartition(" ")
            stacks.append((stack.split(";"), int(count)))
    return stacks


def _short(frame: str) -> str:
    # "name (path/to/module.py:123)" → "name (module.py:123)"
    return re.sub(r"\(([^()]*/)?([^/()]+)\)$", r"(\2)", frame)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+")
    parser.add_argument("--transactions", type=float, default=0.0, help="transactions in the window: µs per each")
    parser.add_argument("--rate", type=float, default=200.0, help="py-spy's samples per second")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--match", default="", help="only frames matching this regular expression")
    parser.add_argument("--drop-idle", action="store_true", help="leave out stacks ending in a wait")
    parser.add_argument("--lines", action="store_true", help="keep line numbers (default: by function)")
    args = parser.parse_args(argv)
    match = re.compile(args.match) if args.match else None
    for path in args.files:
        stacks = read(path)
        if args.drop_idle:
            stacks = [(s, n) for s, n in stacks if not IDLE.search(s[-1])]
        total = sum(n for _s, n in stacks)
        inclusive: collections.Counter[str] = collections.Counter()
        exclusive: collections.Counter[str] = collections.Counter()
        for stack, n in stacks:
            frames = [_short(f) if args.lines else re.sub(r":\d+\)$", ")", _short(f)) for f in stack]
            for frame in set(frames):
                inclusive[frame] += n
            exclusive[frames[-1]] += n
        print(f"\n{path}: {total} samples = {total / args.rate:.2f} thread-seconds"
              + (f" = {total / args.rate / args.transactions * 1e6:,.0f} µs per transaction"
                 if args.transactions else ""))
        for title, counter in (("inclusive", inclusive), ("exclusive", exclusive)):
            print(f"  {title}:")
            shown = 0
            for frame, n in counter.most_common():
                if match and not match.search(frame):
                    continue
                per = f" {n / args.rate / args.transactions * 1e6:8,.0f} µs/txn" if args.transactions else ""
                print(f"   {n / max(total, 1):6.1%}{per}  {frame[:150]}")
                shown += 1
                if shown >= args.top:
                    break
    return 0


if __name__ == "__main__":
    sys.exit(main())
