"""Accesses to private attributes of torch and mmengine, and the methods vitdense replaces on
one object of theirs, one function each.

Each function names the one private attribute it touches, or the method it replaces, and why
no public way exists; each checks the attribute is there and, if a release has removed it,
raises :class:`InternalsChanged` naming the attribute and the versions installed, instead of
an ``AttributeError`` deep in a training loop. A replaced method is replaced on the one
object only, and the function returns what puts the object's own back.
``tests/test_internals.py`` checks every access and replacement against the installed torch
and mmengine (and what vitdense assumes of them), so an upgrade that breaks one fails there
first, by name.
"""
from __future__ import annotations

from typing import Any, Callable

import mmengine
import torch
from mmengine.runner.checkpoint import CheckpointLoader
from torch.utils.data import DataLoader, Sampler
from torch.utils.data.dataloader import _MultiProcessingDataLoaderIter

#: the releases these accesses were checked with
WRITTEN_FOR = 'torch 2.14, mmengine 0.10'


class InternalsChanged(AttributeError):
    """A private attribute vitdense relies on is gone from the installed torch or mmengine."""

    def __init__(self, owner: Any, name: str) -> None:
        where = owner if isinstance(owner, type) else type(owner)
        super().__init__(
            f'vitdense relies on {where.__module__}.{where.__qualname__}.{name}, which the '
            f'installed torch {torch.__version__} / mmengine {mmengine.__version__} do not '
            f'have (written for {WRITTEN_FOR}); install those versions '
            '(requirements/constraints.txt) or report it to vitdense')


def _require(owner: Any, name: str) -> None:
    """Raise :class:`InternalsChanged` unless ``owner`` has attribute ``name``."""
    if not hasattr(owner, name):
        raise InternalsChanged(owner, name)


def checkpoint_schemes() -> dict[str, Callable]:
    """A copy of mmengine's checkpoint loaders by prefix (``CheckpointLoader._schemes``):
    mmengine registers loaders publicly but offers no way to list them, which replacing
    each one (safe loading) and registering them back need."""
    _require(CheckpointLoader, '_schemes')
    return dict(CheckpointLoader._schemes)


def checkpoint_loader_for(filename: str) -> Callable:
    """The loader mmengine would use for ``filename``
    (``CheckpointLoader._get_checkpoint_loader``: the prefix matching is mmengine's own)."""
    _require(CheckpointLoader, '_get_checkpoint_loader')
    return CheckpointLoader._get_checkpoint_loader(filename)


def drop_loader_workers(loader: DataLoader) -> None:
    """Let go of the iterator a persistent loader keeps (``DataLoader._iterator``), so that
    its next pass starts new workers: torch offers no public way to restart them."""
    _require(loader, '_iterator')
    loader._iterator = None


def replace_batch_sampler(loader: DataLoader, batch_sampler: Sampler) -> None:
    """Set ``loader.batch_sampler`` on a built loader, past the guard of
    ``DataLoader.__setattr__`` (torch refuses the attribute once the loader is built;
    mmengine builds the loader before a checkpoint says how to sample)."""
    _require(loader, '_DataLoader__initialized')
    object.__setattr__(loader, 'batch_sampler', batch_sampler)


def indices_of_rank(sampler: Any) -> Any:
    """A fresh index generator of mmengine's ``InfiniteSampler`` for this process
    (``InfiniteSampler._indices_of_rank``; its own ``indices`` is advanced and closed by
    the iterator it served)."""
    _require(sampler, '_indices_of_rank')
    return sampler._indices_of_rank()


def new_loop_iterator(loop: Any) -> None:
    """Give an ``IterBasedTrainLoop`` a new iterator over its loader
    (``_InfiniteDataloaderIterator._iterator``): the loop builds its first one before any
    hook runs and has no way to rebuild it."""
    _require(loop.dataloader_iterator, '_iterator')
    loop.dataloader_iterator._iterator = iter(loop.dataloader)


def set_loop_pass(loop: Any, passes: int) -> None:
    """Tell an ``IterBasedTrainLoop``'s iterator how many passes over a finite loader it has
    made (``_InfiniteDataloaderIterator._epoch``): it hands the next pass's number to the
    sampler's ``set_epoch``, and a resumed loop starts where the checkpoint stopped."""
    _require(loop.dataloader_iterator, '_epoch')
    loop.dataloader_iterator._epoch = passes


