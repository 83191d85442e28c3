#!/usr/bin/python3
"""The PyTorch peer of tutti-train: the same model, data and schedule, trained with PyTorch's own
DistributedDataParallel over the Gloo backend on loopback, for a side-by-side comparison.

Model: Conv2d(1,16,3,pad 1) - ReLU - MaxPool2d(2) - Conv2d(16,32,3,pad 1) - ReLU - MaxPool2d(2) -
flatten (1568) - Linear(1568,128) - ReLU - Linear(128,10); cross entropy on the logits; SGD with
momentum 0.9. Data: Fashion-MNIST from the gzipped IDX files in --data, x/255 normalized with mean
0.2860 and std 0.3530. Each epoch permutes the training set with a torch.Generator seeded
seed + epoch (epoch counted from 0), the same on every rank; rank r takes positions r, r+p, ... of
the permutation, in batches of --batch-size, as many full batches as every rank has (the tail is
dropped). After each epoch every rank evaluates its strided shard of the test set and the counts
are summed, so the accuracy covers the whole test set.

--no-overlap runs forward and backward under ddp.no_sync() and then averages one flattened copy
of all gradients with a single torch.distributed.all_reduce: communication after backward.

--compression installs one of DDP's own communication hooks: fp16 (each bucket cast to 16 bits
for the allreduce, averaged, cast back; bf16 is refused: Gloo has no bfloat16 allreduce, and
PyTorch's bf16 hook needs NCCL) or powersgd:RANK (PyTorch's PowerSGD hook: rank-RANK
P and Q factors allreduced, warm-started, with error feedback; the first step runs a plain
allreduce, as the hook requires).

--backend tutti trains over Tutti's torch.distributed backend instead of Gloo (the tutti package
must be on PYTHONPATH, e.g. build/python): the same script, only the process group differs.

--from-env runs one rank of a job another launcher started (scripts/cluster.sh's emulated hosts:
each rank is its own process there): rank and size from TUTTI_RANK and TUTTI_SIZE, PyTorch's
rendezvous at the port after the job's tcp:// store, Gloo on the interface of TUTTI_TCP_HOST.

Step time: mean wall time of forward + backward (+ the explicit allreduce with --no-overlap) +
optimizer step on rank 0, leaving out the first 5 steps of the run; samples/s = p * batch / step.
The printed loss is the mean training loss of the epoch over all ranks' steps.

Usage: ddp_peer.py [-n N] [--epochs E] [--batch-size B] [--lr LR] [--threads T] [--seed S]
                   [--train-samples N] [--test-samples N] [--data DIR] [--no-overlap]
                   [--compression none|fp16|powersgd:RANK] [--backend gloo|tutti] [--from-env]
"""
import argparse
import contextlib
import fcntl
import gzip
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import struct
import sys
import time
import traceback

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel as DDP

PROG = "ddp_peer"
DEFAULT_DATA = "/usr/share/datasets/fashion-mnist"
MEAN, STD = 0.2860, 0.3530
WARMUP_STEPS = 5  # the first steps of the run, left out of the step time
EVAL_BATCH = 1000
EXIT_GRACE_S = 60  # how long the launcher waits for the other ranks once one has finished


class DataError(Exception):
    """A data file that is missing or not the IDX file it should be."""


def read_idx(path, magic, dims):
    """The array in gzipped IDX file PATH: checks the magic number and the size. DIMS: the
    expected sizes after the first (None: any)."""
    try:
        with gzip.open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise DataError(f"{path}: no such file (pass --data DIR, the folder with the Fashion-MNIST "
                        f"*-ubyte.gz files)") from None
    except (OSError, EOFError) as e:
        raise DataError(f"{path}: cannot read it as gzip: {e}") from None
    ndim = len(dims) + 1
    header = 4 + 4 * ndim
    if len(data) < header:
        raise DataError(f"{path}: too short for an IDX header ({len(data)} bytes)")
    found = int.from_bytes(data[0:4], "big")
    if found != magic:
        raise DataError(f"{path}: magic number {found}, expected {magic}")
    shape = tuple(int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim))
    for want, got in zip(dims, shape[1:]):
        if want is not None and want != got:
            raise DataError(f"{path}: shape {shape}, expected (N, {', '.join(map(str, dims))})")
    size = int(np.prod(shape))
    if len(data) != header + size:
        raise DataError(f"{path}: {len(data) - header} bytes of data, shape {shape} needs {size}")
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(shape)


