"""hvd.elastic.ElasticSampler in one process (no launcher: hvd.init() alone is a job of one rank).
The partition over other sizes is checked by giving the sampler the world (size, rank) it
partitions over (elastic._world), and TorchState's union of the ranks' processed indices by
giving it the other ranks' part of the allgather (elastic.allgather_object).

Run: PYTHONPATH=build/python python3 tests/python/horovod/elastic_sampler_test.py
"""

import math
import unittest
from unittest import mock

import torch

import tutti.horovod.torch as hvd
from tutti.horovod.torch import elastic

torch.set_num_threads(1)
hvd.init()


def world(size, rank):
    return mock.patch.object(elastic, "_world", lambda: (size, rank))


def parts(dataset, size, state=None, **kwargs):
    """Every rank's sampler (and its indices) for a world of `size`, from `state` if given."""
    samplers = []
    for rank in range(size):
        with world(size, rank):
            sampler = hvd.elastic.ElasticSampler(dataset, **kwargs)
            if state is not None:
                sampler.load_state_dict(state)
        samplers.append(sampler)
    return samplers


class Partition(unittest.TestCase):
    def check_partition(self, samplers, processed=()):
        """Every unprocessed index in exactly one rank's part, except Horovod's padding: the
        remaining order's first (total_size - remaining) indices once more."""
        first = samplers[0]
        remaining = first.remaining_indices
        size = len(samplers)
        self.assertEqual(sorted(remaining), sorted(set(range(len(first.dataset))) - set(processed)))
        count = math.ceil(len(remaining) / size)
        for rank, sampler in enumerate(samplers):
            self.assertEqual((sampler.num_replicas, sampler.rank), (size, rank))
            self.assertEqual(sampler.remaining_indices, remaining)  # the same order on every rank
            self.assertEqual(len(sampler), count)
            self.assertEqual(list(sampler), sampler.indices)
            self.assertEqual(len(list(sampler)), count)
        # Rank r takes positions r, r + size, ... of the padded order.
        taken = [None] * (count * size)
        for rank, sampler in enumerate(samplers):
            taken[rank::size] = list(sampler)
        padding = count * size - len(remaining)
        self.assertLess(padding, size if remaining else 1)
        if remaining:
            cycle = (remaining * size)[:padding]
            self.assertEqual(taken, remaining + cycle)
        else:
            self.assertEqual(taken, [])

    def test_every_size(self):
        for n in (0, 1, 2, 3, 7, 10, 11, 64):
            for size in (1, 2, 3, 4, 5):
                for shuffle in (False, True):
                    with self.subTest(n=n, size=size, shuffle=shuffle):
                        samplers = parts(list(range(n)), size, shuffle=shuffle)
                        self.check_partition(samplers)
                        if not shuffle:
                            self.assertEqual(samplers[0].remaining_indices, list(range(n)))

    def test_order(self):
        data = list(range(50))
        a, b = parts(data, 1, seed=7)[0], parts(data, 1, seed=7)[0]
        self.assertEqual(list(a), list(b))
        self.assertEqual(sorted(a), data)
        self.assertNotEqual(list(a), data)
        self.assertNotEqual(list(a), list(parts(data, 1, seed=8)[0]))
        order0 = list(a)
        with world(1, 0):
            a.set_epoch(1)
        self.assertNotEqual(list(a), order0)  # seed + epoch
        with world(1, 0):
            b.set_epoch(1)
        self.assertEqual(list(a), list(b))
        for seed in (-1, 2 ** 70):  # any integer
            self.assertEqual(sorted(parts(data, 1, seed=seed)[0]), data)

    def test_repartition_after_records(self):
        data = list(range(23))
        samplers = parts(data, 3, seed=3)
        processed = set()
        for sampler in samplers:
            for batch in range(2):
                with world(sampler.num_replicas, sampler.rank):
                    sampler.record_batch(batch, 2)  # 4 samples per rank, 12 in all
                processed.update(sampler.get_indices(batch, 2))
        self.assertEqual(len(processed), 12)
        union = set().union(*(s.state_dict()["processed_indices"] for s in samplers))
        self.assertEqual(union, processed)
        # 11 left, over 2 ranks: 6 each, one of them padding; then over 4: 3 each.
        for size in (2, 4, 1):
            again = parts(data, size, state={"epoch": 0, "processed_indices": union}, seed=3)
            self.check_partition(again, processed)
            self.assertFalse(processed & set().union(*(set(s) for s in again)))
            # The remaining indices keep the epoch's order.
            self.assertEqual(again[0].remaining_indices, [i for i in samplers[0].remaining_indices
                                                         if i not in processed])
        # A new epoch forgets the processed indices.
        sampler = again[0]
        with world(1, 0):
            sampler.set_epoch(1)
        self.assertEqual(sampler.processed_indices, set())
        self.assertEqual(sorted(sampler), data)

    def test_state_dict(self):
        sampler = parts(list(range(9)), 1)[0]
        with world(1, 0):
            sampler.set_epoch(2)
            sampler.record_indices(torch.tensor([3, 5]))
            sampler.record_indices([5, 8])
        state = sampler.state_dict()
        self.assertEqual(state, {"epoch": 2, "processed_indices": {3, 5, 8}})
        state["processed_indices"].add(0)  # a copy
        self.assertEqual(sampler.processed_indices, {3, 5, 8})
        other = parts(list(range(9)), 1, state=sampler.state_dict())[0]
        self.assertEqual((other.epoch, other.processed_indices), (2, {3, 5, 8}))
        # record_indices does not change the partition; the next reset leaves them out.
        self.assertEqual(len(sampler), 9)
        self.assertEqual(list(other), [i for i in sampler.remaining_indices if i not in {3, 5, 8}])
        self.assertEqual(len(other), 6)

    def test_data_loader(self):
        n, batch = 37, 4
        dataset = torch.utils.data.TensorDataset(torch.arange(n))
        samplers = parts(dataset, 3, seed=1)
        seen = []
        for sampler in samplers:
            self.assertIsInstance(sampler, torch.utils.data.Sampler)
            loader = torch.utils.data.DataLoader(dataset, batch_size=batch, sampler=sampler)
            self.assertEqual(len(loader), math.ceil(len(sampler) / batch))
            for batch_idx, (indices,) in enumerate(loader):
                self.assertEqual(indices.tolist(), sampler.get_indices(batch_idx, batch))
                sampler.record_batch(batch_idx, batch)
                seen += indices.tolist()
            self.assertEqual(sampler.processed_indices, set(sampler.indices))
        self.assertEqual(len(seen), 39)  # 13 per rank: 2 padded
        self.assertEqual(set(seen), set(range(n)))


