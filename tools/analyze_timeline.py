#!/usr/bin/python3
"""Per-step analysis of tutti timelines (Chrome traces, as the engine and the simulator write them).

A trace holds one process (pid) per rank: a lane "step" with the compute phases FORWARD, BACKWARD
and OPTIMIZER, and one lane per tensor with NEGOTIATE, QUEUE, MEMCPY_IN_FUSION_BUFFER, ALLREDUCE
(or ALLGATHER, BROADCAST), MEMCPY_OUT_FUSION_BUFFER; COMPRESSED_ALLREDUCE, on the step lane, is
communication too. A step is the run of compute phases that ends with an OPTIMIZER; a tensor event
belongs to the step in which it starts. Times are in ms from the step's start. Per step:

  fwd, bwd, opt    first start - last end of FORWARD, BACKWARD, OPTIMIZER
  neg, comm        first start - last end of NEGOTIATE, and of the collectives
  busy             time with a collective running (the union of their intervals)
  ovl              share of busy during BACKWARD (hidden behind backward's compute)
  exposed          from backward's end to the optimizer's start: what step() waited for
  exp.comm         of busy, the part after backward's end
  free, longest    communication-free time in the step (no collective running), and the
                   longest such window: room for background traffic
  gap              from the OPTIMIZER's end to the next step's first compute: the idle time
                   between weight updates (an epoch's evaluation shows up here too)

The summary gives medians over the steps. With --straggler RANK and the traces of several ranks
(a path with "{rank}" reads every rank's file), it compares the straggler with the others, as
means over the steps (the share below is a ratio of totals): its extra compute per step (delay:
its compute less the others' median, step by step; with --baseline, less its own compute in the
baseline) and each side's wait in step(); with --baseline (the same run without the straggler)
how much longer the job's step period (a rank's time from its first step's start to its last's,
per step; the slowest rank's) became, and so the share of the delay the pipelining hid:
1 - (period - baseline period) / delay; and the same seen inside the step, less exposed to the
period's drift from run to run: the straggler's wait in step() in the baseline less its wait
with the delay, over the delay (hidden_in_wait).

With --pipeline (the traces of a tutti-train --pipeline run), per rank: its steps (PIPELINE events,
after --skip), micro-batches per step, and the mean step and compute (its F<k> and B<k> events
inside the steps) in ms, and idle = 1 - compute / step: the stage's bubble.

Usage: analyze_timeline.py [--json] [--summary] [--skip N] [--straggler RANK [--baseline TRACE]...] TRACE...
       analyze_timeline.py --pipeline [--json] [--skip N] TRACE...
A trace may lack its closing bracket (a timeline being written, or cut short). --json prints
{"ranks": {RANK: {"trace", "steps": [...], "summary": {...}}}, "straggler": {...}, "baseline":
{RANK: ...}} with the fields above (ms; shares in [0, 1]; null where a step has no such phase).
Exit status 2 on bad input, with a message naming the file.
"""
import argparse
import glob
import json
import os
import re
import statistics
import sys

from chrome_trace import InputError, collect, read_events

PROG = "analyze_timeline.py"
COMPUTE = {"FORWARD", "BACKWARD", "OPTIMIZER"}
COLLECTIVES = {"ALLREDUCE", "ALLGATHER", "BROADCAST", "COMPRESSED_ALLREDUCE"}
US_PER_MS = 1000.0


# ---- intervals: lists of (start, end) ----

def union(intervals):
    """Sorted, disjoint intervals covering the same time as INTERVALS."""
    merged = []
    for s, e in sorted(intervals):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    return [(s, e) for s, e in merged]


def length(intervals):
    return sum(e - s for s, e in union(intervals))


def overlap(a, b):
    """Time covered by both A and B."""
    total = 0.0
    for s1, e1 in union(a):
        for s2, e2 in union(b):
            total += max(0.0, min(e1, e2) - max(s1, s2))
    return total


