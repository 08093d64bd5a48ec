"""vitdense/internals.py against the installed torch and mmengine: each private attribute is
there and behaves as vitdense assumes, and a missing one is named in the error."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from mmengine.dataset import InfiniteSampler
from mmengine.dist import utils as mmengine_dist_utils
from mmengine.runner import Runner
from mmengine.runner import checkpoint as mmengine_checkpoint
from mmengine.runner import loops as mmengine_loops
from mmengine.runner.checkpoint import CheckpointLoader
from mmengine.runner.loops import _InfiniteDataloaderIterator
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import BatchSampler, DataLoader, Dataset, SequentialSampler

from vitdense.internals import (InternalsChanged, before_every_save, bucket_in_parameter_order,
                                checkpoint_loader_for, checkpoint_schemes, drop_loader_workers,
                                indices_of_rank, load_batches_with, new_loop_iterator,
                                reducer_parameters, replace_batch_sampler, set_loop_pass,
                                shut_down_loader_workers)

from common import bucket_layouts


@pytest.fixture
def mmengines_loaders(monkeypatch):
    """mmengine's own checkpoint loaders for the test's while, whatever this process
    registered before (safe loading replaces them)."""
    monkeypatch.setattr(CheckpointLoader, '_schemes', {})
    for prefixes, loader in (('', mmengine_checkpoint.load_from_local),
                             (['http://', 'https://'], mmengine_checkpoint.load_from_http),
                             ('s3://', mmengine_checkpoint.load_from_ceph)):
        CheckpointLoader.register_scheme(prefixes, loader)


def test_checkpoint_schemes_lists_every_registered_loader_as_a_copy(mmengines_loaders):
    schemes = checkpoint_schemes()
    assert schemes[''] is mmengine_checkpoint.load_from_local
    assert schemes['https://'] is mmengine_checkpoint.load_from_http
    schemes.clear()
    assert checkpoint_schemes()  # a copy: mmengine's table is untouched


def test_checkpoint_loader_for_matches_mmengines_prefixes(mmengines_loaders):
    assert checkpoint_loader_for('work/iter_2.pth') is mmengine_checkpoint.load_from_local
    assert checkpoint_loader_for('https://x/a.pth') is mmengine_checkpoint.load_from_http
    assert checkpoint_loader_for('s3://b/a.pth') is mmengine_checkpoint.load_from_ceph


def test_drop_loader_workers_makes_a_persistent_loader_start_new_ones():
    loader = DataLoader(list(range(4)), batch_size=2, num_workers=1, persistent_workers=True)
    assert [b.tolist() for b in loader] == [[0, 1], [2, 3]]
    assert loader._iterator is not None  # where a persistent loader keeps its workers
    drop_loader_workers(loader)
    assert loader._iterator is None
    assert [b.tolist() for b in loader] == [[0, 1], [2, 3]]


def test_replace_batch_sampler_passes_torchs_guard():
    loader = DataLoader(list(range(4)), batch_size=2)
    reversed_pairs = [[3, 2], [1, 0]]
    with pytest.raises(ValueError, match='batch_sampler attribute should not be set'):
        loader.batch_sampler = reversed_pairs  # torch still refuses it publicly
    replace_batch_sampler(loader, reversed_pairs)
    assert [b.tolist() for b in loader] == reversed_pairs


def test_indices_of_rank_is_a_fresh_generator_from_the_start():
    sampler = InfiniteSampler(list(range(3)), shuffle=False)
    first = iter(sampler)
    assert [next(first) for _ in range(4)] == [0, 1, 2, 0]
    fresh = indices_of_rank(sampler)
    assert [next(fresh) for _ in range(4)] == [0, 1, 2, 0]


def test_new_loop_iterator_starts_the_loader_over():
    loader = DataLoader(list(range(4)), batch_sampler=BatchSampler(
        SequentialSampler(range(4)), batch_size=2, drop_last=False))
    loop = SimpleNamespace(dataloader=loader,
                           dataloader_iterator=_InfiniteDataloaderIterator(loader))
    assert next(loop.dataloader_iterator).tolist() == [0, 1]
    new_loop_iterator(loop)
    assert next(loop.dataloader_iterator).tolist() == [0, 1]


def test_set_loop_pass_numbers_the_next_pass(monkeypatch):
    monkeypatch.setattr(mmengine_loops.time, 'sleep', lambda seconds: None)
    told = []
    batches = DataLoader(list(range(2)), batch_size=2)
    batches.sampler.set_epoch = told.append  # a sampler that takes pass numbers
    iterator = _InfiniteDataloaderIterator(batches)
    set_loop_pass(SimpleNamespace(dataloader=batches, dataloader_iterator=iterator), 3)
    next(iterator), next(iterator)  # the end of a pass: mmengine numbers the next one
    assert told == [4]


def test_shut_down_loader_workers_ends_a_persistent_loaders_workers():
    loader = DataLoader(list(range(4)), batch_size=2, num_workers=1, persistent_workers=True)
    assert [b.tolist() for b in loader] == [[0, 1], [2, 3]]
    workers = loader._iterator._workers
    assert all(worker.is_alive() for worker in workers)
    shut_down_loader_workers(SimpleNamespace(dataloader=loader))
    assert not any(worker.is_alive() for worker in workers)


class _Squares(Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> int:
        return i * i


class _TaggedIndices(list):
    """A batch's indices with a tag, as vitdense's seeded batch sampler hands them out."""

    tag: str


def _tagged(indices: list[int], tag: str) -> _TaggedIndices:
    batch = _TaggedIndices(indices)
    batch.tag = tag
    return batch


@pytest.mark.parametrize('workers', [0, 1])
def test_load_batches_with_is_what_torchs_loader_loads_each_batch_with(workers):
    dataset = _Squares()
    loader = DataLoader(dataset, batch_sampler=[_tagged([0, 1], 'a'), _tagged([3], 'b')],
                        num_workers=workers, collate_fn=list)
    put_back = load_batches_with(
        dataset, lambda indices: [f'{indices.tag}{dataset[i]}' for i in indices])
    assert list(loader) == [['a0', 'a1'], ['b9']], (
        "torch's loader no longer loads a batch with the dataset's __getitems__, called with "
        'the list the batch sampler handed out')
    put_back()
    assert '__getitems__' not in vars(dataset)
    assert list(loader) == [[0, 1], [9]]


class _Saves:
    """What a runner's ``save_checkpoint`` was called with, in order."""

    def __init__(self) -> None:
        self.calls: list = []

    def save_checkpoint(self, *args, **kwargs) -> None:
        self.calls.append(('save', args, kwargs))


