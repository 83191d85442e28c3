#!/usr/bin/python3
"""Plots tutti-sim speedups (scripts/lee_study.sh) and prints them as a markdown table.

Input: JSON lines of `tutti-sim --json --compare`, each with "model" and "scaling" added.
One panel per (model, scaling): speedup against ranks for each policy, the ideal line, and the
published speedups of Lee et al. (SC18) at 8,192 cores for reference.
Usage: plot_scaling.py RESULTS.jsonl OUT.png [--global N]
"""
import argparse
import json
import sys

PUBLISHED = {"vgg16": 2516, "resnet50": 2734}  # Lee et al., SC18, at 8,192 cores


def read(path):
    rows = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                for key in ("model", "scaling", "variant", "ranks", "speedup", "step_s", "exposed_s"):
                    row[key]
            except (ValueError, KeyError) as e:
                sys.exit(f"plot_scaling: {path}:{number}: not a tutti-sim row ({e})")
            rows.append(row)
    if not rows:
        sys.exit(f"plot_scaling: {path}: no rows")
    return rows


def table(rows, global_batch):
    panels = sorted({(r["model"], r["scaling"]) for r in rows})
    variants = sorted({r["variant"] for r in rows})
    for model, scaling in panels:
        label = f"global batch {global_batch}" if scaling == "strong" else "profile's batch per rank"
        print(f"\n{model}, {scaling} scaling ({label}): speedup (exposed ms per step)\n")
        ranks = sorted({r["ranks"] for r in rows if (r["model"], r["scaling"]) == (model, scaling)})
        print("| ranks | " + " | ".join(variants) + " |")
        print("| --- |" + " --- |" * len(variants))
        for p in ranks:
            cells = []
            for v in variants:
                match = [r for r in rows if (r["model"], r["scaling"], r["variant"], r["ranks"]) == (model, scaling, v, p)]
                cells.append(f"{match[0]['speedup']:.0f} ({1e3 * match[0]['exposed_s']:.1f})" if match else "")
            print(f"| {p} | " + " | ".join(cells) + " |")


def plot(rows, out, global_batch):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("plot_scaling: python3-matplotlib is not installed")
    panels = sorted({(r["model"], r["scaling"]) for r in rows})
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 4), squeeze=False)
    for ax, (model, scaling) in zip(axes[0], panels):
        mine = [r for r in rows if (r["model"], r["scaling"]) == (model, scaling)]
        ranks = sorted({r["ranks"] for r in mine})
        for v in sorted({r["variant"] for r in mine}):
            pts = sorted((r["ranks"], r["speedup"]) for r in mine if r["variant"] == v)
            ax.plot([p for p, _ in pts], [s for _, s in pts], marker="o", label=v)
        ax.plot(ranks, ranks, color="grey", linestyle=":", label="ideal")
        if model in PUBLISHED:
            ax.scatter([8192], [PUBLISHED[model]], marker="*", s=120, color="black", label="Lee et al. (8,192 cores)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_xlabel("ranks (one per node)")
        ax.set_ylabel("speedup over one rank")
        batch = f"global batch {global_batch}" if scaling == "strong" else "weak scaling"
        ax.set_title(f"{model}, {batch}", fontsize=10)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results")
    parser.add_argument("out")
    parser.add_argument("--global", dest="global_batch", type=int, default=8192)
    args = parser.parse_args()
    rows = read(args.results)
    table(rows, args.global_batch)
    plot(rows, args.out, args.global_batch)


if __name__ == "__main__":
    main()