def gaps(intervals, lo, hi):
    """The windows of [LO, HI] that INTERVALS leave uncovered."""
    out, at = [], lo
    for s, e in union(intervals):
        if s > at:
            out.append((at, min(s, hi)))
        at = max(at, e)
        if at >= hi:
            break
    if at < hi:
        out.append((at, hi))
    return [(s, e) for s, e in out if e > s]


# ---- reading ----

def expand(pattern):
    """[path]: PATTERN itself, or every file that "{rank}" (its first) matches, by rank."""
    if "{rank}" not in pattern:
        return [pattern]
    head, tail = pattern.split("{rank}", 1)
    regex = re.compile(re.escape(head) + r"(\d+)" + re.escape(tail) + "$")
    found = []
    for path in glob.glob(glob.escape(head) + "*" + glob.escape(tail)):
        m = regex.match(path)
        if m:
            found.append((int(m.group(1)), path))
    if not found:
        raise InputError(f"{pattern}: no file matches")
    return [path for _, path in sorted(found)]


def spans_by_rank(patterns):
    """{rank: (path, [(start_us, end_us, name)])}: the pid of a process is its rank."""
    ranks = {}
    for pattern in patterns:
        for path in expand(pattern):
            try:
                lanes, _, _, _ = collect(read_events(path))
            except InputError as e:
                raise InputError(f"{path}: {e}") from None
            for (pid, _), lane in lanes.items():
                if pid in ranks and ranks[pid][0] != path:
                    raise InputError(f"{path}: rank (pid) {pid} is also in {ranks[pid][0]}")
                ranks.setdefault(pid, (path, []))[1].extend(lane.spans)
    return ranks


# ---- steps ----

def split_steps(spans, path, rank):
    """[(start, end, compute spans, next start or None)] of the complete steps (ending in OPTIMIZER)."""
    compute = sorted((s for s in spans if s[2] in COMPUTE), key=lambda s: (s[0], s[1]))
    if not any(s[2] == "OPTIMIZER" for s in compute):
        raise InputError(f"{path}: rank {rank} has no OPTIMIZER event: its steps cannot be told apart")
    steps, current = [], []
    for span in compute:
        current.append(span)
        if span[2] == "OPTIMIZER":
            steps.append(current)
            current = []
    bounds = [(st[0][0], st[-1][1], st) for st in steps]
    following = [b[0] for b in bounds[1:]] + [current[0][0] if current else None]
    return [(s, e, st, nxt) for (s, e, st), nxt in zip(bounds, following)]


def first_last(spans, origin):
    if not spans:
        return None
    return [(min(s for s, _, _ in spans) - origin) / US_PER_MS, (max(e for _, e, _ in spans) - origin) / US_PER_MS]


def analyze_step(start, end, compute, comm, negotiate, next_start):
    """The figures of one step (ms; shares in [0, 1] or None)."""
    ms = US_PER_MS
    backward = [s for s in compute if s[2] == "BACKWARD"]
    optimizer = [s for s in compute if s[2] == "OPTIMIZER"][-1]
    busy_spans = [(s, e) for s, e, _ in comm]
    busy = length(busy_spans)
    backward_end = max((e for _, e, _ in backward), default=None)
    free = gaps(busy_spans, start, end)
    return {
        "start_ms": start / ms,
        "step_ms": (end - start) / ms,
        "compute_ms": sum(e - s for s, e, _ in compute) / ms,
        "fwd": first_last([s for s in compute if s[2] == "FORWARD"], start),
        "bwd": first_last(backward, start),
        "opt": first_last([optimizer], start),
        "neg": first_last(negotiate, start),
        "comm": first_last(comm, start),
        "busy_ms": busy / ms,
        "overlap": overlap(busy_spans, [(s, e) for s, e, _ in backward]) / busy if busy > 0 else None,
        "exposed_ms": (optimizer[0] - backward_end) / ms if backward_end is not None else None,
        "exposed_comm_ms": overlap(busy_spans, [(backward_end, optimizer[0])]) / ms if backward_end else None,
        "free_ms": sum(e - s for s, e in free) / ms,
        "longest_free_ms": max((e - s for s, e in free), default=0.0) / ms,
        "free_windows": len(free),
        "gap_ms": (next_start - end) / ms if next_start is not None else None,
    }


