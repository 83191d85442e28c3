"""Data-parallel training of a small convolutional network on Fashion-MNIST with Horovod's
PyTorch API over Tutti (docs/horovod.md).

The equivalent of Horovod's examples/pytorch/pytorch_mnist.py without torchvision: the same
network, optimizer, learning-rate scaling, samplers, Horovod calls and printed lines, with the
data read from the gzipped IDX files of Debian's dataset-fashion-mnist.

    tutti-run -n 2 python3 examples/horovod_mnist.py --epochs 1
"""

import argparse
import gzip
import os
import struct

import torch
import torch.nn.functional as F
import torch.utils.data.distributed

import tutti.horovod.torch as hvd

MEAN, STD = 0.1307, 0.3081  # the normalization Horovod's example applies (MNIST's statistics)


def read_idx(path):
    """A gzipped IDX file (unsigned bytes) as a uint8 tensor of its shape."""
    with gzip.open(path, "rb") as f:
        magic = f.read(4)
        if magic[:3] != b"\0\0\x08":
            raise ValueError("%s: not an IDX file of unsigned bytes" % path)
        dims = struct.unpack(">" + "I" * magic[3], f.read(4 * magic[3]))
        return torch.frombuffer(bytearray(f.read()), dtype=torch.uint8).reshape(dims)


def fashion_mnist(data_dir, train, samples=None):
    """(images as N x 1 x 28 x 28 normalized floats, labels as int64), the first `samples` of them."""
    prefix = "train" if train else "t10k"
    images = read_idx(os.path.join(data_dir, prefix + "-images-idx3-ubyte.gz"))
    labels = read_idx(os.path.join(data_dir, prefix + "-labels-idx1-ubyte.gz"))
    if samples:
        images, labels = images[:samples], labels[:samples]
    x = (images.float().div(255).unsqueeze(1) - MEAN) / STD
    return torch.utils.data.TensorDataset(x, labels.long())


class Net(torch.nn.Module):
    """Two convolutions and two linear layers, as in Horovod's example."""

    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = torch.nn.Conv2d(10, 20, kernel_size=5)
        self.conv2_drop = torch.nn.Dropout2d()
        self.fc1 = torch.nn.Linear(320, 50)
        self.fc2 = torch.nn.Linear(50, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = F.relu(self.fc1(x.flatten(1)))
        x = F.dropout(x, training=self.training)
        return F.log_softmax(self.fc2(x), dim=1)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=int, default=64, help="per-rank training batch (64)")
    p.add_argument("--test-batch-size", type=int, default=1000, help="per-rank test batch (1000)")
    p.add_argument("--epochs", type=int, default=10, help="epochs (10)")
    p.add_argument("--lr", type=float, default=0.01, help="learning rate at p = 1, scaled by p (0.01)")
    p.add_argument("--momentum", type=float, default=0.5, help="SGD momentum (0.5)")
    p.add_argument("--seed", type=int, default=42, help="random seed (42)")
    p.add_argument("--log-interval", type=int, default=10, help="batches between progress lines (10)")
    p.add_argument("--fp16-allreduce", action="store_true", help="send gradients as float16")
    p.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist",
                   help="directory of the gzipped IDX files (Debian's dataset-fashion-mnist)")
    p.add_argument("--train-samples", type=int, default=0, help="train on the first N samples only (0: all)")
    p.add_argument("--test-samples", type=int, default=0, help="test on the first N samples only (0: all)")
    return p.parse_args()


def main():
    args = parse_args()
    hvd.init()
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)  # one core per rank

    train_set = fashion_mnist(args.data_dir, True, args.train_samples)
    test_set = fashion_mnist(args.data_dir, False, args.test_samples)
    # Each rank trains and tests on its own part of the data.
    train_sampler = torch.utils.data.distributed.DistributedSampler(train_set, num_replicas=hvd.size(),
                                                                    rank=hvd.rank())
    train_loader = torch.utils.data.DataLoader(train_set, batch_size=args.batch_size, sampler=train_sampler)
    test_sampler = torch.utils.data.distributed.DistributedSampler(test_set, num_replicas=hvd.size(),
                                                                   rank=hvd.rank())
    test_loader = torch.utils.data.DataLoader(test_set, batch_size=args.test_batch_size, sampler=test_sampler)

    model = Net()
    # p ranks take p times the samples per step: the learning rate grows with them.
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=args.momentum)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression, op=hvd.Average)

    for epoch in range(1, args.epochs + 1):
        model.train()
        train_sampler.set_epoch(epoch)  # another shuffle every epoch, the same on every rank
        for batch, (data, target) in enumerate(train_loader):
            optimizer.zero_grad()
            loss = F.nll_loss(model(data), target)
            loss.backward()
            optimizer.step()
            if batch % args.log_interval == 0:
                print("Train Epoch: {} [{}/{} ({:.0f}%)]\tLoss: {:.6f}".format(
                    epoch, batch * len(data), len(train_sampler), 100.0 * batch / len(train_loader), loss.item()))
        test(model, test_loader, test_sampler)


def test(model, loader, sampler):
    """Prints (on rank 0) the loss and accuracy over the test set, averaged over the ranks."""
    model.eval()
    loss, correct = 0.0, 0.0
    with torch.no_grad():
        for data, target in loader:
            output = model(data)
            loss += F.nll_loss(output, target, reduction="sum").item()
            correct += output.argmax(dim=1).eq(target).sum().item()
    loss = hvd.allreduce(torch.tensor(loss / len(sampler)), name="avg_loss").item()
    accuracy = hvd.allreduce(torch.tensor(correct / len(sampler)), name="avg_accuracy").item()
    if hvd.rank() == 0:
        print("\nTest set: Average loss: {:.4f}, Accuracy: {:.2f}%\n".format(loss, 100.0 * accuracy))


if __name__ == "__main__":
    main()