def load_split(folder, name):
    """(images uint8 [N,28,28], labels int64 [N]) of split NAME ("train" or "t10k")."""
    images = read_idx(os.path.join(folder, f"{name}-images-idx3-ubyte.gz"), 2051, (28, 28))
    labels_path = os.path.join(folder, f"{name}-labels-idx1-ubyte.gz")
    labels = read_idx(labels_path, 2049, ())
    if labels.shape[0] != images.shape[0]:
        raise DataError(f"{labels_path}: {labels.shape[0]} labels for {images.shape[0]} images")
    if labels.size and labels.max() > 9:
        raise DataError(f"{labels_path}: label {labels.max()} out of range 0..9")
    return images, labels.astype(np.int64)


def build_model():
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * 7 * 7, 128), nn.ReLU(),
        nn.Linear(128, 10))


def normalize(images_u8):
    """uint8 [B,28,28] tensor -> float [B,1,28,28], x/255 normalized."""
    return ((images_u8.to(torch.float32) / 255.0 - MEAN) / STD).unsqueeze(1)


def evaluate(model, images, labels, rank, world):
    """(accuracy, mean loss) over the whole test set: this rank's strided shard, summed."""
    model.eval()
    shard = torch.arange(rank, images.shape[0], world)
    correct = 0
    loss_sum = 0.0
    with torch.no_grad():
        for i in range(0, shard.numel(), EVAL_BATCH):
            idx = shard[i:i + EVAL_BATCH]
            logits = model(normalize(images[idx]))
            y = labels[idx]
            loss_sum += F.cross_entropy(logits, y, reduction="sum").item()
            correct += (logits.argmax(1) == y).sum().item()
    model.train()
    totals = torch.tensor([correct, shard.numel(), loss_sum], dtype=torch.float64)
    dist.all_reduce(totals)
    correct, total, loss_sum = totals.tolist()
    return correct / max(total, 1.0), loss_sum / max(total, 1.0)


def register_compression(ddp, compression):
    """Installs DDP's own communication hook for COMPRESSION (what PyTorch offers over Gloo: an
    fp16 cast of each bucket, and PowerSGD with error feedback and warm start, as Vogels et al.)."""
    if compression == "none":
        return
    if compression == "fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    else:  # powersgd:RANK, checked by parse_compression
        rank = int(compression.split(":", 1)[1])
        # start_powerSGD_iter must be > 1 in torch 1.13 when error feedback is on; the first
        # iterations run a plain allreduce, as the hook's authors recommend.
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=rank,
                                            start_powerSGD_iter=2, use_error_feedback=True,
                                            warm_start=True)
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)


def parse_compression(text):
    """none, fp16 or powersgd:RANK (RANK >= 1). Not bf16: Gloo has no bfloat16 allreduce and
    PyTorch's bf16 hook needs CUDA and NCCL."""
    if text == "bf16":
        raise argparse.ArgumentTypeError("bf16: Gloo has no bfloat16 allreduce, and PyTorch's bf16 hook "
                                         "needs CUDA and NCCL")
    if text in ("none", "fp16"):
        return text
    kind, _, rank = text.partition(":")
    if kind == "powersgd" and rank.isdigit() and int(rank) >= 1:
        return text
    raise argparse.ArgumentTypeError(f"expected none, fp16 or powersgd:RANK, got '{text}'")