def analyze_rank(path, spans, rank, skip):
    steps = split_steps(spans, path, rank)
    comm = sorted(s for s in spans if s[2] in COLLECTIVES)
    negotiate = sorted(s for s in spans if s[2] == "NEGOTIATE")
    out = []
    for start, end, compute, nxt in steps:
        limit = nxt if nxt is not None else float("inf")
        mine = lambda events: [s for s in events if start <= s[0] < limit]  # noqa: E731
        out.append(analyze_step(start, end, compute, mine(comm), mine(negotiate), nxt))
    for i, step in enumerate(out):
        step["step"] = i
    return out[skip:]


def median(steps, key):
    values = [s[key] for s in steps if s.get(key) is not None]
    return statistics.median(values) if values else None


SUMMARY_KEYS = ["step_ms", "compute_ms", "busy_ms", "overlap", "exposed_ms", "exposed_comm_ms", "free_ms",
                "longest_free_ms", "gap_ms"]


def summarize(steps):
    summary = {"steps": len(steps)}
    for key in SUMMARY_KEYS:
        summary[key] = median(steps, key)
    starts = [s["start_ms"] for s in steps]
    periods = [b - a for a, b in zip(starts, starts[1:])]
    summary["period_ms"] = statistics.median(periods) if periods else None
    return summary


def load(patterns, skip):
    """{rank: {"trace", "steps", "summary"}}."""
    result = {}
    for rank, (path, spans) in sorted(spans_by_rank(patterns).items()):
        if not any(s[2] in COMPUTE for s in spans):
            continue  # a process with no step lane (e.g. only metadata)
        steps = analyze_rank(path, spans, rank, skip)
        result[rank] = {"trace": path, "steps": steps, "summary": summarize(steps)}
    if not result:
        raise InputError(f"{', '.join(patterns)}: no rank has FORWARD, BACKWARD or OPTIMIZER events")
    return result


def mean(values):
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def job_period(ranks):
    """The job's time per step: on each rank, from its first step's start to its last's over the
    steps between (a mean: the straggler's share is a ratio of totals); the slowest rank's."""
    periods = [(r["steps"][-1]["start_ms"] - r["steps"][0]["start_ms"]) / (len(r["steps"]) - 1)
               for r in ranks.values() if len(r["steps"]) >= 2]
    return max(periods) if periods else None


def straggler_report(ranks, straggler, baseline):
    """The straggler against the other ranks, and against BASELINE's ranks if given: means over the
    steps, ms per step."""
    if straggler not in ranks:
        raise InputError(f"--straggler {straggler}: no such rank in the traces (ranks {sorted(ranks)})")
    others = [r for r in ranks if r != straggler]
    if not others:
        raise InputError(f"--straggler {straggler}: needs the traces of other ranks too (a path with {{rank}})")
    n = min(len(ranks[r]["steps"]) for r in ranks)
    steps = {r: ranks[r]["steps"][:n] for r in ranks}
    exposed = {r: mean(s["exposed_ms"] for s in steps[r]) for r in ranks}
    out = {
        "rank": straggler,
        "steps": n,
        "delay_vs_others_ms": mean(steps[straggler][k]["compute_ms"] -
                                   statistics.median(steps[r][k]["compute_ms"] for r in others) for k in range(n)),
        "straggler_exposed_ms": exposed[straggler],
        "others_exposed_ms": mean(exposed[r] for r in others),
        "period_ms": job_period(ranks),
    }
    out["delay_ms"] = out["delay_vs_others_ms"]
    if baseline:
        if straggler not in baseline:
            raise InputError(f"--baseline: no rank {straggler} in its traces")
        # Against its own compute without the straggler: ranks differ (one hosts the store, the
        # ranks of a host share its link), so the others are a poorer yardstick.
        out["delay_ms"] = mean(s["compute_ms"] for s in steps[straggler]) - mean(
            s["compute_ms"] for s in baseline[straggler]["steps"])
        out["baseline_period_ms"] = job_period(baseline)
        out["baseline_exposed_ms"] = mean(mean(s["exposed_ms"] for s in b["steps"]) for b in baseline.values())
        out["baseline_straggler_exposed_ms"] = mean(s["exposed_ms"] for s in baseline[straggler]["steps"])
        if out["period_ms"] is not None and out["baseline_period_ms"] is not None:
            out["increase_ms"] = out["period_ms"] - out["baseline_period_ms"]
            if out["delay_ms"]:
                out["hidden"] = 1 - out["increase_ms"] / out["delay_ms"]
        # The same share seen inside the step: the part of the delay that went into time the
        # straggler used to wait for communication. Free of the period's run-to-run drift.
        if out["delay_ms"] and None not in (out["baseline_straggler_exposed_ms"], out["straggler_exposed_ms"]):
            out["hidden_in_wait"] = (out["baseline_straggler_exposed_ms"] - out["straggler_exposed_ms"]) / out["delay_ms"]
    return out


