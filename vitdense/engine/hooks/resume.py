"""Resuming a run exactly where it stopped (which checkpoint it resumes:
:mod:`vitdense.engine.resume_choice`).

mmengine's resume restores the weights, optimizer, schedulers, message hub and iteration
count, but not the random streams: a resumed run draws other dropout masks, augmentations
and proposal samples than the uninterrupted one and its losses drift apart (by ~1e-3 within
a few iterations on the demo configs). :class:`ExactResumeHook` stores the state of
python's, numpy's and torch's generators in every checkpoint and puts it back at the moment
the uninterrupted run would draw the next training batch (the batches already trained are
passed over without loading them), so with deterministic kernels a resumed run repeats the
uninterrupted one bit for bit. The training loader draws nothing from those generators: each
batch is loaded from a seed of its own (:class:`_SeededBatches`), in a worker or in the
training process alike, and its iterators' seeds come from a generator of the loader's own.
So the run is the same whatever the loader's ``num_workers`` and ``persistent_workers``,
and a run resumed with other ones repeats it too.

torchdata's ``StatefulDataLoader`` (0.11.0, with torch 2.14 and mmengine 0.10.7) cannot
replace this. Its state holds the sampler's place and each worker's dataset state, not the
workers' generators: saved after 5 batches of a pass with 2 workers (persistent or not,
under mmengine's ``DefaultSampler`` and ``InfiniteSampler``) and loaded into a new loader, it
hands out the same indices but other augmentations, each worker drawing again from its
start-of-pass seed; only without workers, the training process's generators restored, are
they equal. A changed ``num_workers`` (2 to 3, 2 to 0) is refused by a bare ``assert``,
which ``python -O`` strips. mmengine's ``Runner.build_dataloader`` builds torch's
``DataLoader`` whatever the config says (a ``type`` key reaches it as a keyword and is
refused), and its loops take their first iterator before the checkpoint is loaded. What it
does for a sampler without a state (passing over index lists) is :class:`_ResumedBatches`;
exactness comes from the per-batch seeds, which need no loader state.
"""
from __future__ import annotations

import itertools
import logging
import random
from typing import Any, Callable, Iterator

import numpy as np
import torch
from mmengine.dist import all_gather_object, get_rank, get_world_size
from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.dataset import InfiniteSampler
from mmengine.runner import EpochBasedTrainLoop, IterBasedTrainLoop
from torch.utils.data import DataLoader, get_worker_info

from vitdense.checkpoint_io import from_plain, to_plain
from vitdense.internals import (before_every_save, drop_loader_workers, indices_of_rank,
                                load_batches_with, new_loop_iterator, replace_batch_sampler,
                                set_loop_pass)
from vitdense.registry import HOOKS

RNG_KEY = 'rng_state'
PER_RANK_KEY = 'rng_state_per_rank'  # multi-process runs: every process's state, by rank


def rng_state() -> dict:
    """The state of every generator a training step draws from (python, numpy, torch)."""
    state = dict(python=random.getstate(), numpy=np.random.get_state(),
                 torch=torch.get_rng_state())
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state['cuda'] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    """Restore what :func:`rng_state` returned."""
    random.setstate(_as_tuple(state['python']))
    np.random.set_state(_as_tuple(state['numpy']))
    torch.set_rng_state(state['torch'])
    if 'cuda' in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state['cuda'])


def _as_tuple(value: Any) -> Any:
    """Nested lists back to the tuples ``random.setstate`` insists on."""
    return tuple(_as_tuple(v) for v in value) if isinstance(value, (list, tuple)) else value


class _AlreadyAdvanced:
    """A data iterator whose first ``skip`` ``next`` calls return nothing.

    ``IterBasedTrainLoop.run`` advances its data iterator by the resumed iteration count
    (loading every batch already trained); :class:`ExactResumeHook` has made the loader pass
    over those batches without loading them, so these calls are answered here.
    """

    def __init__(self, iterator: Iterator, skip: int) -> None:
        self.iterator = iterator
        self.skip = skip

    def __iter__(self) -> '_AlreadyAdvanced':
        return self

    def __next__(self) -> Any:
        if self.skip > 0:
            self.skip -= 1
            return None
        return next(self.iterator)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.iterator, name)