def shut_down_loader_workers(loop: Any) -> None:
    """End the worker processes of a runner loop's loader now
    (``_MultiProcessingDataLoaderIter._shutdown_workers``, of the iterator a persistent loader
    keeps, ``DataLoader._iterator``, and of an iteration loop's,
    ``_InfiniteDataloaderIterator._iterator``): torch ends them only when the iterator is
    collected, and leaves persistent ones to multiprocessing's exit handler."""
    _require(_MultiProcessingDataLoaderIter, '_shutdown_workers')
    loader = getattr(loop, 'dataloader', None)
    iterators = [getattr(loader, '_iterator', None),
                 getattr(getattr(loop, 'dataloader_iterator', None), '_iterator', None)]
    for iterator in iterators:
        if isinstance(iterator, _MultiProcessingDataLoaderIter):
            iterator._shutdown_workers()


def reducer_parameters(ddp: torch.nn.parallel.DistributedDataParallel
                       ) -> tuple[list[torch.nn.Parameter], list[bool]]:
    """The parameters of a DDP's reducer in module order and whether each expects a sparse
    gradient (``DistributedDataParallel._build_params_for_reducer``): DDP's constructor and
    ``__setstate__`` take the reducer's parameter order from this method, the one place a
    subclass can choose it; an override calls this for DDP's own list."""
    _require(torch.nn.parallel.DistributedDataParallel, '_build_params_for_reducer')
    return torch.nn.parallel.DistributedDataParallel._build_params_for_reducer(ddp)


def bucket_in_parameter_order(ddp: torch.nn.parallel.DistributedDataParallel) -> None:
    """Have a DDP regroup its gradient buckets at its next forward, in the order of its
    reducer's parameters (``Reducer._push_all_rebuilt_params``, what torch's join hook calls
    for a process that has run out of data). DDP otherwise keeps one bucket in the first
    iteration and regroups after it, in the order the gradients became ready; it regroups
    once either way, so this way every iteration of a run, the first included, has one
    layout. A no-op where DDP never regroups (``find_unused_parameters=True`` without
    ``static_graph``)."""
    _require(ddp.reducer, '_push_all_rebuilt_params')
    ddp.reducer._push_all_rebuilt_params()


#: no attribute of the instance's own (:func:`_replace_method`)
_NOTHING = object()


def _replace_method(obj: Any, name: str, method: Callable) -> Callable[[], None]:
    """Set ``method`` as attribute ``name`` of the instance ``obj``, where Python looks before
    the class; return what puts back the instance's own attribute, or removes ours."""
    own = vars(obj).get(name, _NOTHING)
    setattr(obj, name, method)

    def put_back() -> None:
        if vars(obj).get(name) is method:
            if own is _NOTHING:
                delattr(obj, name)
            else:
                setattr(obj, name, own)
    return put_back


def load_batches_with(dataset: Any, fetch: Callable[[list], list]) -> Callable[[], None]:
    """Have torch's loaders load each batch of ``dataset`` with ``fetch`` (the batch
    sampler's index list in, the samples out), in the training process and in loader
    workers alike; returns what puts the dataset's own loading back.

    ``fetch`` becomes the ``__getitems__`` of this dataset object, which torch's map-style
    fetcher calls, where a dataset has it, with the very list the batch sampler handed out
    (in a worker, its pickled copy). torch has no public per-batch loading hook:
    ``worker_init_fn`` runs once per worker, ``collate_fn`` after the samples are loaded,
    and a built loader refuses a new ``dataset``, which a wrapper would need (and hooks that
    change the dataset's pipeline would then change the wrapper's). ``fetch`` loads the
    samples itself, with the ``__getitems__`` the dataset had if it had one."""
    return _replace_method(dataset, '__getitems__', fetch)


def before_every_save(runner: Any, before: Callable[[], None]) -> Callable[[], None]:
    """Have every process call ``before`` as it enters ``runner.save_checkpoint``, before the
    save itself; returns what puts the runner's own method back.

    mmengine's ``Runner.save_checkpoint`` is ``master_only``: on every process but 0 it
    returns at once, and the hook it calls, ``before_save_checkpoint``, runs on process 0
    only, so no hook runs on every process at a save. Every saver calls the method on every
    process (``CheckpointHook``'s interval, last and best saves, vitdense's saves on a stop
    signal or a spent time budget), so it is replaced on this runner by one that calls
    ``before`` first: the one place where a collective (gathering every process's random
    state) runs at every save, whichever saver made it."""
    save = runner.save_checkpoint

    def save_after_before(*args: Any, **kwargs: Any) -> Any:
        before()
        return save(*args, **kwargs)
    return _replace_method(runner, 'save_checkpoint', save_after_before)