class Errors(unittest.TestCase):
    def setUp(self):
        self.sampler = hvd.elastic.ElasticSampler(list(range(10)), shuffle=False)

    def test_record_batch(self):
        s = self.sampler
        for args, error, text in (((-1, 4), ValueError, "batch_idx: expected an integer >= 0, got -1"),
                                  ((0, -2), ValueError, "batch_size: expected an integer >= 1, got -2"),
                                  ((0, 0), ValueError, "batch_size: expected an integer >= 1, got 0"),
                                  ((1.5, 2), TypeError, "batch_idx: expected an integer, got float"),
                                  ((True, 2), TypeError, "batch_idx: expected an integer, got bool"),
                                  ((0, "4"), TypeError, "batch_size: expected an integer, got str"),
                                  ((3, 4), ValueError, "batch 3 of size 4 starts at 12, past this rank's 10")):
            with self.subTest(args=args):
                with self.assertRaisesRegex(error, text):
                    s.record_batch(*args)
        self.assertEqual(s.processed_indices, set())
        s.record_batch(2, 4)  # the last, shorter batch
        self.assertEqual(s.processed_indices, {8, 9})

    def test_record_indices(self):
        s = self.sampler
        for indices, error, text in (([10], ValueError, "index 10 is outside the dataset \\(0 to 9\\)"),
                                     ([-1], ValueError, "index -1 is outside"),
                                     (["a"], TypeError, "expected int indices, got str"),
                                     ([1.0], TypeError, "expected int indices, got float"),
                                     (5, TypeError, "expected indices \\(an iterable of ints\\), got int"),
                                     (torch.tensor([1.0]), TypeError, "got a torch.float32 tensor")):
            with self.subTest(indices=indices):
                with self.assertRaisesRegex(error, text):
                    s.record_indices(indices)
        self.assertEqual(s.processed_indices, set())  # nothing recorded from a refused call

    def test_other(self):
        s = self.sampler
        with self.assertRaisesRegex(ValueError, "set_epoch: epoch: expected an integer >= 0, got -1"):
            s.set_epoch(-1)
        with self.assertRaisesRegex(TypeError, "set_epoch: epoch: expected an integer, got str"):
            s.set_epoch("1")
        with self.assertRaisesRegex(ValueError, "expected a dict with 'epoch' and 'processed_indices'"):
            s.load_state_dict({"epoch": 1})
        with self.assertRaisesRegex(ValueError, "index 12 is outside"):
            s.load_state_dict({"epoch": 1, "processed_indices": {12}})
        with self.assertRaisesRegex(TypeError, "the dataset has no len\\(\\) \\(object\\)"):
            hvd.elastic.ElasticSampler(object())
        with self.assertRaisesRegex(TypeError, "shuffle: expected a bool, got str"):
            hvd.elastic.ElasticSampler([1], shuffle="yes")
        with self.assertRaisesRegex(TypeError, "seed: expected an integer, got float"):
            hvd.elastic.ElasticSampler([1], seed=0.5)


