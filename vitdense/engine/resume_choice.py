"""Which checkpoint a launched tool resumes from: one decision for the whole job, made by
process 0 and checked by every process (``tools/train.py --resume``); the resumed run is built
with that checkpoint's seed. Without a named file, the newest checkpoint of the work dir that
loads (:func:`find_resumable_checkpoint`), passing over damaged ones and the leftovers of
interrupted saves."""
from __future__ import annotations

import logging
import os
import os.path as osp
import re
from pathlib import Path

from mmengine.config import Config
from mmengine.dist import all_gather_object, broadcast_object_list, get_rank, get_world_size
from mmengine.logging import print_log
from mmengine.runner import find_latest_checkpoint

from vitdense.checkpoint_io import CorruptCheckpointError, UnsafeCheckpointError, safe_load
from vitdense.engine.launch import torchrun_restarts


def apply_resume(cfg: Config, resume: str | None) -> None:
    """Set up ``--resume`` (``'auto'``: the newest loadable checkpoint of the work dir), one
    decision for the whole job.

    Process 0 chooses the checkpoint and sends its path to the others; every process checks
    that it can read that file, and if any cannot, every process stops with an error naming
    the file and those processes (e.g. node-local work dirs that hold different checkpoints),
    so no process ever starts from other weights than the rest. A named checkpoint must exist
    and load. With ``'auto'`` and nothing to resume, the run says so loudly and starts from
    iteration 0, so one command line both starts and continues a run. Every process prints
    what it resumes from (mmengine's logger shows process 0 only).

    A group that torchrun restarted (``--max-restarts``; ``TORCHELASTIC_RESTART_COUNT`` > 0)
    resumes as with ``'auto'``: it continues from the work dir's last checkpoint instead of
    training from iteration 0 over the checkpoints of the group before it.

    Whatever the checkpoint, the run is built with its seed (:func:`take_checkpoint_seed`).
    """
    restarts = torchrun_restarts()
    if resume is None and restarts > 0:
        print_log(f'torchrun restarted this group ({restarts} restart(s)): resuming from the '
                  'work dir\'s last checkpoint, as with --resume', logger='current',
                  level=logging.WARNING)
        resume = 'auto'
    if resume is not None:
        _choose_for_the_job(cfg, resume)
    take_checkpoint_seed(cfg)


def _choose_for_the_job(cfg: Config, resume: str) -> None:
    """Process 0's choice of checkpoint, checked by every process, set as ``cfg.resume`` and
    ``cfg.load_from`` (:func:`apply_resume`)."""
    choice: list = [_choose_checkpoint(cfg.work_dir, resume) if get_rank() == 0 else None]
    if get_world_size() > 1:
        broadcast_object_list(choice, src=0)
    path, error, fingerprint = choice[0]
    if error is not None:
        raise FileNotFoundError(error)
    if get_world_size() == 1 and path is not None:
        safe_load(path, map_location='cpu', mmap=True)  # its own error names the file
    problems = all_gather_object(_cannot_read(path, fingerprint)) if get_world_size() > 1 else []
    failed = {rank: problem for rank, problem in enumerate(problems) if problem}
    if failed:
        raise RuntimeError(f'--resume: process 0 chose {path}, which rank(s) '
                           f'{sorted(failed)} cannot read ({"; ".join(failed.values())}); '
                           'give every node the same work dir (a shared file system) or copy '
                           'the checkpoint to each node, then resume again')
    if path is None:
        print_log(f'--resume: NOTHING TO RESUME in work dir {osp.abspath(cfg.work_dir)} '
                  '(no checkpoint there that loads); training starts from iteration 0',
                  logger='current', level=logging.WARNING)
    where = f'rank {get_rank()} of {get_world_size()}: ' if get_world_size() > 1 else ''
    print(f'{where}--resume: ' + (f'resuming from {path}' if path else
                                  'nothing to resume, starting from iteration 0'), flush=True)
    cfg.resume, cfg.load_from = path is not None, path


def take_checkpoint_seed(cfg: Config) -> None:
    """Build a resumed run with the seed of the checkpoint it resumes (``randomness.seed``).

    mmengine's runner seeds itself from the config and builds its training loader (the
    sampler's shuffling seed, the workers' seeds) before ``Runner.resume`` loads the
    checkpoint and only then takes its seed: with ``seed=None``, as every shipped runtime
    has, the resumed run would draw a seed of its own, shuffle the data in another order
    and differ from the uninterrupted run from its first resumed iteration. The checkpoint
    mmengine will resume (``load_from``, or the work dir's ``last_checkpoint`` with
    ``resume=True`` alone) gives its ``meta['seed']``, process 0's; each process adds its
    rank to it again under ``diff_rank_seed``. Nothing changes for a run that does not
    resume or a checkpoint without a seed.
    """
    if not cfg.get('resume'):
        return
    path = cfg.get('load_from') or find_latest_checkpoint(cfg.work_dir)
    if path is None or not osp.isfile(path):
        return
    seed = (safe_load(path, map_location='cpu', mmap=True).get('meta') or {}).get('seed')
    if seed is None:
        return
    randomness = dict(cfg.get('randomness') or {})
    if randomness.get('seed') not in (None, seed):
        print_log(f'randomness.seed={randomness["seed"]} is replaced by the seed of the '
                  f'checkpoint resumed, {seed} ({path}): a resumed run repeats the run that '
                  'wrote it', logger='current', level=logging.WARNING)
    cfg.randomness = dict(randomness, seed=seed)