# ---- output ----

def fmt(value, digits=2, scale=1.0):
    return "-" if value is None else f"{value * scale:.{digits}f}"


def fmt_span(span):
    return "-" if span is None else f"{span[0]:.2f}-{span[1]:.2f}"


COLUMNS = [("step", 4), ("fwd", 13), ("bwd", 13), ("neg", 13), ("comm", 13), ("opt", 13), ("busy", 7),
           ("ovl%", 5), ("exposed", 8), ("exp.comm", 8), ("free", 7), ("longest", 7), ("gap", 7)]


def row(values):
    return "  ".join(str(v).rjust(w) for v, (_, w) in zip(values, COLUMNS))


def step_row(s):
    return row([s["step"], fmt_span(s["fwd"]), fmt_span(s["bwd"]), fmt_span(s["neg"]), fmt_span(s["comm"]),
                fmt_span(s["opt"]), fmt(s["busy_ms"]), fmt(s["overlap"], 1, 100), fmt(s["exposed_ms"]),
                fmt(s["exposed_comm_ms"]), fmt(s["free_ms"]), fmt(s["longest_free_ms"]), fmt(s["gap_ms"])])


def print_rank(rank, info, steps_too):
    m = info["summary"]
    print(f"rank {rank} ({info['trace']}): {m['steps']} steps, ms from each step's start")
    if steps_too:
        print(row([name for name, _ in COLUMNS]))
        for s in info["steps"]:
            print(step_row(s))
    print(f"  median: step {fmt(m['step_ms'])} ms (period {fmt(m['period_ms'])}), compute {fmt(m['compute_ms'])}, "
          f"collectives busy {fmt(m['busy_ms'])}, {fmt(m['overlap'], 1, 100)}% of it during backward, "
          f"exposed {fmt(m['exposed_ms'])} (collectives {fmt(m['exposed_comm_ms'])}), communication-free "
          f"{fmt(m['free_ms'])} (longest window {fmt(m['longest_free_ms'])}), gap between updates {fmt(m['gap_ms'])}")


def print_straggler(r):
    print(f"straggler rank {r['rank']} over {r['steps']} steps (means, ms per step): extra compute (delay) "
          f"{fmt(r['delay_ms'])} (against the other ranks {fmt(r['delay_vs_others_ms'])}); wait in step(): "
          f"straggler {fmt(r['straggler_exposed_ms'])}, others {fmt(r['others_exposed_ms'])}; job step period "
          f"{fmt(r['period_ms'])}")
    if "baseline_period_ms" in r:
        print(f"  against the baseline: period {fmt(r['baseline_period_ms'])} -> {fmt(r['period_ms'])} "
              f"(+{fmt(r.get('increase_ms'))}), wait in step() {fmt(r['baseline_exposed_ms'])}; "
              f"hidden share of the delay {fmt(r.get('hidden'), 1, 100)}%; the straggler's wait "
              f"{fmt(r['baseline_straggler_exposed_ms'])} -> {fmt(r['straggler_exposed_ms'])}: "
              f"{fmt(r.get('hidden_in_wait'), 1, 100)}% of the delay went into it")


