"""Chrome-trace files (the JSON that chrome://tracing and Perfetto read), as tutti's timelines and
the simulator write them: reading a file (a bare array, an array cut short, or an object with
"traceEvents") and gathering its duration events into lanes.

Used by plot_timeline.py and analyze_timeline.py; standard library only.
"""
import json
import math


class InputError(Exception):
    """A file that cannot be read as a Chrome trace."""


def number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def read_events(path):
    """The list of event objects in trace file PATH, or raises InputError."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise InputError(e.strerror or str(e)) from None
    except UnicodeDecodeError as e:
        raise InputError(f"not valid JSON: {e}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        # The trace format allows an array that was never closed.
        body = text.rstrip().rstrip(",")
        doc = None
        if body.lstrip().startswith("[") and not body.endswith("]"):
            try:
                doc = json.loads(body + "]")
            except json.JSONDecodeError:
                pass
        if doc is None:
            raise InputError(f"not valid JSON: {e}") from None
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        raise InputError("neither a JSON array of events nor an object with a \"traceEvents\" array")
    for i, ev in enumerate(events):
        if not isinstance(ev, dict):
            raise InputError(f"event {i} is not an object")
    return events


class Lane:
    def __init__(self, key):
        self.key = key  # (pid, tid)
        self.spans = []  # (start_us, end_us, name)
        self.open = []  # B events waiting for their E: (start_us, name)
        self.name = None
        self.sort_index = None


def lane_key(ev):
    return (ev.get("pid", 0), ev.get("tid", 0))


def collect(events):
    """(lanes by key, process names by pid, first ts, last ts)."""
    lanes = {}
    process_names = {}
    first, last = math.inf, -math.inf

    def lane(key):
        if key not in lanes:
            lanes[key] = Lane(key)
        return lanes[key]

    for i, ev in enumerate(events):
        ph = ev.get("ph")
        if ph == "M":
            args = ev.get("args") if isinstance(ev.get("args"), dict) else {}
            if ev.get("name") == "thread_name" and isinstance(args.get("name"), str):
                lane(lane_key(ev)).name = args["name"]
            elif ev.get("name") == "process_name" and isinstance(args.get("name"), str):
                process_names[ev.get("pid", 0)] = args["name"]
            elif ev.get("name") == "thread_sort_index" and number(args.get("sort_index")):
                lane(lane_key(ev)).sort_index = args["sort_index"]
            continue
        if ph not in ("X", "B", "E"):
            continue
        ts = ev.get("ts")
        if not number(ts):
            raise InputError(f"event {i} (ph \"{ph}\") has no numeric \"ts\"")
        name = str(ev.get("name", "?"))
        target = lane(lane_key(ev))
        if ph == "X":
            dur = ev.get("dur", 0)
            if not number(dur) or dur < 0:
                raise InputError(f"event {i} (ph \"X\") has no non-negative numeric \"dur\"")
            target.spans.append((ts, ts + dur, name))
            first, last = min(first, ts), max(last, ts + dur)
        elif ph == "B":
            target.open.append((ts, name))
            first, last = min(first, ts), max(last, ts)
        else:  # E closes the innermost open B of its lane; a stray E is ignored
            if target.open:
                start, begin_name = target.open.pop()
                target.spans.append((start, max(ts, start), begin_name))
            first, last = min(first, ts), max(last, ts)
    for target in lanes.values():  # B without E: runs to the end of the trace
        while target.open:
            start, name = target.open.pop()
            target.spans.append((start, last, name))
    return lanes, process_names, first, last