def refuse_to_start_over(cfg: Config) -> None:
    """Stop a run that would train from iteration 0 in a work dir holding a checkpoint that
    loads, before it overwrites that run's checkpoints; one decision for the whole job.

    Process 0 looks for the newest loadable checkpoint and sends its path to the others, so
    every process stops with the same error, which names the checkpoint and the options of
    ``tools/train.py`` that continue it (``--resume auto``) or start over on purpose
    (``--resume none``, or another ``--work-dir``). A group that torchrun restarted and a
    config that resumes by itself (``resume = True``) continue instead (:func:`apply_resume`,
    mmengine), so they are let through.
    """
    if torchrun_restarts() > 0 or cfg.get('resume'):
        return
    found: list = [find_resumable_checkpoint(cfg.work_dir) if get_rank() == 0 else None]
    if get_world_size() > 1:
        broadcast_object_list(found, src=0)
    if found[0] is not None:
        raise FileExistsError(
            f'work dir {cfg.work_dir} holds the checkpoint {found[0]}: training would start '
            'from iteration 0 and overwrite that run. Add --resume auto to continue it, or '
            '--resume none to start over in this work dir (its checkpoints are overwritten), '
            'or pass another --work-dir')


Choice = tuple[str | None, str | None, tuple | None]


def _choose_checkpoint(work_dir: str, resume: str) -> Choice:
    """(checkpoint to resume from or None, error or None, its fingerprint), on process 0."""
    if resume == 'auto':
        if osp.isdir(work_dir):
            remove_interrupted_saves(work_dir)
        path = find_resumable_checkpoint(work_dir)
    elif not osp.isfile(resume):
        return None, f'--resume {resume}: no such checkpoint file', None
    else:
        path = resume
    return path, None, None if path is None else _fingerprint(path)


def _fingerprint(path: str) -> tuple:
    """Size and iteration of a checkpoint: a file of that name on another node that is not
    the same checkpoint differs in one of them."""
    meta = safe_load(path, map_location='cpu', mmap=True).get('meta') or {}
    return osp.getsize(path), meta.get('iter')


def _cannot_read(path: str | None, fingerprint: tuple | None) -> str | None:
    """Why this process cannot load the checkpoint process 0 chose, or None when it can (or
    there is none)."""
    rank = f'rank {get_rank()}'
    if path is None:
        return None
    if not osp.isfile(path):
        return f'{rank}: no such file'
    try:
        mine = _fingerprint(path)
    except (CorruptCheckpointError, UnsafeCheckpointError, OSError) as err:
        return f'{rank}: {err}'
    if mine != fingerprint:
        return (f'{rank}: its file of that name is another checkpoint (size, iteration '
                f'{mine}, process 0 has {fingerprint})')
    return None


_STEP = re.compile(r'(\d+)\.pth$')


def _candidates(work_dir: str) -> list[str]:
    """Checkpoints of ``work_dir``: the one ``last_checkpoint`` names, then the others from
    the highest iteration / epoch number down."""
    pointer = osp.join(work_dir, 'last_checkpoint')
    named = Path(pointer).read_text().strip() if osp.isfile(pointer) else None
    found = sorted((str(p) for p in Path(work_dir).glob('*.pth')),
                   key=lambda p: (int(_STEP.search(p).group(1)) if _STEP.search(p) else -1,
                                  osp.getmtime(p)), reverse=True)
    ordered = [named] if named else []
    return ordered + [p for p in found if not named or osp.abspath(p) != osp.abspath(named)]


def remove_interrupted_saves(work_dir: str | os.PathLike) -> list[str]:
    """Delete the temporary files of checkpoint saves that were killed before their rename.

    :func:`~vitdense.checkpoint_io.atomic_write` names them ``.<checkpoint>.<random>.tmp``;
    such a file never became a checkpoint, so nothing is lost with it.
    """
    removed = [str(path) for path in Path(work_dir).glob('.*.pth.*.tmp')]
    for path in removed:
        os.remove(path)
        print_log(f'removed {path}, left by a checkpoint save that was interrupted',
                  logger='current')
    return removed


def find_resumable_checkpoint(work_dir: str | os.PathLike) -> str | None:
    """The newest checkpoint in ``work_dir`` that loads, or None when there is none.

    Starts from the file ``last_checkpoint`` names; a missing, empty, truncated or refused
    one is reported and the next newest ``*.pth`` is tried.
    """
    work_dir = os.fspath(work_dir)
    if not osp.isdir(work_dir):
        return None
    for path in _candidates(work_dir):
        if not osp.isfile(path):
            print_log(f'last_checkpoint names {path}, which does not exist; looking for an '
                      'older checkpoint', logger='current', level=logging.WARNING)
            continue
        try:
            checkpoint = safe_load(path, map_location='cpu', mmap=True)
        except (CorruptCheckpointError, UnsafeCheckpointError) as err:
            print_log(f'cannot resume from {path} ({err}); trying an older checkpoint',
                      logger='current', level=logging.WARNING)
            continue
        if not isinstance(checkpoint, dict) or 'state_dict' not in checkpoint:
            print_log(f'{path} holds no state_dict (not a training checkpoint); skipped',
                      logger='current', level=logging.WARNING)
            continue
        return path
    return None
