#!/usr/bin/python3
"""The table of scripts/compare_ddp.sh: tutti-train beside PyTorch DDP (tools/ddp_peer.py).

Reads DIR/tutti-R.log and DIR/ddp-R.log for rounds R = 1, 2, ... (the whole output of each run)
and takes the last summary line of each:
  tutti-train: summary step_ms=12.34 samples_per_s=1234 hidden=0.871 overlapped=0.93 test_acc=0.8531 loss=0.5123
  ddp_peer: summary step_ms=12.34 samples_per_s=1234 test_acc=0.8531 loss=0.5123
(anywhere in a line, so a launcher's rank prefix does no harm). Prints per round the step time and
samples/s of each, the accuracy of each and the ratio tutti/ddp of the step times, then the
medians, then one line:
  compare: tutti step X ms, ddp step Y ms, ratio Z (median of R rounds; target <= 0.8), tutti hidden H%, overlapped O%

Usage: compare_ddp.py [--rounds R] DIR   (default: every round with a tutti log in DIR)
"""
import argparse
import math
import os
import re
import statistics
import sys

PROG = "compare_ddp.py"
TARGET = 0.8
SUMMARY = {"tutti": re.compile(r"tutti-train: summary\s+(.*)"),
           "ddp": re.compile(r"ddp_peer: summary\s+(.*)")}
REQUIRED = {"tutti": ("step_ms", "samples_per_s", "hidden"), "ddp": ("step_ms", "samples_per_s")}


class InputError(Exception):
    """A run's output without a usable summary line."""


def parse_summary(path, kind):
    """The fields of the last summary line of KIND ("tutti" or "ddp") in file PATH, as floats."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError as e:
        raise InputError(f"{path}: {e.strerror or e}") from None
    lines = [m.group(1) for m in map(SUMMARY[kind].search, text.splitlines()) if m]
    if not lines:
        raise InputError(f"{path}: no \"{SUMMARY[kind].pattern.split(':')[0]}: summary\" line")
    fields = {}
    for item in lines[-1].split():
        key, sep, value = item.partition("=")
        if not sep:
            continue
        try:
            number = float(value.rstrip("%"))
        except ValueError:
            continue
        if value.endswith("%"):  # hidden=87.1% reads as 0.871
            number /= 100
        if math.isfinite(number):
            fields[key] = number
    missing = [k for k in REQUIRED[kind] if k not in fields]
    if missing:
        raise InputError(f"{path}: the summary line lacks {', '.join(missing)}: {lines[-1].strip()}")
    if fields["step_ms"] <= 0:
        raise InputError(f"{path}: step_ms is not positive: {lines[-1].strip()}")
    return fields


def rounds_in(folder):
    found = []
    for name in os.listdir(folder):
        m = re.fullmatch(r"tutti-(\d+)\.log", name)
        if m:
            found.append(int(m.group(1)))
    return sorted(found)


def fmt(value, spec):
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def table(rows):
    """rows: (label, tutti fields, ddp fields, ratio). Returns the table's lines."""
    head = ("round", "tutti ms", "tutti samples/s", "ddp ms", "ddp samples/s", "tutti acc",
            "ddp acc", "tutti/ddp")
    body = []
    for label, t, d, ratio in rows:
        acc = lambda f: fmt(100 * f["test_acc"], ".2f") + "%" if "test_acc" in f else "-"  # noqa: E731
        body.append((label, fmt(t["step_ms"], ".2f"), fmt(t["samples_per_s"], ".0f"),
                     fmt(d["step_ms"], ".2f"), fmt(d["samples_per_s"], ".0f"), acc(t), acc(d),
                     fmt(ratio, ".3f")))
    widths = [max(len(r[i]) for r in [head] + body) for i in range(len(head))]
    line = lambda r: "  ".join(c.ljust(w) if i == 0 else c.rjust(w)  # noqa: E731
                               for i, (c, w) in enumerate(zip(r, widths)))
    return [line(head), line(["-" * w for w in widths])] + [line(r) for r in body]


def main(argv):
    p = argparse.ArgumentParser(prog=PROG, description="tutti-train beside DDP: the table")
    p.add_argument("--rounds", type=int, default=0, help="rounds 1..R (default: all found)")
    p.add_argument("dir", help="folder with tutti-R.log and ddp-R.log")
    args = p.parse_args(argv)
    try:
        rounds = list(range(1, args.rounds + 1)) if args.rounds > 0 else rounds_in(args.dir)
        if not rounds:
            raise InputError(f"{args.dir}: no tutti-R.log files")
        results = []
        for r in rounds:
            t = parse_summary(os.path.join(args.dir, f"tutti-{r}.log"), "tutti")
            d = parse_summary(os.path.join(args.dir, f"ddp-{r}.log"), "ddp")
            results.append((str(r), t, d, t["step_ms"] / d["step_ms"]))
    except (InputError, OSError) as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 1

    def median(side, key):
        values = [row[side][key] for row in results if key in row[side]]
        return statistics.median(values) if values else float("nan")

    med_t = {k: median(1, k) for k in ("step_ms", "samples_per_s", "test_acc", "hidden", "overlapped")}
    med_d = {k: median(2, k) for k in ("step_ms", "samples_per_s", "test_acc")}
    for m in (med_t, med_d):
        if math.isnan(m["test_acc"]):
            del m["test_acc"]
    ratio = statistics.median(row[3] for row in results)
    for line in table(results + [("median", med_t, med_d, ratio)]):
        print(line)
    n = len(results)
    print(f"compare: tutti step {med_t['step_ms']:.2f} ms, ddp step {med_d['step_ms']:.2f} ms, "
          f"ratio {ratio:.3f} (median of {n} round{'s' if n != 1 else ''}; target <= {TARGET:g}), "
          f"tutti hidden {100 * med_t['hidden']:.1f}%, overlapped {100 * med_t['overlapped']:.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
