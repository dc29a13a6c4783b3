#!/usr/bin/env python3
"""Reads a directory of TensorBoard event files with TensorBoard's own reader and prints
its scalars as JSON: {"tag": [[step, value, wall_time], ...], ...}.

    python3 xtask/python/check_tensorboard.py WORKDIR/tensorboard

Exits 3 (and says why on stderr) when the `tensorboard` package is not installed, so that
a test calling it can skip; 2 on a bad argument.
"""

import json
import math
import sys


def main():
    if len(sys.argv) != 2:
        print("usage: check_tensorboard.py DIR", file=sys.stderr)
        return 2
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError as e:
        print(f"the tensorboard package is not installed: {e}", file=sys.stderr)
        return 3
    acc = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0})
    acc.Reload()
    out = {}
    for tag in acc.Tags()["scalars"]:
        out[tag] = [
            [e.step, e.value if math.isfinite(e.value) else None, e.wall_time]
            for e in acc.Scalars(tag)
        ]
    print(json.dumps(out, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
