#!/usr/bin/python3
"""Markdown tables from `tutti-bench --json` files, for README and notes.

    bench_table.py peers FILE.json       per collective and size: Tutti's busbw, each peer's busbw
                                         and Tutti/peer, and t_bound/t when the file has a ceiling
    bench_table.py automatic FILE.json...  (runs with --all-algorithms, alternating passes of one
                                         command) per collective and size: the fastest forced
                                         algorithm by median time, and automatic's median time over
                                         it with the min-max of that ratio pass by pass
    bench_table.py spread PEER FILE.json...   several runs of one command: per size, each
                                         collective's median Tutti/PEER with the min-max over runs
    bench_table.py matrix PEER FILE.json...   several runs of one command: one row per
                                         collective, one column per size, the median PEER time /
                                         Tutti time (above 1: Tutti faster) with the min-max over runs
    bench_table.py matrix-in-place PEER FILE.json...   the same of the in-place forms (allreduce,
                                         allgather, alltoall, reduce against MPI_IN_PLACE)
    bench_table.py matrix-median PEER FILE.json...   the matrix of the median calls (runs with
                                         --per-call): PEER's median call / Tutti's, where a few
                                         slow calls would swing the means

Reads the primary form (out of place; in place for broadcast), except matrix-in-place. Exits 1
with a one-line message on a malformed file.
"""
import json
import statistics
import math
import sys


def human(size):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:g} {unit}"
        size /= 1024
    return str(size)


def primary_rows(doc, in_place=False):
    """The primary form's rows; with in_place, the other form's (no broadcast: it has one form)."""
    for row in doc["results"]:
        if (row["in_place"] == (row["collective"] == "broadcast")) != in_place:
            yield row


def peers_table(doc):
    peers = sorted({name for row in doc["results"] for name in (row.get("peers") or {})})
    head = ["collective", "size", "Tutti busbw (GB/s)", "algorithm"]
    for peer in peers:
        head += [f"{peer} busbw", f"Tutti/{peer}"]
    if "ceiling" in doc:
        head.append("t_bound/t")
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for row in primary_rows(doc):
        if row["algorithm"] != "automatic":
            continue
        cells = [row["collective"], human(row["bytes"]), f"{row['busbw_GBps']:.3g}", row.get("chosen", "")]
        for peer in peers:
            p = (row.get("peers") or {}).get(peer)
            cells += [f"{p['busbw_GBps']:.3g}", f"**{p['ratio']:.2f}**"] if p else ["-", "-"]
        if "ceiling" in doc:
            cells.append(f"{row.get('bound_fraction', 0):.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def automatic_table(docs):
    times = {}  # (collective, size) -> algorithm -> [time per pass]
    chosen = {}
    for doc in docs:
        for row in primary_rows(doc):
            key = (row["collective"], row["bytes"])
            times.setdefault(key, {}).setdefault(row["algorithm"], []).append(row["time_us"])
            if row["algorithm"] == "automatic":
                chosen.setdefault(key, set()).add(row.get("chosen", ""))
    median = lambda xs: sorted(xs)[len(xs) // 2]
    lines = ["| collective | size | fastest forced | its median (us) | automatic chose | automatic / fastest"
             " (min–max over passes) |", "| --- | --- | --- | --- | --- | --- |"]
    for (collective, size), by in sorted(times.items()):
        forced = {a: t for a, t in by.items() if a != "automatic"}
        if "automatic" not in by or not forced:
            continue
        best = min(forced, key=lambda a: median(forced[a]))
        auto = by["automatic"]
        per_pass = sorted(a / b for a, b in zip(auto, forced[best]))
        spread = f" ({per_pass[0]:.2f}–{per_pass[-1]:.2f})" if len(per_pass) > 1 else ""
        lines.append(f"| {collective} | {human(size)} | {best} | {median(forced[best]):.1f} | "
                     f"{'/'.join(sorted(chosen[(collective, size)]))} | "
                     f"**{median(auto) / median(forced[best]):.2f}**{spread} |")
    return lines


def automatic_ratios(peer, docs, in_place=False, key="ratio"):
    """(row, PEER time / Tutti time, or the `key` ratio) of every automatic row the peer ran too."""
    for doc in docs:
        for row in primary_rows(doc, in_place):
            p = (row.get("peers") or {}).get(peer)
            if row["algorithm"] == "automatic" and p:
                yield row, p[key]


def spread_table(peer, docs):
    ratios = {}
    for row, ratio in automatic_ratios(peer, docs):
        ratios.setdefault(row["bytes"], {}).setdefault(row["collective"], []).append(ratio)
    collectives = sorted({c for by in ratios.values() for c in by})
    lines = ["| size | " + " | ".join(f"{c} Tutti/{peer}" for c in collectives) + " |",
             "|" + " --- |" * (len(collectives) + 1)]
    for size, by in sorted(ratios.items()):
        cells = []
        for c in collectives:
            r = sorted(by.get(c, []))
            cells.append(f"{r[len(r) // 2]:.2f} ({r[0]:.2f}–{r[-1]:.2f})" if r else "-")
        lines.append(f"| {human(size)} | " + " | ".join(cells) + " |")
    return lines


def size_class(size):
    """The power of two nearest to `size` (0 stays 0): the uneven collectives' rows, whose sizes
    round differently (4092 B for 4 KiB), share the column of the size asked for."""
    return 0 if size <= 0 else 2 ** round(math.log2(size))


def matrix_table(peer, docs, in_place=False, key="ratio"):
    ratios = {}  # collective -> bytes -> [PEER time / Tutti time per run]
    for row, ratio in automatic_ratios(peer, docs, in_place, key):
        ratios.setdefault(row["collective"], {}).setdefault(size_class(row["bytes"]), []).append(ratio)
    sizes = sorted({size for by in ratios.values() for size in by})
    lines = ["| collective | " + " | ".join(human(size) for size in sizes) + " |", "|" + " --- |" * (len(sizes) + 1)]
    for collective in sorted(ratios):
        cells = []
        for size in sizes:
            r = sorted(ratios[collective].get(size, []))
            if not r:
                cells.append("-")
            elif len(r) == 1:
                cells.append(f"{r[0]:.2f}")
            else:
                cells.append(f"{statistics.median(r):.2f} ({r[0]:.2f}–{r[-1]:.2f})")
        lines.append(f"| {collective} | " + " | ".join(cells) + " |")
    return lines


def main(argv):
    if len(argv) >= 4 and argv[1] in ("matrix", "matrix-in-place", "matrix-median"):
        try:
            docs = []
            for name in argv[3:]:
                with open(name) as f:
                    docs.append(json.load(f))
            lines = matrix_table(argv[2], docs, argv[1] == "matrix-in-place",
                                 "median_ratio" if argv[1] == "matrix-median" else "ratio")
        except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
            print(f"bench_table.py: {' '.join(argv[3:])}: {e}", file=sys.stderr)
            return 1
        print("\n".join(lines))
        return 0
    spread = len(argv) >= 4 and argv[1] == "spread"
    passes = len(argv) >= 3 and argv[1] == "automatic"
    if not spread and not passes and (len(argv) != 3 or argv[1] != "peers"):
        print(__doc__, file=sys.stderr)
        return 2
    files = argv[3:] if spread else argv[2:]
    try:
        docs = []
        for name in files:
            with open(name) as f:
                docs.append(json.load(f))
        if spread:
            lines = spread_table(argv[2], docs)
        else:
            lines = peers_table(docs[0]) if argv[1] == "peers" else automatic_table(docs)
    except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
        print(f"bench_table.py: {' '.join(files)}: {e}", file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
