#!/usr/bin/python3
"""Measure a torchvision model's training step and write a tutti-sim model profile.

The profile (format: include/tutti/sim.hpp) lists the forward time, each parameter gradient in the
order backward makes it ready (its element count and the backward time since the previous one was
ready, or since backward began) and the optimizer's time: what one rank computes in a step.

Measured here: torchvision.models.<MODEL>(weights=None) (no download), SGD with momentum 0.9,
cross-entropy on a synthetic batch of --measure-batch images of --image-size pixels, --threads
intra-op threads. --warmup steps are run untimed, then --steps timed ones; every time written is a
median over the timed steps. A gradient is ready when its AccumulateGrad node has run (a post hook
on that node: the gradient is in .grad and could be sent).

Scaling: with --scale-to-throughput IMG_PER_S and --batch B, every time is multiplied by one
factor s = B / (IMG_PER_S * T), T the measured forward + backward + optimizer, so that B images per
(forward + backward + optimizer) is the target throughput: compute is taken to grow linearly with
the batch, and the measured split between layers is kept. Without it the measured times are
written as they are (batch = --measure-batch).

Usage: model_profile.py --model vgg16 -o vgg16.profile [--measure-batch 4] [--steps 5]
           [--warmup 2] [--threads 1] [--image-size 224]
           [--scale-to-throughput IMG_PER_S --batch B] [--note TEXT ...]
Run with /usr/bin/python3 (it has torch and torchvision).
"""
import argparse
import os
import platform
import statistics
import sys
import time


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a torchvision.models builder: vgg16, resnet50, ...")
    p.add_argument("-o", "--output", required=True, help="the profile to write (atomically)")
    p.add_argument("--measure-batch", type=int, default=4, help="images per measured step")
    p.add_argument("--steps", type=int, default=5, help="timed steps (medians over these)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    p.add_argument("--threads", type=int, default=1,
                   help="torch intra-op threads (1: a busy machine stalls parallel regions)")
    p.add_argument("--image-size", type=int, default=224, help="input height and width")
    p.add_argument("--classes", type=int, default=1000, help="the model's output classes")
    p.add_argument("--scale-to-throughput", type=float, metavar="IMG_PER_S",
                   help="scale all times so that --batch images per step run at this rate")
    p.add_argument("--batch", type=int, help="per-rank batch of the target (with --scale-to-throughput)")
    p.add_argument("--note", action="append", default=[], help="a provenance line for the profile")
    args = p.parse_args(argv)
    for name in ("measure_batch", "steps", "threads", "image_size", "classes"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.warmup < 0:
        p.error("--warmup must be >= 0")
    if (args.scale_to_throughput is None) != (args.batch is None):
        p.error("--scale-to-throughput and --batch go together")
    if args.scale_to_throughput is not None and (args.scale_to_throughput <= 0 or args.batch < 1):
        p.error("--scale-to-throughput must be > 0 and --batch >= 1")
    if any("\n" in n for n in args.note):
        p.error("--note must be one line")
    return args


def build_model(torchvision, name, classes):
    builder = getattr(torchvision.models, name, None)
    if builder is None or not callable(builder):
        raise SystemExit(f"model_profile.py: torchvision.models has no model \"{name}\"")
    return builder(weights=None, num_classes=classes)


class ReadyClock:
    """Records, per backward, when each parameter's gradient has been accumulated into .grad."""

    def __init__(self, named_parameters):
        self.ready = []  # (name, perf_counter) in the order the gradients became ready
        self._nodes = []  # the AccumulateGrad nodes must stay alive for their hooks to run
        for name, param in named_parameters:
            # expand_as makes a non-leaf view whose grad_fn leads to the parameter's accumulator.
            node = param.expand_as(param).grad_fn.next_functions[0][0]
            node.register_hook(self._hook(name))
            self._nodes.append(node)

    def _hook(self, name):
        def on_ready(grad_inputs, grad_outputs):
            self.ready.append((name, time.perf_counter()))
        return on_ready


def measure(args):
    """Runs the steps; returns (model, forward, optimizer, order, ready offsets, backward tails)."""
    import torch
    import torchvision
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    model = build_model(torchvision, args.model, args.classes)
    model.train()
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    clock = ReadyClock(named)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()
    x = torch.randn(args.measure_batch, 3, args.image_size, args.image_size)
    y = torch.randint(0, args.classes, (args.measure_batch,))
    forward, optimizer, tails, ready_at = [], [], [], {}
    order = None
    for step in range(args.warmup + args.steps):
        opt.zero_grad(set_to_none=True)
        clock.ready.clear()
        t0 = time.perf_counter()
        loss = loss_fn(model(x), y)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        t3 = time.perf_counter()
        names = [n for n, _ in clock.ready]
        if len(names) != len(named) or len(set(names)) != len(named):
            raise SystemExit(f"model_profile.py: step {step}: {len(set(names))} of {len(named)} gradients became ready")
        if order is None:
            order = names
        elif names != order:
            raise SystemExit(f"model_profile.py: step {step}: backward made the gradients ready in another order")
        if step < args.warmup:
            continue
        forward.append(t1 - t0)
        optimizer.append(t3 - t2)
        tails.append(t2 - clock.ready[-1][1])
        for name, t in clock.ready:
            ready_at.setdefault(name, []).append(t - t1)
    counts = {n: p.numel() for n, p in named}
    return model, statistics.median(forward), statistics.median(optimizer), order, counts, ready_at, tails


def gradient_times(order, ready_at):
    """Per gradient, the median ready time minus the previous gradient's (>= 0: medians sorted)."""
    medians = [statistics.median(ready_at[n]) for n in order]
    previous, deltas = 0.0, []
    for m in medians:
        m = max(m, previous)  # a later gradient's median cannot precede an earlier one's
        deltas.append(m - previous)
        previous = m
    return deltas


def write_profile(path, model, batch, forward, optimizer, notes, grads):
    lines = ["tutti-profile 1", f"model {model}", f"batch {batch}", f"forward {forward:.9g}",
             f"optimizer {optimizer:.9g}"]
    lines += [f"note {n}" for n in notes]
    lines += [f"grad {name} {count} f32 {seconds:.9g}" for name, count, seconds in grads]
    temporary = path + ".tmp"
    with open(temporary, "w") as out:
        out.write("\n".join(lines) + "\n")
    os.replace(temporary, path)


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main(argv):
    args = parse_args(argv)
    import torch
    model, forward, optimizer, order, counts, ready_at, tails = measure(args)
    deltas = gradient_times(order, ready_at)
    backward = sum(deltas)
    total = forward + backward + optimizer
    notes = [f"measured: torchvision {args.model} (weights=None), SGD momentum 0.9, batch {args.measure_batch}, "
             f"{args.image_size}x{args.image_size} synthetic input, {args.threads} threads, torch {torch.__version__}, "
             f"on {cpu_name()} ({os.cpu_count()} CPUs); medians of {args.steps} steps after {args.warmup} warm-up",
             f"measured seconds: forward {forward:.6g} backward {backward:.6g} optimizer {optimizer:.6g} "
             f"(backward after the last gradient, not listed: {statistics.median(tails):.3g})"]
    batch, scale = args.measure_batch, 1.0
    if args.scale_to_throughput is not None:
        batch = args.batch
        scale = args.batch / (args.scale_to_throughput * total)
        notes.append(f"scaled: every time x {scale:.6g} so that batch {batch} runs at "
                     f"{args.scale_to_throughput:g} images/s (compute linear in the batch, the measured split kept)")
    else:
        notes.append("not scaled: the measured times")
    notes += args.note
    grads = [(n, counts[n], d * scale) for n, d in zip(order, deltas)]
    write_profile(args.output, args.model, batch, forward * scale, optimizer * scale, notes, grads)
    print(f"{args.output}: {len(grads)} gradients, {sum(counts.values())} parameters, step "
          f"{total * scale:.6g} s at batch {batch} ({batch / (total * scale):.4g} images/s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