def train(rank, args, port, train_x, train_y, test_x, test_y, master="127.0.0.1"):
    world = args.n
    torch.set_num_threads(args.threads)
    if args.backend == "tutti":
        import tutti.distributed  # noqa: F401 (registers the backend)
    dist.init_process_group(args.backend, init_method=f"tcp://{master}:{port}", rank=rank,
                            world_size=world)
    train_x, train_y = torch.from_numpy(train_x), torch.from_numpy(train_y)
    test_x, test_y = torch.from_numpy(test_x), torch.from_numpy(test_y)

    torch.manual_seed(args.seed)
    model = build_model()
    ddp = DDP(model)  # broadcasts rank 0's parameters
    register_compression(ddp, args.compression)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=args.lr, momentum=0.9)
    params = [p for p in model.parameters() if p.requires_grad]

    n = train_x.shape[0]
    steps = n // (world * args.batch_size)
    per_rank = steps * args.batch_size
    if rank == 0:
        print(f"{PROG}: p={world} batch={args.batch_size}/rank lr={args.lr:g} threads={args.threads} "
              f"overlap={'off' if args.no_overlap else 'on'} compression={args.compression} backend={args.backend} torch={torch.__version__}",
              flush=True)

    run_step = 0
    summary = None
    for epoch in range(args.epochs):
        gen = torch.Generator()
        gen.manual_seed(args.seed + epoch)
        mine = torch.randperm(n, generator=gen)[rank::world][:per_rank]
        times = []
        epoch_times = []
        loss_sum = 0.0
        for s in range(steps):
            idx = mine[s * args.batch_size:(s + 1) * args.batch_size]
            x, y = normalize(train_x[idx]), train_y[idx]
            start = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            if args.no_overlap:
                with ddp.no_sync():
                    loss = F.cross_entropy(ddp(x), y)
                    loss.backward()
                flat = torch.cat([p.grad.reshape(-1) for p in params])
                dist.all_reduce(flat)
                flat.div_(world)
                offset = 0
                for p in params:
                    k = p.grad.numel()
                    p.grad.copy_(flat[offset:offset + k].view_as(p.grad))
                    offset += k
            else:
                loss = F.cross_entropy(ddp(x), y)
                loss.backward()
            optimizer.step()
            elapsed = time.perf_counter() - start
            loss_sum += loss.item()
            epoch_times.append(elapsed)
            if run_step >= WARMUP_STEPS:
                times.append(elapsed)
            run_step += 1
        if not times:  # a run shorter than the warm-up: use what there is
            times = epoch_times
        total_loss = torch.tensor([loss_sum, float(steps)], dtype=torch.float64)
        dist.all_reduce(total_loss)
        train_loss = total_loss[0].item() / max(total_loss[1].item(), 1.0)
        accuracy, _ = evaluate(model, test_x, test_y, rank, world)
        step_s = sum(times) / len(times)
        rate = world * args.batch_size / step_s
        if rank == 0:
            print(f"epoch {epoch + 1}/{args.epochs}  loss {train_loss:.4f}  test-acc {100 * accuracy:.2f}%  "
                  f"samples/s {rate:.0f}  step {1e3 * step_s:.2f} ms", flush=True)
        summary = (step_s, rate, accuracy, train_loss)
    if rank == 0 and summary:
        step_s, rate, accuracy, train_loss = summary
        print(f"{PROG}: summary step_ms={1e3 * step_s:.2f} samples_per_s={rate:.0f} "
              f"test_acc={accuracy:.4f} loss={train_loss:.4f}", flush=True)
    dist.barrier()
    # No teardown: destroying the process group (here, or with DDP's reducer) can deadlock, the
    # main thread holding the GIL while it joins a Gloo worker thread that frees a tensor and
    # wants the GIL (torch 1.13). child() ends the process with os._exit instead.


