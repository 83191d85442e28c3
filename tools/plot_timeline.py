#!/usr/bin/python3
"""Render a Chrome-trace timeline (the JSON that chrome://tracing and Perfetto read) to a PNG.

Input: {"traceEvents": [...]} or a bare array of events (an array whose closing "]" is missing, as
a timeline cut short leaves it, is accepted). Drawn: "X" events (ts, dur in microseconds) and
"B"/"E" pairs (nested per pid and tid); "M" events name the lanes (thread_name, process_name,
thread_sort_index); other phases are ignored.

One horizontal lane per (pid, tid), labelled with its thread_name (with the process_name in front
when there are several processes); nested events are drawn thinner. Bars are coloured by event
name (NEGOTIATE, QUEUE, MEMCPY_IN_FUSION_BUFFER, ALLREDUCE, MEMCPY_OUT_FUSION_BUFFER, FORWARD,
BACKWARD, OPTIMIZER have fixed colours), with a legend; the x axis is in ms from the trace's first
event. The window: --start-ms (default: 25% into the trace) and --span-ms (default 60). At most
--max-lanes lanes: the step lanes (those with FORWARD, BACKWARD or OPTIMIZER events, or a thread
name with "step") and then the lanes with the most events in the window.

Usage: plot_timeline.py [-o OUT.png] [--start-ms MS] [--span-ms MS] [--max-lanes N] TRACE.json
"""
import argparse
import math
import os
import sys

try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch
except ImportError:
    sys.exit("plot_timeline.py: needs matplotlib (Debian: apt-get install python3-matplotlib)")

from chrome_trace import InputError, collect, number, read_events

PROG = "plot_timeline.py"
KNOWN_COLORS = {
    "NEGOTIATE": "#9e9e9e",
    "QUEUE": "#f2c14e",
    "MEMCPY_IN_FUSION_BUFFER": "#7fb3d5",
    "ALLREDUCE": "#d62728",
    "MEMCPY_OUT_FUSION_BUFFER": "#1f5f99",
    "FORWARD": "#2ca02c",
    "BACKWARD": "#9467bd",
    "OPTIMIZER": "#ff7f0e",
}
STEP_EVENTS = {"FORWARD", "BACKWARD", "OPTIMIZER"}
OTHER_COLORS = ["#17becf", "#8c564b", "#e377c2", "#bcbd22", "#393b79", "#637939", "#8c6d31",
                "#843c39", "#7b4173", "#3182bd", "#e6550d", "#31a354", "#756bb1", "#636363"]
DEFAULT_SPAN_MS = 60.0
DEFAULT_START_FRACTION = 0.25


def with_depth(spans):
    """[(start, end, name, depth)]: depth = how many earlier spans of the lane enclose it."""
    out = []
    stack = []  # end times of the enclosing spans
    for start, end, name in sorted(spans, key=lambda s: (s[0], -s[1])):
        while stack and stack[-1] <= start:
            stack.pop()
        out.append((start, end, name, len(stack)))
        stack.append(end)
    return out


def is_step_lane(lane):
    return bool(lane.name and "step" in lane.name.lower()) or any(s[2] in STEP_EVENTS for s in lane.spans)


def sort_key(value):
    return (0, value, "") if number(value) else (1, 0, str(value))


def choose_lanes(lanes, lo, hi, max_lanes):
    """The lanes to draw, top to bottom."""
    def in_window(lane):
        return sum(1 for s, e, _ in lane.spans if e >= lo and s <= hi)

    drawable = [lane for lane in lanes.values() if lane.spans]
    step = [lane for lane in drawable if is_step_lane(lane)]
    others = [lane for lane in drawable if not is_step_lane(lane) and in_window(lane) > 0]
    others.sort(key=lambda lane: (-in_window(lane), -len(lane.spans)))
    kept = step + others[:max(0, max_lanes - len(step))]
    kept.sort(key=lambda lane: (sort_key(lane.key[0]), not is_step_lane(lane),
                                sort_key(lane.sort_index if lane.sort_index is not None else lane.key[1])))
    return kept


