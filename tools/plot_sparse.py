#!/usr/bin/python3
"""Plot the sparse collectives' time against density, from scripts/sparse_study.sh's output.

Reads the text that sparse_study.sh (or one `tutti-bench --collective sparse_allreduce` run) printed: a
section per "## LAYOUT (hosts x ranks), links at RATE" header (a lone run is one section), and
in it the table rows of tutti-bench (density, max nnz, union, type, op, algorithm, form,
time(us), dense(us), speedup, #wrong), with or without a launcher's "[RANK] " prefix. Rows of
one type and op are plotted (the first seen unless --type/--op).

Writes one PNG (--out, default: the input with .png) with a panel per section: time per call
against density (both logarithmic), a line per algorithm, automatic drawn thick, the
dense_allreduce algorithm and the densify+allreduce row dashed, the plain dense allreduce of a
ready vector (each row's dense column) dotted. A row with #wrong > 0 is an error, not a point. Needs matplotlib.

Usage: plot_sparse.py [--out PNG] [--type T] [--op OP] FILE
"""
import argparse
import os
import re
import sys

try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    sys.exit("plot_sparse.py: needs matplotlib (Debian: apt-get install python3-matplotlib)")

HEADER = re.compile(r"^## (.+)$")
ROW = re.compile(r"^(?:\[\d+\]\s+)?(\d+\.\d+)\s+(\d+)\s+(\d+)\s+(\w+)\s+(\w+)\s+([\w()+]+)\s+(sparse|dense)\s+"
                 r"([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\d+)\s*$")


class InputError(Exception):
    """Text with no sparse_allreduce rows, or a row that reports wrong results."""


def read_sections(path):
    """[(title, [row dict])] in file order."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise InputError(f"{path}: {e.strerror or e}") from None
    sections = []
    for line in lines:
        header = HEADER.match(line)
        if header:
            sections.append((header.group(1), []))
            continue
        m = ROW.match(line.strip()) or ROW.match(line)
        if not m:
            continue
        if not sections:
            sections.append((os.path.basename(path), []))
        density, _, union, dtype, op, algorithm, form, time_us, dense_us, _, wrong = m.groups()
        if int(wrong) != 0:
            raise InputError(f"{path}: {algorithm} at density {density} reports {wrong} wrong values")
        sections[-1][1].append(dict(density=float(density), union=int(union), type=dtype, op=op,
                                    algorithm=algorithm, form=form, time=float(time_us),
                                    dense=float(dense_us)))
    sections = [(title, rows) for title, rows in sections if rows]
    if not sections:
        raise InputError(f"{path}: no tutti-bench sparse_allreduce rows")
    return sections


def plot(sections, out, dtype, op):
    fig, axes = plt.subplots(1, len(sections), figsize=(5.5 * len(sections), 4.2), squeeze=False)
    for ax, (title, rows) in zip(axes[0], sections):
        pick_type = dtype or rows[0]["type"]
        pick_op = op or rows[0]["op"]
        rows = [r for r in rows if r["type"] == pick_type and r["op"] == pick_op]
        if not rows:
            raise InputError(f"{title}: no rows of type {pick_type} and op {pick_op}")
        lines = {}
        plain = {}  # the plain dense allreduce of a ready vector: every row's dense(us)
        for r in rows:
            name = "automatic" if r["algorithm"].startswith("automatic") else r["algorithm"]
            lines.setdefault(name, []).append((r["density"], r["time"] / 1e3))
            plain[r["density"]] = r["dense"] / 1e3
        lines["dense allreduce (ready vector)"] = list(plain.items())
        styles = {"automatic": dict(linewidth=3, color="black"),
                  "dense_allreduce": dict(linestyle="--", color="tab:red"),
                  "hierarchical": dict(marker="s", color="tab:purple"),
                  "densify+allreduce": dict(linestyle="--", color="tab:orange"),
                  "dense allreduce (ready vector)": dict(linestyle=":", color="tab:gray")}
        for name, points in lines.items():
            points.sort()
            xs, ys = zip(*points)
            ax.plot(xs, ys, label=name, **styles.get(name, dict(marker="o")))
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("density (nnz / dim per rank)")
        ax.set_ylabel("time per call (ms)")
        ax.set_title(f"{title}\n{pick_type} {pick_op}", fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(argv):
    p = argparse.ArgumentParser(prog="plot_sparse.py", description=__doc__.split("\n\n")[0])
    p.add_argument("file")
    p.add_argument("--out")
    p.add_argument("--type")
    p.add_argument("--op")
    args = p.parse_args(argv)
    try:
        sections = read_sections(args.file)
        out = args.out or os.path.splitext(args.file)[0] + ".png"
        plot(sections, out, args.type, args.op)
    except InputError as e:
        print(f"plot_sparse.py: {e}", file=sys.stderr)
        return 1
    print(f"plot_sparse.py: wrote {out} ({len(sections)} panel(s))")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