def test_before_every_save_runs_first_on_every_call_until_put_back():
    runner = _Saves()
    put_back = before_every_save(runner, lambda: runner.calls.append('before'))
    runner.save_checkpoint('out', 'iter_2.pth', meta=dict(iter=2))
    assert runner.calls == ['before', ('save', ('out', 'iter_2.pth'), {'meta': {'iter': 2}})]
    put_back()
    assert 'save_checkpoint' not in vars(runner)
    runner.save_checkpoint('out', 'iter_3.pth')
    assert runner.calls[1:] == [('save', ('out', 'iter_2.pth'), {'meta': {'iter': 2}}),
                                ('save', ('out', 'iter_3.pth'), {})]


class _NoRunner:
    def __getattr__(self, name: str):
        raise AssertionError(f"mmengine's Runner.save_checkpoint ran on process 1 (read {name}): "
                             'every process reaches its hooks, and before_every_save is '
                             'not needed any more')


def test_runner_save_checkpoint_returns_at_once_on_other_processes(monkeypatch):
    # why before_every_save exists: no part of mmengine's save runs on a process but 0
    monkeypatch.setattr(mmengine_dist_utils, 'get_rank', lambda group=None: 1)
    assert Runner.save_checkpoint(_NoRunner(), 'out', 'iter_2.pth') is None


def test_a_missing_attribute_is_named_with_the_versions():
    with pytest.raises(InternalsChanged, match=r'relies on types\.SimpleNamespace\._iterator, '
                                               r'which the installed torch .* do not have'):
        drop_loader_workers(SimpleNamespace())


@pytest.fixture
def one_process_group(tmp_path):
    dist.init_process_group('gloo', init_method=f'file://{tmp_path}/pg', rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _layers() -> nn.Module:
    """Four 256 x 256 layers: 1 MiB of gradients."""
    return nn.Sequential(*[nn.Linear(256, 256) for _ in range(4)])


class LastFirst(DistributedDataParallel):
    def _build_params_for_reducer(self):
        parameters, expects_sparse_gradient = reducer_parameters(self)
        return parameters[::-1], expects_sparse_gradient[::-1]


def test_reducer_parameters_are_in_module_order_and_order_the_reducer(one_process_group):
    model = _layers()
    parameters, expects_sparse_gradient = reducer_parameters(DistributedDataParallel(model))
    assert parameters == list(model.parameters()) and expects_sparse_gradient == [False] * 8
    # DDP's first iteration reduces one bucket, in the order the override chose
    first_bucket = bucket_layouts(LastFirst(_layers()), torch.randn(2, 256), iterations=1)[0]
    assert first_bucket == [[name for name, _ in reversed(list(model.named_parameters()))]]


def test_bucket_in_parameter_order_regroups_before_the_first_backward(one_process_group):
    names = [name for name, _ in _layers().named_parameters()]
    plain = bucket_layouts(DistributedDataParallel(_layers(), bucket_cap_mb=0.25),
                           torch.randn(2, 256), iterations=2)
    assert plain[0] == [names] and plain[1] != plain[0]  # one bucket, then regrouped
    ddp = DistributedDataParallel(_layers(), bucket_cap_mb=0.25)
    bucket_in_parameter_order(ddp)
    layouts = bucket_layouts(ddp, torch.randn(2, 256), iterations=3)
    assert layouts[0] == layouts[1] == layouts[2] and len(layouts[0]) > 1
    assert sum(layouts[0], []) == names  # in the reducer's (module) order