def die_with_parent():
    """Linux: SIGTERM this process when the launcher dies, even by SIGKILL."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def child(rank, args, port, *data):
    # Ctrl-C: the launcher ends the ranks. SIGINT came blocked from the launcher (so a Ctrl-C while
    # the child starts does not interrupt it); ignoring it drops one that is pending.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    die_with_parent()
    status = 0
    try:
        train(rank, args, port, *data)
    except Exception:  # noqa: BLE001 - any failure of a rank: say which, exit non-zero
        sys.stderr.write(f"{PROG}: rank {rank} failed:\n{traceback.format_exc()}")
        status = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # skips the teardown of torch.distributed (see train)


def free_port():
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def positive(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {text}")
    return value


def non_negative(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0: {text}")
    return value


def positive_float(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number: {text}")
    return value


def parse_args(argv):
    p = argparse.ArgumentParser(prog="ddp_peer.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("-n", type=positive, default=2, help="processes (ranks)")
    p.add_argument("--epochs", type=positive, default=2)
    p.add_argument("--batch-size", type=positive, default=64, help="samples per rank and step")
    p.add_argument("--lr", type=positive_float, default=0.05, help="SGD learning rate (momentum 0.9)")
    p.add_argument("--threads", type=positive, default=1, help="torch threads per process")
    p.add_argument("--seed", type=non_negative, default=42)
    p.add_argument("--train-samples", type=non_negative, default=0,
                   help="use the first N training samples (0: all)")
    p.add_argument("--test-samples", type=non_negative, default=0,
                   help="evaluate on the first N test samples (0: all)")
    p.add_argument("--data", default=DEFAULT_DATA, metavar="DIR",
                   help="folder with the gzipped Fashion-MNIST IDX files")
    p.add_argument("--no-overlap", action="store_true",
                   help="one allreduce of all gradients after backward instead of DDP's overlap")
    p.add_argument("--compression", type=parse_compression, default="none",
                   help="DDP communication hook: none, fp16 or powersgd:RANK")
    p.add_argument("--backend", choices=("gloo", "tutti"), default="gloo",
                   help="torch.distributed backend of the process group (tutti: on PYTHONPATH)")
    p.add_argument("--from-env", action="store_true",
                   help="run one rank of a job started by a Tutti launcher (TUTTI_RANK, TUTTI_SIZE, "
                        "TUTTI_STORE=tcp://...) instead of launching -n ranks")
    return p, p.parse_args(argv)


def job_from_environment():
    """(rank, size, master host, port) of a rank started by a Tutti launcher (scripts/cluster.sh,
    tutti-run): TUTTI_RANK and TUTTI_SIZE, and PyTorch's rendezvous at the next port after the
    job's tcp:// store, on the store's host. Sets GLOO_SOCKET_IFNAME to the interface that holds
    TUTTI_TCP_HOST (an emulated host's link), unless it is set."""
    try:
        rank, size = int(os.environ["TUTTI_RANK"]), int(os.environ["TUTTI_SIZE"])
    except (KeyError, ValueError):
        raise DataError("--from-env: TUTTI_RANK and TUTTI_SIZE must be set (run under a Tutti launcher)") from None
    store = os.environ.get("TUTTI_STORE", "")
    host, _, port = store.removeprefix("tcp://").rpartition(":")
    if not store.startswith("tcp://") or not host or not port.isdigit():
        raise DataError(f"--from-env: TUTTI_STORE must be tcp://HOST:PORT, got '{store}'")
    address = os.environ.get("TUTTI_TCP_HOST")
    if address and "GLOO_SOCKET_IFNAME" not in os.environ:
        name = interface_of(address)
        if name:
            os.environ["GLOO_SOCKET_IFNAME"] = name
    return rank, size, host, int(port) + 1


def interface_of(address):
    """The network interface whose IPv4 address is ADDRESS, or None (SIOCGIFADDR on each)."""
    siocgifaddr = 0x8915
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        for name in sorted(os.listdir("/sys/class/net")):
            with contextlib.suppress(OSError):
                reply = fcntl.ioctl(probe.fileno(), siocgifaddr, struct.pack("256s", name.encode()[:15]))
                if socket.inet_ntoa(reply[20:24]) == address:
                    return name
    return None


def launch(args, data):
    """Runs the ranks; returns the exit status."""
    ctx = multiprocessing.get_context("spawn")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # the ranks talk over loopback
    port = free_port()
    procs = []
    status = 0
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})  # inherited by the ranks
        try:
            for rank in range(args.n):
                proc = ctx.Process(target=child, args=(rank, args, port, *data), name=f"rank{rank}",
                                   daemon=True)
                proc.start()
                procs.append(proc)
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        running = {proc.sentinel: rank for rank, proc in enumerate(procs)}
        deadline = None  # once a rank has finished, the others have EXIT_GRACE_S to follow
        while running:
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready = multiprocessing.connection.wait(list(running), timeout)
            if not ready:
                late = ", ".join(str(r) for r in sorted(running.values()))
                print(f"{PROG}: rank(s) {late} still running {EXIT_GRACE_S} s after another "
                      f"finished; stopping them", file=sys.stderr)
                return 1
            if deadline is None:
                deadline = time.monotonic() + EXIT_GRACE_S
            for sentinel in ready:
                rank = running.pop(sentinel)
                proc = procs[rank]
                proc.join()
                if proc.exitcode != 0:
                    how = (f"signal {-proc.exitcode}" if proc.exitcode < 0
                           else f"status {proc.exitcode}")
                    print(f"{PROG}: rank {rank} exited with {how}; stopping the others", file=sys.stderr)
                    return 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; stopping the ranks", file=sys.stderr)
        status = 130
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
        deadline = time.monotonic() + 5
        for proc in procs:
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join()
    return status


def main(argv):
    parser, args = parse_args(argv)
    job = None
    if args.from_env:
        try:
            job = job_from_environment()
        except DataError as e:
            print(f"{PROG}: {e}", file=sys.stderr)
            return 1
        args.n = job[1]
    if args.no_overlap and args.compression != "none":
        parser.error("--compression works through DDP's communication hook, which --no-overlap bypasses")
    try:
        train_x, train_y = load_split(args.data, "train")
        test_x, test_y = load_split(args.data, "t10k")
    except DataError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 1
    for flag, count, have in (("--train-samples", args.train_samples, train_x.shape[0]),
                              ("--test-samples", args.test_samples, test_x.shape[0])):
        if count > have:
            parser.error(f"{flag} {count}: the data set has only {have}")
    if args.train_samples:
        train_x, train_y = train_x[:args.train_samples], train_y[:args.train_samples]
    if args.test_samples:
        test_x, test_y = test_x[:args.test_samples], test_y[:args.test_samples]
    if train_x.shape[0] < args.n * args.batch_size:
        parser.error(f"{train_x.shape[0]} training samples make no step of {args.n} x "
                     f"{args.batch_size}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # ends the ranks on the way out
    if job:
        rank, _, master, port = job
        train(rank, args, port, np.ascontiguousarray(train_x), train_y, np.ascontiguousarray(test_x), test_y,
              master=master)
        return 0
    return launch(args, (np.ascontiguousarray(train_x), train_y, np.ascontiguousarray(test_x), test_y))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
