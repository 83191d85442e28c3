#!/usr/bin/python3
"""Plot tutti-bench results: busbw (GB/s) against message size.

Reads one or more files written by `tutti-bench --json FILE` (schema: "tool", "version",
optional "label", "host", "ranks", "transport", "ceiling", and "results", a list of rows with
"collective", "bytes", "busbw_GBps", optional "algorithm", "in_place", "type", "op",
"ceiling_busbw_GBps" and "peers" {name: {"busbw_GBps", "ratio"}}).

Writes one PNG (--out, default: the first file with .png) with a panel per collective: a line per
Tutti algorithm, one per peer (mpi, gloo), the ceiling dashed; with --ratio a second panel per
collective shows Tutti / peer per size. Out-of-place rows unless --in-place. Needs matplotlib.

Usage: plot_bench.py [--out PNG] [--in-place] [--ratio] [--collective NAME] FILE.json...
"""
import argparse
import json
import math
import os
import sys

try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib import ticker
except ImportError:
    sys.exit("plot_bench.py: needs matplotlib (Debian: apt-get install python3-matplotlib)")

PEER_STYLE = {"mpi": dict(color="0.25", linestyle="-.", marker="s"),
              "gloo": dict(color="tab:brown", linestyle=":", marker="^")}
OTHER_PEER = dict(color="0.55", linestyle=(0, (5, 2, 1, 2)), marker="v")
FILE_MARKERS = "o D P X * h".split()


class InputError(Exception):
    """A file that cannot be read as tutti-bench JSON."""


def number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_row(row, index):
    if not isinstance(row, dict):
        raise InputError(f"results[{index}] is not an object")
    if not isinstance(row.get("collective"), str):
        raise InputError(f"results[{index}] has no \"collective\" string")
    if not number(row.get("bytes")) or row["bytes"] < 0:
        raise InputError(f"results[{index}] has no \"bytes\" number")


def load(path):
    """Returns the parsed document, with "label" set, or raises InputError."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except OSError as e:
        raise InputError(e.strerror or str(e)) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputError(f"not valid JSON: {e}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("results"), list):
        raise InputError("not a tutti-bench --json file (no \"results\" list)")
    for i, row in enumerate(doc["results"]):
        check_row(row, i)
    # A size that rounds to nothing (4 B of allgather on 2 ranks) has no place on a log axis.
    doc["results"] = [row for row in doc["results"] if row["bytes"] > 0]
    stem = os.path.splitext(os.path.basename(path))[0]
    doc["label"] = str(doc.get("label") or stem)
    return doc


def size_label(n):
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:g}{unit}"
    return f"{n:g}B"


def select(doc, collective, in_place):
    return [r for r in doc["results"] if r["collective"] == collective
            and bool(r.get("in_place", False)) == in_place]


def series(rows, key=lambda r: r.get("busbw_GBps")):
    """Sorted (sizes, values) of positive values; rows with no value are dropped."""
    pts = sorted(((r["bytes"], key(r)) for r in rows), key=lambda xy: xy[0])
    pts = [(x, y) for x, y in pts if number(y) and y > 0]
    return [x for x, _ in pts], [y for _, y in pts]


def by_algorithm(rows):
    groups = {}
    for r in rows:
        groups.setdefault(str(r.get("algorithm") or ""), []).append(r)
    return groups


def peers_of(row):
    """The row's {peer: numbers}, keeping only well-formed entries."""
    peers = row.get("peers")
    return {p: v for p, v in peers.items() if isinstance(v, dict)} if isinstance(peers, dict) else {}


def peer_rows(rows):
    """{peer: rows} taking each peer from the first algorithm whose rows carry it."""
    found = {}
    for rs in by_algorithm(rows).values():
        names = {p for r in rs for p in peers_of(r)}
        for p in sorted(names - found.keys()):
            found[p] = [r for r in rs if p in peers_of(r)]
    return found


def ratio_value(p):
    def value(r):
        peer = peers_of(r).get(p)
        if peer is None:
            return None
        if number(peer.get("ratio")):
            return peer["ratio"]
        bw = peer.get("busbw_GBps")
        mine = r.get("busbw_GBps")
        return mine / bw if number(mine) and number(bw) and bw > 0 else None
    return value


def plot_busbw(ax, docs, collective, args, colors):
    multi = len(docs) > 1
    for fi, doc in enumerate(docs):
        rows = select(doc, collective, args.in_place)
        prefix = f"{doc['label']}: " if multi else ""
        marker, fade = FILE_MARKERS[fi % len(FILE_MARKERS)], 1.0 - 0.3 * min(fi, 2)
        for algo, rs in by_algorithm(rows).items():
            ax.plot(*series(rs), marker=marker, ms=4, color=colors(prefix + algo),
                    label=f"{prefix}tutti {algo}".rstrip())
        for p, rs in peer_rows(rows).items():
            style = dict(PEER_STYLE.get(p, OTHER_PEER), ms=4, alpha=fade)
            bw = series(rs, lambda r, p=p: peers_of(r)[p].get("busbw_GBps"))
            ax.plot(*bw, label=f"{prefix}{p}", **style)
        xs, ys = series(rows, lambda r: r.get("ceiling_busbw_GBps"))
        if xs:
            ax.plot(xs, ys, "k--", lw=1.2, alpha=fade, label=f"{prefix}ceiling")
    ax.set_ylabel("busbw (GB/s)")
    ax.set_yscale("log")


