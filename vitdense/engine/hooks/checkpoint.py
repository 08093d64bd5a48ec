"""mmengine's ``CheckpointHook``, saving so that a kill at any moment leaves a checkpoint to
resume from, and making the run's checkpoint loads safe.

mmengine writes checkpoints in place and, with ``max_keep_ckpts``, deletes the oldest one
before writing the new one, so a run killed while saving is left with a half-written file, no
older one, and a ``last_checkpoint`` naming a missing file. This hook writes local
checkpoints and ``last_checkpoint`` atomically (:class:`~vitdense.checkpoint_io.
AtomicLocalBackend`), points ``last_checkpoint`` at the new file only once it is complete,
and removes checkpoints beyond ``max_keep_ckpts`` only after that, counting the saves made
on a preemption signal or by a time budget (:func:`save_resumable`) with its own. From
``before_run`` (before the Runner loads anything) to ``after_run`` mmengine's checkpoint
schemes load through :func:`~vitdense.checkpoint_io.safe_load`
(:func:`~vitdense.checkpoint_io.use_safe_loading`), so ``load_from``, ``resume`` and
``Pretrained`` initialisation read mmengine checkpoints with ``weights_only=True``; then the
schemes are registered back as they were. What it saves holds tensors and Python builtins
only: the message hub's ``HistoryBuffer`` s and the numpy values of meta and runtime
information are written as plain data (:func:`~vitdense.checkpoint_io.to_plain`) and rebuilt when a checkpoint is loaded,
so ``torch.load`` with torch's defaults reads every checkpoint and resuming stays exact. Our
runtime configs name it: ``default_hooks.checkpoint.type =
'vitdense.SafeCheckpointHook'``.
"""
from __future__ import annotations

import os.path as osp
from pathlib import Path
from typing import Any

from mmengine.dist import barrier, get_world_size, is_main_process
from mmengine.fileio import LocalBackend, get_file_backend
from mmengine.hooks import CheckpointHook
from mmengine.runner.checkpoint import CheckpointLoader

from vitdense.checkpoint_io import (ATOMIC_BACKEND, atomic_write, from_plain, to_plain,
                                    use_safe_loading)
from vitdense.internals import checkpoint_schemes
from vitdense.registry import HOOKS

#: message hub key of the paths of the checkpoints kept (oldest first)
KEPT_KEY = 'kept_checkpoints'