class _ResumedBatches:
    """A loader's batch sampler whose first pass drops its first ``skip`` batches of indices
    (no sample of them is loaded) and calls ``before_first_batch`` just before it hands out
    the first batch to load; later passes are the sampler's own.

    Batches are skipped as index lists, after the batch sampler, so samplers that group
    samples into batches (mmdet's aspect-ratio batches) skip exactly the batches trained.
    """

    def __init__(self, batch_sampler: Any, skip: int,
                 before_first_batch: Callable[[], None]) -> None:
        self.batch_sampler = batch_sampler
        self.skip: int | None = skip
        self.before_first_batch = before_first_batch

    def __iter__(self) -> Iterator[list]:
        batches = iter(self.batch_sampler)
        if self.skip is not None:
            skip, self.skip = self.skip, None
            for _ in itertools.islice(batches, skip):
                pass
            self.before_first_batch()
        yield from batches

    def __len__(self) -> int:
        return len(self.batch_sampler)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.batch_sampler, name)


class _SeededIndices(list):
    """A batch's sample indices and the key of the seed a loader worker loads it with."""

    seed_key: tuple[int, int, int, int]


class _SeededBatches:
    """A loader's batch sampler that hands out each batch's indices with a seed key: the
    run's seed, the process's rank, the pass over the data and the batch's place in it.

    A loader worker seeds its generators from that key before it loads the batch
    (:class:`_SeededFetch`), so a batch's augmentations depend on neither the worker that
    loads it nor what that worker loaded before: a run resumed in the middle of a pass,
    whose workers start afresh, draws what the uninterrupted run drew. ``passes`` is the
    number of the next pass (set on resume); ``unseed_dataset`` puts the dataset's own
    loading back.
    """

    def __init__(self, batch_sampler: Any, seed: int, rank: int,
                 unseed_dataset: Callable[[], None]) -> None:
        self.batch_sampler, self.seed, self.rank = batch_sampler, seed, rank
        self.unseed_dataset = unseed_dataset
        self.passes = 0

    def __iter__(self) -> Iterator[_SeededIndices]:
        number, self.passes = self.passes, self.passes + 1
        for position, indices in enumerate(self.batch_sampler):
            batch = _SeededIndices(indices)
            batch.seed_key = (self.seed, self.rank, number, position)
            yield batch

    def __len__(self) -> int:
        return len(self.batch_sampler)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.batch_sampler, name)


def batch_seed(key: tuple[int, ...]) -> int:
    """The seed a batch is loaded from: every element of its key changes it."""
    return int(np.random.SeedSequence(key).generate_state(1)[0])


class _SeededFetch:
    """How a dataset loads a batch (:func:`~vitdense.internals.load_batches_with`): seeds
    python's, numpy's and torch's generators from the batch's seed key, then loads the
    samples (with the dataset's own ``__getitems__`` if it has one). In the training
    process itself (a loader without workers) the generators are put back afterwards, so
    loading draws nothing from the training stream, as loading in a worker does not."""

    def __init__(self, dataset: Any) -> None:
        self.dataset, self.fetch = dataset, getattr(dataset, '__getitems__', None)

    def __call__(self, indices: list) -> list:
        key = getattr(indices, 'seed_key', None)
        if key is None:
            return self._load(indices)
        training_stream = rng_state() if get_worker_info() is None else None
        seed = batch_seed(key)
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)
        try:
            return self._load(indices)
        finally:
            if training_stream is not None:
                set_rng_state(training_stream)

    def _load(self, indices: list) -> list:
        return self.fetch(indices) if self.fetch else [self.dataset[i] for i in indices]