class InTorchState(unittest.TestCase):
    def setUp(self):
        self.model = torch.nn.Linear(2, 1)
        self.sampler = hvd.elastic.ElasticSampler(list(range(12)), seed=5)
        self.state = hvd.elastic.TorchState(self.model, None, sampler=self.sampler, epoch=0)

    def test_save_restore_sync(self):
        state, s = self.state, self.sampler
        self.assertIs(state.sampler, s)
        self.assertNotIn("sampler", state._saved_state)  # not deep-copied with the other attributes
        s.record_batch(0, 5)
        first = set(s.get_indices(0, 5))
        state.save()
        s.record_batch(1, 5)
        self.assertEqual(len(s.processed_indices), 10)
        state.restore()  # back to the commit, and partitioned again
        self.assertEqual(s.processed_indices, first)
        self.assertEqual(len(s), 7)
        self.assertFalse(first & set(s))
        state.sync()  # one rank: its own state
        self.assertEqual(s.processed_indices, first)
        self.assertEqual(sorted(set(s) | first), list(range(12)))

    def test_on_reset_partitions_for_the_new_world(self):
        state, s = self.state, self.sampler
        s.record_batch(0, 4)
        state.save()
        with world(3, 2):
            state.on_reset()
        self.assertEqual((s.num_replicas, s.rank, len(s)), (3, 2, 3))
        self.assertEqual(list(s), (s.remaining_indices + s.remaining_indices[:1])[2::3])  # one padded
        with world(1, 0):
            state.on_reset()
        self.assertEqual((s.num_replicas, s.rank, len(s)), (1, 0, 8))

    def test_union_of_the_ranks(self):
        """save() unions what every rank processed since the last commit; sync() unions every
        rank's processed indices at rank 0's epoch (a joiner's fresh sampler adds nothing)."""
        state, s = self.state, self.sampler
        s.record_indices([0, 1])
        sent = []

        def gather_save(obj, name=None, process_set=None):
            sent.append((name, obj))
            epoch, mark, indices = obj
            return [obj, (epoch, mark, [7, 8]), (epoch, mark, [1, 11])]

        with mock.patch.object(elastic, "allgather_object", gather_save):
            state.save()
        self.assertEqual(sent, [("elastic.sampler.sampler.save", (0, (0, 0, 0), [0, 1]))])
        self.assertEqual(s.processed_indices, {0, 1, 7, 8, 11})
        s.record_indices([2])
        sent.clear()
        with mock.patch.object(elastic, "allgather_object", gather_save):
            state.save()  # only what is new since the commit is sent
        self.assertEqual(sent[0][1][2], [2])
        self.assertEqual(s.processed_indices, {0, 1, 2, 7, 8, 11})
        s.record_indices([3])
        state.restore()
        self.assertEqual(s.processed_indices, {0, 1, 2, 7, 8, 11})

        def gather_sync(obj, name=None, process_set=None):
            length, shuffle, seed, epoch, indices = obj
            return [obj, (length, shuffle, seed, epoch, [4]), (length, shuffle, seed, epoch + 1, [5])]

        with mock.patch.object(elastic, "allgather_object", gather_sync):
            state.sync()
        self.assertEqual(s.processed_indices, {0, 1, 2, 4, 7, 8, 11})
        self.assertEqual(len(s), 5)

        def gather_other_epoch(obj, name=None, process_set=None):
            epoch, mark, indices = obj
            return [obj, (epoch + 1, mark, [])]

        with mock.patch.object(elastic, "allgather_object", gather_other_epoch):
            with self.assertRaisesRegex(ValueError, "TorchState.sampler: the ranks' ElasticSamplers are at "
                                                    "different epochs \\(0, 1\\) at commit"):
                state.save()

        def gather_other_seed(obj, name=None, process_set=None):
            length, shuffle, seed, epoch, indices = obj
            return [obj, (length, shuffle, seed + 1, epoch, [])]

        with mock.patch.object(elastic, "allgather_object", gather_other_seed):
            with self.assertRaisesRegex(ValueError, "rank 1's ElasticSampler has len\\(dataset\\) 12, shuffle "
                                                    "True, seed 6; rank 0's 12, True, 5"):
                state.sync()

    def test_marks_differ(self):
        """Ranks whose last commits differ send everything."""
        state, s = self.state, self.sampler
        s.record_indices([0])
        names = []

        def gather(obj, name=None, process_set=None):
            names.append(name)
            epoch, mark, indices = obj
            if mark is None:
                return [obj, (epoch, None, [6, 9])]
            return [obj, (epoch, (epoch, 1, 3), [])]

        with mock.patch.object(elastic, "allgather_object", gather):
            state.save()
        self.assertEqual(names, ["elastic.sampler.sampler.save", "elastic.sampler.sampler.save_all"])
        self.assertEqual(s.processed_indices, {0, 6, 9})

    def test_replace(self):
        state = self.state
        other = hvd.elastic.ElasticSampler(list(range(4)))
        state.sampler = other
        self.assertIs(state.sampler, other)
        other.record_indices([1])
        state.save()
        other.record_indices([2])
        state.restore()
        self.assertEqual(other.processed_indices, {1})
        with self.assertRaisesRegex(TypeError, "TorchState.sampler holds an ElasticSampler; got list"):
            state.sampler = [1, 2]


if __name__ == "__main__":
    unittest.main(verbosity=2)