@HOOKS.register_module()
class SafeCheckpointHook(CheckpointHook):
    """``CheckpointHook`` with atomic saves, prune-after-save and safe loading (module doc)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.kept: list[str] = []  # paths of the checkpoints kept, oldest first
        self.schemes_before: dict[str, Any] = {}  # mmengine's loaders, restored after the run

    def before_run(self, runner: Any) -> None:
        """Load every checkpoint of the run safely; remember the loaders it replaces."""
        super().before_run(runner)
        self.schemes_before = checkpoint_schemes()
        use_safe_loading()

    def after_run(self, runner: Any) -> None:
        """Register mmengine's checkpoint loaders back as they were before the run."""
        super().after_run(runner)
        for prefix, loader in self.schemes_before.items():
            CheckpointLoader.register_scheme(prefix, loader, force=True)

    def before_train(self, runner: Any) -> None:
        """Resolve the output folder as mmengine does; write local files atomically; take
        over the count of kept checkpoints of a resumed run (removing those beyond a
        smaller ``max_keep_ckpts``)."""
        super().before_train(runner)
        if self.file_client_args is None and type(self.file_backend) is LocalBackend:
            self.backend_args = dict(self.backend_args or {}, backend=ATOMIC_BACKEND)
            self.file_backend = get_file_backend(self.out_dir, backend_args=self.backend_args)
        info = runner.message_hub.runtime_info
        self.kept = list(info[KEPT_KEY]) if KEPT_KEY in info else [  # mmengine's count by step
            self.file_backend.join_path(self.out_dir, self.filename_tmpl.format(step))
            for step in getattr(self, 'keep_ckpt_ids', ())]
        self.remove_checkpoints(runner, self.count_kept(runner))

    def before_save_checkpoint(self, runner: Any, checkpoint: dict) -> None:
        """Numpy values and ``HistoryBuffer`` s as plain data (tensors and builtins)."""
        checkpoint.update({key: to_plain(value) for key, value in checkpoint.items()})

    def after_load_checkpoint(self, runner: Any, checkpoint: dict) -> None:
        """Rebuild what :meth:`before_save_checkpoint` wrote as plain data."""
        checkpoint.update({key: from_plain(value) for key, value in checkpoint.items()})

    def _save_checkpoint_with_step(self, runner: Any, step: int, meta: dict) -> None:
        """Save the new checkpoint, point ``last_checkpoint`` at it, and only then remove
        the checkpoints beyond ``max_keep_ckpts``."""
        ckpt_filename = self.filename_tmpl.format(step)
        self.last_ckpt = self.file_backend.join_path(self.out_dir, ckpt_filename)
        runner.message_hub.update_info('last_ckpt', self.last_ckpt)
        beyond = self.count_kept(runner, self.last_ckpt)
        runner.save_checkpoint(self.out_dir, ckpt_filename, self.file_client_args,
                               save_optimizer=self.save_optimizer,
                               save_param_scheduler=self.save_param_scheduler, meta=meta,
                               by_epoch=self.by_epoch, backend_args=self.backend_args,
                               **self.args)
        if is_main_process():
            atomic_write(osp.join(runner.work_dir, 'last_checkpoint'), self.last_ckpt)
        self.remove_checkpoints(runner, beyond)

    def count_kept(self, runner: Any, new: str | None = None) -> list[str]:
        """Count checkpoint ``new`` (about to be saved) among the kept ones; return the
        oldest beyond ``max_keep_ckpts``, which leave the count, to be removed once ``new``
        is saved and named in ``last_checkpoint``.

        The count is by path, in the message hub (saved with every checkpoint), so the
        preemption saves (``iter_<n>.pth`` whatever the hook's own names) count as well.
        """
        if self.max_keep_ckpts <= 0:
            return []
        kept = [path for path in self.kept if path != new] + ([new] if new else [])
        beyond, self.kept = kept[:-self.max_keep_ckpts], kept[-self.max_keep_ckpts:]
        runner.message_hub.update_info(KEPT_KEY, self.kept)
        return beyond

    def remove_checkpoints(self, runner: Any, paths: list[str]) -> None:
        """Process 0 removes the checkpoints ``paths`` (files, or folders of sharded saves),
        never the one ``last_checkpoint`` names."""
        named = _last_checkpoint(runner.work_dir) if is_main_process() else None
        for path in paths if is_main_process() else []:
            if path == named:
                continue
            if self.file_backend.isfile(path):
                self.file_backend.remove(path)
            elif self.file_backend.isdir(path):
                self.file_backend.rmtree(path)


def _last_checkpoint(work_dir: str) -> str | None:
    """The checkpoint ``<work_dir>/last_checkpoint`` names, or None."""
    pointer = Path(work_dir, 'last_checkpoint')
    return pointer.read_text().strip() if pointer.is_file() else None


def counting_hook(runner: Any) -> SafeCheckpointHook | None:
    """The run's ``SafeCheckpointHook``, which counts the checkpoints kept, if it has one and
    saves in the work dir (an ``out_dir`` elsewhere, perhaps remote, is not where the saves
    on a stop signal go)."""
    return next((hook for hook in runner.hooks if isinstance(hook, SafeCheckpointHook)
                 and hook.out_dir == runner.work_dir), None)


def save_resumable(runner: Any, step: int) -> Path:
    """Save ``<work_dir>/iter_<step>.pth`` atomically, after ``step`` finished iterations,
    and name it in ``last_checkpoint``, where ``--resume`` looks first; it counts among the
    checkpoints the run's ``SafeCheckpointHook`` keeps (``max_keep_ckpts``).

    Saved as an iteration checkpoint whatever the loop (``meta`` holds the current epoch and
    ``step``), so a save in the middle of an epoch resumes in that epoch. Every process calls
    it (the runner gathers what it saves); process 0 writes, and no process returns (and
    logs the path) before the file is written.
    """
    name = f'iter_{step}.pth'
    path = osp.join(runner.work_dir, name)  # joined as the hook joins its own paths
    hook = counting_hook(runner)
    beyond = hook.count_kept(runner, path) if hook else []
    runner.save_checkpoint(runner.work_dir, name, by_epoch=False, meta=dict(iter=step),
                           backend_args=dict(backend=ATOMIC_BACKEND))
    if is_main_process():
        atomic_write(Path(runner.work_dir, 'last_checkpoint'), path)
    if hook:
        hook.remove_checkpoints(runner, beyond)
    if get_world_size() > 1:
        barrier()
    return Path(path)