def seed_batches(loader: DataLoader, seed: int, rank: int) -> _SeededBatches | None:
    """Have ``loader`` load each batch from a seed of its own (:class:`_SeededBatches`),
    with or without workers, and draw its iterators' seeds from a generator of its own
    (seeded from ``seed`` and ``rank``), not from the training process's torch generator:
    a loader with persistent workers draws that seed once, one without at every pass, and
    a resumed run's fresh workers once more. None, and nothing changed, for a loader
    without a batch sampler. The batch sampler returned puts the dataset's own loading
    back with ``unseed_dataset``."""
    if loader.batch_sampler is None:
        return None
    unseed_dataset = load_batches_with(loader.dataset, _SeededFetch(loader.dataset))
    seeded = _SeededBatches(loader.batch_sampler, seed, rank, unseed_dataset)
    loader.generator = torch.Generator().manual_seed(batch_seed((seed, rank)))
    _set_batch_sampler(loader, seeded)  # persistent workers also hold the dataset as it was
    return seeded


def _set_batch_sampler(loader: DataLoader, batch_sampler: Any) -> None:
    """Have ``loader``'s next iterator take its batches from ``batch_sampler``.

    torch refuses to reassign ``batch_sampler`` on a built loader, and mmengine builds the
    loader before the checkpoint that says how to sample is loaded: the attribute is set past
    that guard. The iterator a persistent loader keeps reads the batch sampler it was built
    with at every pass, so it is let go with its workers.
    """
    replace_batch_sampler(loader, batch_sampler)
    drop_loader_workers(loader)


def _is_infinite(loader: DataLoader) -> bool:
    """Whether the loader's sampler never ends (mmengine's ``InfiniteSampler``)."""
    return isinstance(getattr(loader, 'sampler', None), InfiniteSampler)


def resume_loader(loader: DataLoader, skip: int, before_first_batch: Callable[[], None]) -> None:
    """Make ``loader``'s next pass start ``skip`` batches in, loading none of those (only
    their index lists are computed)."""
    if loader.batch_sampler is None:
        raise ValueError('resuming mid-epoch needs a loader that batches its samples '
                         '(batch_size or batch_sampler); this one has batch_size=None')
    _set_batch_sampler(loader, _ResumedBatches(loader.batch_sampler, skip, before_first_batch))


class _IndicesFrom:
    """A loop's ``run_iter`` for a resumed pass: numbers the batches from ``skip``.

    ``EpochBasedTrainLoop.run_epoch`` numbers the batches the loader hands out from 0, and a
    resumed pass hands out only those after the ``skip`` already trained: without this,
    whatever reads the place in the epoch (the log line's ``[epoch][i/n]``, LoggerHook's
    ``every_n_inner_iters`` and ``end_of_epoch``) would see each batch ``skip`` places early.
    Set on the loop instance for that pass, where ``run_epoch`` looks ``run_iter`` up.
    """

    def __init__(self, run_iter: Callable[[int, Any], None], skip: int) -> None:
        self.run_iter, self.skip = run_iter, skip

    def __call__(self, idx: int, data_batch: Any) -> None:
        self.run_iter(idx + self.skip, data_batch)


def restart_loop_iterator(loop: IterBasedTrainLoop) -> None:
    """Give the loop a new iterator over its loader, from the start of its sampler.

    The loop builds its first iterator before any hook runs. mmengine's ``InfiniteSampler``
    serves every iterator from one generator, which that first iterator has advanced when
    its workers prefetched, and closes when it is collected: the sampler gets a new one.
    """
    sampler = loop.dataloader.sampler
    if isinstance(sampler, InfiniteSampler):
        sampler.indices = indices_of_rank(sampler)
    new_loop_iterator(loop)