def plot_ratio(ax, docs, collective, args, colors):
    multi = len(docs) > 1
    for doc in docs:
        rows = select(doc, collective, args.in_place)
        prefix = f"{doc['label']}: " if multi else ""
        for algo, rs in by_algorithm(rows).items():
            for p in sorted({p for r in rs for p in peers_of(r)}):
                style = PEER_STYLE.get(p, OTHER_PEER)
                ax.plot(*series(rs, ratio_value(p)), color=colors(prefix + algo), ms=4,
                        linestyle=style["linestyle"], marker=style["marker"],
                        label=f"{prefix}{algo or 'tutti'} / {p}")
    ax.axhline(1.0, color="k", lw=1)
    ax.set_ylabel("Tutti / peer (busbw)")
    ax.set_yscale("log")
    low, high = ax.get_ylim()
    ax.set_ylim(min(low, 0.5), max(high, 2.0))
    ax.yaxis.set_major_locator(ticker.LogLocator(base=10, subs=(1, 2, 5)))
    ax.yaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
    ax.yaxis.set_minor_formatter(ticker.NullFormatter())


def size_axis(ax, sizes):
    """log2 axis; ticks on even powers of two (4B, 1KiB, 1MiB, 256MiB) or every power if few."""
    ax.set_xscale("log", base=2)
    lo, hi = math.floor(math.log2(min(sizes))), math.ceil(math.log2(max(sizes)))
    step = 1 if hi - lo <= 12 else 2 if hi - lo <= 32 else 4
    ticks = [1 << k for k in range(lo, hi + 1) if k % step == 0 or step == 1]
    ax.set_xticks(ticks, [size_label(t) for t in ticks], fontsize=8)
    ax.xaxis.set_minor_locator(ticker.NullLocator())
    ax.set_xlabel("size (bytes)")
    ax.grid(True, which="major", alpha=0.3)


def joined(values):
    """The distinct present values, in order, comma-separated ("" if none)."""
    return ",".join(dict.fromkeys(str(v) for v in values if v not in (None, "")))


def title(docs, collective, in_place):
    rows = [r for d in docs for r in select(d, collective, in_place)]
    head = [collective, joined(r.get("type") for r in rows),
            joined(r.get("op") for r in rows if r.get("op") != "none")]
    place = "in-place" if in_place else "out-of-place"
    ranks, transport, host = (joined(d.get(k) for d in docs)
                              for k in ("ranks", "transport", "host"))
    meta = [f"{ranks} ranks" if ranks else "", transport, f"host {host}" if host else ""]
    return f"{' '.join(filter(None, head))} ({place})\n{', '.join(filter(None, meta))}"


def make_colors():
    tab10 = plt.get_cmap("tab10").colors
    palette = [c for i, c in enumerate(tab10) if i not in (5, 7)]  # brown, grey: the peers
    assigned = {}
    return lambda key: assigned.setdefault(key, palette[len(assigned) % len(palette)])


def collectives(docs, args):
    names = dict.fromkeys(r["collective"] for d in docs for r in d["results"]
                          if bool(r.get("in_place", False)) == args.in_place)
    return [n for n in names if n == (args.collective or n)]


def render(docs, names, args):
    cols = 2 if args.ratio else 1
    fig, axes = plt.subplots(len(names), cols, figsize=(9 * cols, 5 * len(names)), squeeze=False)
    colors = make_colors()
    for row, name in zip(axes, names):
        plot_busbw(row[0], docs, name, args, colors)
        if args.ratio:
            plot_ratio(row[1], docs, name, args, colors)
        sizes = [r["bytes"] for d in docs for r in select(d, name, args.in_place)]
        for ax in row:
            size_axis(ax, sizes)
            ax.set_title(title(docs, name, args.in_place), fontsize=10)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                          borderaxespad=0)
    fig.tight_layout()
    fig.savefig(args.out, dpi=100)
    plt.close(fig)


def parse_args(argv):
    ap = argparse.ArgumentParser(description="Plot tutti-bench --json output (busbw vs size).")
    ap.add_argument("files", nargs="+", metavar="FILE.json")
    ap.add_argument("--out", help="PNG to write (default: the first FILE with .png)")
    ap.add_argument("--in-place", action="store_true", help="plot the in-place rows")
    ap.add_argument("--collective", metavar="NAME", help="plot only this collective")
    ap.add_argument("--ratio", action="store_true", help="add a Tutti / peer ratio panel")
    args = ap.parse_args(argv)
    args.out = args.out or os.path.splitext(args.files[0])[0] + ".png"
    return args


def main(argv):
    args = parse_args(argv)
    docs = []
    for path in args.files:
        try:
            docs.append(load(path))
        except InputError as e:
            sys.exit(f"plot_bench.py: {path}: {e}")
    names = collectives(docs, args)
    if not names:
        which = args.collective or "any collective"
        place = "in-place" if args.in_place else "out-of-place"
        sys.exit(f"plot_bench.py: no {place} rows for {which} in {', '.join(args.files)}")
    try:
        render(docs, names, args)
    except OSError as e:
        sys.exit(f"plot_bench.py: cannot write {args.out}: {e.strerror or e}")
    print(args.out)


if __name__ == "__main__":
    main(sys.argv[1:])