# ---- pipeline ----

MICRO_BATCH_PHASE = re.compile(r"[FB]\d+")


def pipeline_report(patterns, skip):
    """{rank: {...}}: each pipeline stage's step (PIPELINE) against its micro-batches' forwards and
    backwards (F<k>, B<k>) inside it, after the first SKIP steps; idle = 1 - compute / step."""
    out = {}
    for rank, (path, spans) in sorted(spans_by_rank(patterns).items()):
        windows = sorted((s, e) for s, e, name in spans if name == "PIPELINE")
        if len(windows) <= skip:
            raise InputError(f"{path}: rank {rank} has {len(windows)} PIPELINE events, not more than --skip {skip} "
                             "(a tutti-train --pipeline run's timeline has one per step)")
        windows = windows[skip:]
        work = [(s, e) for s, e, name in spans if MICRO_BATCH_PHASE.fullmatch(name)]
        step = sum(e - s for s, e in windows)
        compute = overlap(work, windows)  # the steps do not overlap one another
        micro = sum(1 for s, e, name in spans if name.startswith("F") and MICRO_BATCH_PHASE.fullmatch(name)
                    and any(ws <= s < we for ws, we in windows))
        n = len(windows)
        out[str(rank)] = {"trace": path, "steps": n, "micro_batches": micro / n, "step_ms": step / n / 1e3,
                          "compute_ms": compute / n / 1e3, "idle": 1 - compute / step if step > 0 else 0.0}
    return out


def print_pipeline(report):
    print("rank  steps  micro-batches  step ms  compute ms  idle")
    for rank, r in report.items():
        print(f"{rank:>4}  {r['steps']:>5}  {r['micro_batches']:>13.1f}  {r['step_ms']:>7.2f}  {r['compute_ms']:>10.2f}"
              f"  {r['idle']:.3f}")


def main(argv):
    p = argparse.ArgumentParser(prog=PROG, description="Per-step analysis of tutti Chrome-trace timelines.")
    p.add_argument("traces", nargs="+", metavar="TRACE", help="timeline files; \"{rank}\" in a path reads every rank's")
    p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    p.add_argument("--skip", type=int, default=0, help="leave out each rank's first N steps (warm-up)")
    p.add_argument("--straggler", type=int, metavar="RANK", help="compare this rank with the others")
    p.add_argument("--baseline", action="append", default=[], metavar="TRACE",
                   help="the same run without the straggler (with --straggler)")
    p.add_argument("--summary", action="store_true", help="medians only, no per-step rows")
    p.add_argument("--pipeline", action="store_true",
                   help="each pipeline stage's idle share (its bubble) from PIPELINE and F<k>/B<k> events")
    args = p.parse_args(argv)
    if args.skip < 0:
        p.error("--skip must be >= 0")
    if args.baseline and args.straggler is None:
        p.error("--baseline needs --straggler")
    if args.pipeline and args.straggler is not None:
        p.error("--pipeline and --straggler are separate analyses")
    try:
        if args.pipeline:
            report = {"pipeline": pipeline_report(args.traces, args.skip)}
        else:
            ranks = load(args.traces, args.skip)
            report = {"ranks": {str(r): v for r, v in ranks.items()}}
            if args.straggler is not None:
                baseline = load(args.baseline, args.skip) if args.baseline else None
                report["straggler"] = straggler_report(ranks, args.straggler, baseline)
                if baseline:
                    report["baseline"] = {str(r): v for r, v in baseline.items()}
    except InputError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    if args.json:
        json.dump(report, sys.stdout, indent=1)
        print()
        return 0
    if args.pipeline:
        print_pipeline(report["pipeline"])
        return 0
    for rank, info in ranks.items():
        print_rank(rank, info, not args.summary)
    if "straggler" in report:
        print_straggler(report["straggler"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