@HOOKS.register_module()
class ExactResumeHook(Hook):
    """Save the random state in checkpoints; on resume skip the trained batches without
    loading them and restore the state before the next batch.

    A checkpoint may be taken in the middle of an epoch (a preemption save): the resumed
    epoch starts where it stopped, its batches numbered as in the uninterrupted run (the
    place in the epoch that hooks and log lines read). Skipping happens on the batch
    sampler's index lists, so a resume at iteration 160k costs index arithmetic, not 160k
    batches of image decoding.
    The random state is restored in the main process. Loader workers (``num_workers > 0``)
    hold generators of their own that no checkpoint can hold, and a resumed pass hands its
    batches to other workers than the uninterrupted one did: each batch is therefore loaded
    from a seed of its own (run seed, rank, pass, place in the pass; :class:`_SeededBatches`),
    so its augmentations are the same in the resumed run, mid-pass included; a loader
    without workers does the same in the training process, so ``num_workers`` may change
    between the stop and the resume (:func:`seed_batches`).

    Evaluation between training iterations draws from the same generators (e.g. the data
    loader's base seed), so validation and testing run on a copy of the state and leave the
    training stream as it was: a run that resumes past an evaluation it did not repeat still
    draws the same numbers. In a multi-process run the state of every process is gathered
    when a checkpoint is saved (process 0 alone writes it, so the gathering happens as
    ``runner.save_checkpoint`` is entered, where every process is:
    :func:`~vitdense.internals.before_every_save`) and each process restores its own: with
    ``randomness.diff_rank_seed=True`` the processes draw different numbers. After the run
    the runner's ``save_checkpoint`` and the training set's loading are their own again (the
    training loader keeps its seeded batch sampler).
    """

    priority = 'VERY_LOW'

    def __init__(self) -> None:
        self.pending: dict | None = None
        self.outside_eval: dict | None = None
        self.every_rank: list[dict] | None = None
        self.seeded: _SeededBatches | None = None
        self.unpatch_save: Callable[[], None] | None = None
        self.built_with_seed: int | None = None

    def before_run(self, runner) -> None:
        """The seed the runner built the training loader with (its sampler's shuffling)."""
        self.built_with_seed = runner.seed

    def before_train(self, runner) -> None:
        """Seed the training loader's workers per batch; in a multi-process run, have every
        checkpoint save gather the random state of every process. Warn when the run resumed
        a checkpoint of another seed than the one it was built with (mmengine takes the
        checkpoint's seed after building the loader): it cannot repeat the checkpoint's run."""
        if self.built_with_seed is not None and runner.seed != self.built_with_seed:
            print_log(f'this run was built with seed {self.built_with_seed} and resumes a '
                      f'checkpoint of seed {runner.seed}: its data order and whatever else was '
                      'drawn from the seed before the checkpoint loaded are not those of the '
                      'run that wrote it, so it will not repeat that run. Resume with '
                      'tools/train.py --resume, or set randomness.seed to the checkpoint\'s '
                      "meta['seed']", logger='current', level=logging.WARNING)
        self.seeded = seed_batches(runner.train_loop.dataloader, runner.seed, get_rank())
        if get_world_size() > 1:
            self.unpatch_save = before_every_save(runner, self._gather_every_rank)

    def _gather_every_rank(self) -> None:
        """Every process's training stream, gathered on every process as it saves."""
        self.every_rank = all_gather_object(self.training_stream())

    def after_run(self, runner) -> None:
        """Put the runner's own ``save_checkpoint`` and the training set's own loading
        back (a test run after training calls this again: nothing is left to put back)."""
        if self.unpatch_save is not None:
            self.unpatch_save()
            self.unpatch_save = None
        if self.seeded is not None:
            self.seeded.unseed_dataset()

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        """The random state as plain data (numpy's key array as a tensor), whichever of this
        hook and ``SafeCheckpointHook`` runs first."""
        checkpoint[RNG_KEY] = to_plain(self.training_stream())
        if self.every_rank is not None:
            checkpoint[PER_RANK_KEY] = to_plain(self.every_rank)

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        self.pending = from_plain(checkpoint.get(RNG_KEY))
        per_rank = from_plain(checkpoint.get(PER_RANK_KEY))
        if per_rank is not None and len(per_rank) == get_world_size():
            self.pending = per_rank[get_rank()]
        elif get_world_size() > 1 and self.pending is not None:
            print_log(f'the checkpoint holds the random state of '
                      f'{len(per_rank) if per_rank else 1} process(es), this run has '
                      f'{get_world_size()}: every process restores that of process 0',
                      logger='current', level=logging.WARNING)
        if self.pending is None:
            print_log('the checkpoint holds no random state (written without '
                      'ExactResumeHook): the resumed run draws other random numbers than the '
                      'interrupted one would have', logger='current', level=logging.WARNING)

    def before_train_epoch(self, runner) -> None:
        """On resume, have the loader pass over the batches already trained (none of their
        samples is loaded), restore the random state where the uninterrupted run drew its
        next number and, in an epoch loop, number the batches of the resumed pass from where
        the checkpoint stopped (:class:`_IndicesFrom`)."""
        loop = runner.train_loop
        if isinstance(loop, IterBasedTrainLoop):
            self._resume_iterations(loop)
        elif isinstance(loop, EpochBasedTrainLoop):
            if self.seeded is not None:
                self.seeded.passes = loop.epoch
            skip = loop.iter - loop.epoch * len(loop.dataloader)
            self._resume_pass(loop.dataloader, skip)
            if skip > 0:
                loop.run_iter = _IndicesFrom(loop.run_iter, skip)

    def after_train_epoch(self, runner) -> None:
        """The resumed pass is over: the loop numbers the next passes' batches itself."""
        if isinstance(vars(runner.train_loop).get('run_iter'), _IndicesFrom):
            del runner.train_loop.run_iter

    def _resume_iterations(self, loop: IterBasedTrainLoop) -> None:
        """Skip ``loop.iter`` batches: whole passes of a finite sampler by its epoch
        number, the rest by index lists; mmengine's own advance (which loads every batch)
        is then answered by :class:`_AlreadyAdvanced`."""
        if loop.iter == 0:
            if self.seeded is not None:  # the loop's first iterator predates the seeding
                self.seeded.passes = 0  # as on resume, whatever restarts (PreemptionHook's) counted
                restart_loop_iterator(loop)
            return
        if not loop.stop_training:  # a run that trains no further needs no batches
            loader, skip, epochs = loop.dataloader, loop.iter, 0
            if not _is_infinite(loader):
                epochs, skip = divmod(loop.iter, len(loader))
                set_loop_pass(loop, epochs)
                if hasattr(loader.sampler, 'set_epoch'):
                    loader.sampler.set_epoch(epochs)
            if self.seeded is not None:
                self.seeded.passes = epochs
            print_log(f'resuming at iteration {loop.iter}: the data loader passes over the '
                      f'{loop.iter} batches already trained without loading them',
                      logger='current')
            self._resume_pass(loader, skip)
            restart_loop_iterator(loop)
        loop.dataloader_iterator = _AlreadyAdvanced(loop.dataloader_iterator, loop.iter)

    def _resume_pass(self, loader: DataLoader, skip: int) -> None:
        """Restore the random state now when the checkpoint was taken between passes over
        the data (the next pass's iterator draws its seed from it, as in the uninterrupted
        run), else just before the first batch after the ``skip`` trained ones is loaded."""
        if skip > 0:
            resume_loader(loader, skip, self._restore_pending)
        else:
            self._restore_pending()

    def _restore_pending(self) -> None:
        if self.pending is not None:
            set_rng_state(self.pending)
            self.pending = None

    def training_stream(self) -> dict:
        """The state of the training stream: the one kept aside while evaluating (a save
        during validation, on a stop signal), else the generators' own."""
        return self.outside_eval if self.outside_eval is not None else rng_state()

    def _keep_training_stream(self) -> None:
        self.outside_eval = rng_state()

    def _return_to_training_stream(self) -> None:
        if self.outside_eval is not None:
            set_rng_state(self.outside_eval)
            self.outside_eval = None

    def before_val(self, runner) -> None:
        self._keep_training_stream()

    def after_val(self, runner) -> None:
        self._return_to_training_stream()

    def before_test(self, runner) -> None:
        self._keep_training_stream()

    def after_test(self, runner) -> None:
        self._return_to_training_stream()