def colors_for(names):
    colors = {}
    spare = iter(OTHER_COLORS * (1 + len(names) // len(OTHER_COLORS)))
    for name in sorted(names, key=lambda n: (n not in KNOWN_COLORS, list(KNOWN_COLORS).index(n)
                                             if n in KNOWN_COLORS else 0, n)):
        colors[name] = KNOWN_COLORS.get(name) or next(spare)
    return colors


def lane_label(lane, process_names, several_pids):
    label = lane.name or f"tid {lane.key[1]}"
    if several_pids:
        label = f"{process_names.get(lane.key[0], f'pid {lane.key[0]}')}: {label}"
    return label


def plot(path, out, start_ms, span_ms, max_lanes, title):
    events = read_events(path)
    lanes, process_names, first, last = collect(events)
    if not any(lane.spans for lane in lanes.values()):
        raise InputError("no duration events (ph \"X\", or \"B\"/\"E\" pairs) to draw")
    total_ms = (last - first) / 1e3
    if span_ms is None:
        span_ms = DEFAULT_SPAN_MS
    if start_ms is None:
        start_ms = DEFAULT_START_FRACTION * total_ms
        if span_ms >= total_ms:
            start_ms = 0.0
        elif start_ms + span_ms > total_ms:
            start_ms = total_ms - span_ms
    lo, hi = first + start_ms * 1e3, first + (start_ms + span_ms) * 1e3

    kept = choose_lanes(lanes, lo, hi, max_lanes)
    several_pids = len({lane.key[0] for lane in kept}) > 1
    visible = {}  # lane index -> [(start, end, name, depth)] clipped to the window
    names = set()
    for row, lane in enumerate(kept):
        spans = [(max(s, lo), min(e, hi), n, d) for s, e, n, d in with_depth(lane.spans)
                 if e >= lo and s <= hi]
        visible[row] = spans
        names.update(n for _, _, n, _ in spans)
    colors = colors_for(names)

    height = 1.6 + 0.42 * max(1, len(kept))
    fig, ax = plt.subplots(figsize=(14, height))
    for row, spans in visible.items():
        y = len(kept) - 1 - row
        groups = {}  # (depth, name, outlined) -> bars; bars too thin for an outline get none
        for s, e, n, d in spans:
            width = (e - s) / 1e3
            groups.setdefault((d, n, width > span_ms * 0.004), []).append(
                ((s - first) / 1e3, max(width, span_ms * 1e-4)))
        for (d, n, outlined), bars in sorted(groups.items()):
            h = 0.8 * (0.7 ** d)
            ax.broken_barh(bars, (y - h / 2, h), facecolors=colors[n],
                           edgecolor="black" if outlined else "none",
                           linewidth=(0.3 if d == 0 else 0.2) if outlined else 0)
    ax.set_yticks(range(len(kept)))
    ax.set_yticklabels([lane_label(lane, process_names, several_pids) for lane in reversed(kept)],
                       fontsize=8)
    ax.set_ylim(-0.6, len(kept) - 0.4)
    ax.set_xlim(start_ms, start_ms + span_ms)
    ax.set_xlabel("time (ms from the start of the trace)")
    ax.grid(axis="x", color="0.85", linewidth=0.6)
    ax.set_axisbelow(True)
    ax.set_title(title or f"{os.path.basename(path)}: {start_ms:.1f}-{start_ms + span_ms:.1f} ms "
                 f"of {total_ms:.1f} ms, {len(kept)} of {sum(1 for l in lanes.values() if l.spans)} lanes",
                 fontsize=10)
    if names:
        handles = [Patch(facecolor=colors[n], edgecolor="black", linewidth=0.3, label=n) for n in colors]
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8,
                  frameon=False)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return len(kept), names


def main(argv):
    p = argparse.ArgumentParser(prog=PROG, description="Chrome-trace timeline JSON to a PNG")
    p.add_argument("trace", help="the timeline JSON")
    p.add_argument("-o", "--out", help="the PNG to write (default: TRACE with .png)")
    p.add_argument("--start-ms", type=float, help="window start, ms after the first event "
                   f"(default: {100 * DEFAULT_START_FRACTION:.0f}%% into the trace)")
    p.add_argument("--span-ms", type=float, help=f"window length in ms (default {DEFAULT_SPAN_MS:g})")
    p.add_argument("--max-lanes", type=int, default=16, help="most lanes drawn (default 16)")
    p.add_argument("--title", help="the plot's title")
    args = p.parse_args(argv)
    if args.start_ms is not None and (not math.isfinite(args.start_ms) or args.start_ms < 0):
        p.error("--start-ms must be a number >= 0")
    if args.span_ms is not None and (not math.isfinite(args.span_ms) or args.span_ms <= 0):
        p.error("--span-ms must be a number > 0")
    if args.max_lanes < 1:
        p.error("--max-lanes must be at least 1")
    out = args.out or os.path.splitext(args.trace)[0] + ".png"
    try:
        lanes, names = plot(args.trace, out, args.start_ms, args.span_ms, args.max_lanes, args.title)
    except InputError as e:
        print(f"{PROG}: {args.trace}: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"{PROG}: {out}: {e.strerror or e}", file=sys.stderr)
        return 1
    print(f"{out}: {lanes} lanes, {len(names)} event names")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
