"""Safe loading of mmengine checkpoints on torch >= 2.6.

Symptom: torch 2.6 made ``torch.load(weights_only=True)`` the default, and mmengine 0.10
calls ``torch.load`` without the argument, so ``load_from``, ``resume`` and
``init_cfg=dict(type='Pretrained')`` all fail on mmengine's own checkpoints with
``Unsupported global: GLOBAL mmengine.logging.history_buffer.HistoryBuffer`` (and numpy
arrays / scalars in the message hub).  Turning ``weights_only`` off would let any
checkpoint run code on load.

Fix: keep ``weights_only=True`` and allow-list exactly what ``Runner.save_checkpoint``
writes besides tensors and builtins (found by saving a real checkpoint and listing
``torch.serialization.get_unsafe_globals_in_checkpoint``): numpy arrays, dtypes and
scalars, mmengine's ``HistoryBuffer``, and the ``getattr(HistoryBuffer, 'min')``-style
references that ``HistoryBuffer.__getstate__`` pickles, which are served by a restricted
``getattr`` that resolves nothing but HistoryBuffer's own statistics methods.
mmengine's local-file loader is replaced by one that passes ``weights_only=True``
explicitly (so ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` cannot turn it off), every other scheme
of ``CheckpointLoader`` loads with ``TORCH_FORCE_WEIGHTS_ONLY_LOAD`` set, and each reports a
refused file as :class:`UnsafeCheckpointError` naming the file and the global it asked for.

Symptom: an mmengine checkpoint whose message hub holds an empty ``HistoryBuffer`` (a scalar
logged by no iteration yet) is refused with ``Unsupported global: GLOBAL bytes``: the empty
array's data pickles as the call ``bytes()``.  Fix: ``builtins.bytes`` resolves to a
function that builds the empty bytes object and nothing else (``bytes(n)`` would let a file
allocate any amount of memory).

Symptom: a truncated, empty or garbled checkpoint fails deep in torch (``PytorchStreamReader
failed reading zip archive``, a bare ``EOFError``, ``Unsupported operand``) without the file's
name, and the refusal text repeated torch's advice to turn ``weights_only`` off.  Fix: such
files raise :class:`CorruptCheckpointError` naming the file and what is wrong with it, and
refusals keep only the unpickler's reason.

Symptom: mmengine writes checkpoints in place and, with ``max_keep_ckpts``, deletes the old
one before writing the new one, so a run killed while saving is left with a half-written
file, no older one, and a ``last_checkpoint`` naming a missing file.  Fix: local checkpoints
are written by :func:`atomic_write` (temporary file in the same folder, fsync, rename, fsync
of the folder), ``CheckpointHook`` saves first, then points ``last_checkpoint`` at the new
file (also atomically) and only then removes checkpoints beyond ``max_keep_ckpts``.
"""
from __future__ import annotations

import contextlib
import io
import os
import os.path as osp
import pickle
import re
import tempfile
import zipfile
from typing import Any, Callable, Iterator

import numpy as np
import torch
from mmengine.dist import is_main_process
from mmengine.hooks import CheckpointHook
from mmengine.logging.history_buffer import HistoryBuffer
from mmengine.runner import checkpoint as mme_checkpoint
from mmengine.runner import runner as mme_runner

__all__ = ['UnsafeCheckpointError', 'CorruptCheckpointError', 'safe_load', 'atomic_write',
           'ALLOWED_GLOBALS', 'apply']

_PATCHED_ATTR = '_vitdense_safe_loading'


class UnsafeCheckpointError(pickle.UnpicklingError):
    """A checkpoint asked for a global outside the allow-list; nothing of it was run."""

    def __init__(self, filename: str, offending: str, detail: str) -> None:
        self.filename = filename
        self.offending = offending
        super().__init__(
            f"refused to load checkpoint '{filename}': it needs {offending}, which is not "
            'on the allow-list of what mmengine checkpoints contain (torch.load '
            'weights_only=True). Nothing from the file was executed. If you trust the '
            'file and know what it holds, load it yourself and re-save its tensors with '
            f'torch.save.\ntorch said: {detail}')


class CorruptCheckpointError(ValueError):
    """A checkpoint file that cannot be read at all: empty, truncated or not a torch file."""

    def __init__(self, filename: str, problem: str) -> None:
        self.filename = filename
        super().__init__(f"checkpoint '{filename}' is unreadable: {problem}")


# The statistics HistoryBuffer registers for itself (``HistoryBuffer.__init__``).
_HISTORY_BUFFER_STATISTICS = ('min', 'max', 'current', 'mean')


def _history_buffer_getattr(obj: Any, name: str) -> Callable:
    """``getattr`` as HistoryBuffer pickles need it, and nothing else.

    ``HistoryBuffer.__getstate__`` stores its statistics methods, which pickle as
    ``getattr(HistoryBuffer, 'mean')``, and ``__setstate__`` merges them into a class-level
    table that mmengine later calls.  A general ``getattr`` would let a crafted file plant
    arbitrary attributes there (e.g. ``ndarray.tofile``), so only the built-in statistics
    of HistoryBuffer itself resolve.
    """
    if obj is HistoryBuffer and name in _HISTORY_BUFFER_STATISTICS:
        return HistoryBuffer.__dict__[name]
    raise pickle.UnpicklingError(
        f'Unsupported call: GETATTR {getattr(obj, "__name__", type(obj).__name__)}.{name}'
        ' is not a HistoryBuffer statistics method')


def _empty_bytes(*args: Any) -> bytes:
    """``bytes()`` as the data of an empty numpy array pickles; no other call of ``bytes``."""
    if args:
        raise pickle.UnpicklingError(
            f'Unsupported call: bytes{args!r:.60} (only bytes() of empty arrays is allowed)')
    return b''


def _numpy_globals() -> list[tuple[Any, str]]:
    """numpy's array/scalar reconstructors under both module paths.

    numpy 2 pickles as ``numpy._core.multiarray``; checkpoints written with numpy 1 name
    ``numpy.core.multiarray``.  Both resolve to the same safe functions.
    """
    try:
        from numpy._core import multiarray
    except ImportError:  # numpy < 2
        from numpy.core import multiarray
    out: list[tuple[Any, str]] = [(np.ndarray, 'numpy.ndarray'), (np.dtype, 'numpy.dtype')]
    for prefix in ('numpy._core.multiarray', 'numpy.core.multiarray'):
        out += [(multiarray._reconstruct, f'{prefix}._reconstruct'),
                (multiarray.scalar, f'{prefix}.scalar')]
    # Unpickling a dtype BUILDs an instance of its class (numpy.dtypes.Float64DType, ...);
    # only the numeric ones occur in message-hub buffers and scalars.
    numeric = (np.bool_, np.int8, np.uint8, np.int16, np.uint16, np.int32, np.uint32,
               np.int64, np.uint64, np.float16, np.float32, np.float64, np.longdouble,
               np.complex64, np.complex128)
    out += [(type(np.dtype(t)), f'numpy.dtypes.{type(np.dtype(t)).__name__}')
            for t in numeric]
    return out


ALLOWED_GLOBALS: list[Any] = [
    HistoryBuffer,
    (_history_buffer_getattr, 'builtins.getattr'),
    (_empty_bytes, 'builtins.bytes'),
    *_numpy_globals(),
]

_GLOBAL_RE = re.compile(r'GLOBAL (\S+)|GETATTR (\S+)|unrecognized function (.+?)(?: which|$)|'
                        r"but got <class '([^']+)'>", re.M)


def _offending(message: str) -> str:
    """The disallowed global named in torch's weights-only error message."""
    match = _GLOBAL_RE.search(message)
    if match is None:
        return 'an object outside the allow-list'
    if match.group(1):
        return f'the global `{match.group(1)}`'
    if match.group(2):
        return f'the attribute `{match.group(2)}` (via getattr)'
    if match.group(3):
        return f'a call to `{match.group(3)}`'
    return f'an instance of `{match.group(4)}`'


def _detail(message: str) -> str:
    """The unpickler's own reason, without torch's advice to turn weights_only off."""
    match = re.search(r'WeightsUnpickler error: (.*?)(?: Please use `torch\.serialization|$)',
                      message, re.M)
    if match:
        return match.group(1).strip()
    advice = ('Weights only load failed', 'Check the documentation', 'Please file an issue',
              'This file can still be loaded', '(1)', '(2)')
    kept = [line.strip() for line in message.splitlines()
            if line.strip() and not line.strip().startswith(advice)]
    return ' '.join(kept) or message


def _corruption(filename: str, err: BaseException) -> str | None:
    """What is wrong with an unreadable checkpoint file, or None if ``err`` is not that."""
    size = os.path.getsize(filename)
    if size == 0:
        return 'the file is empty (0 bytes), e.g. a save that was interrupted'
    if isinstance(err, pickle.UnpicklingError) and 'Unsupported operand' not in str(err):
        return None
    with open(filename, 'rb') as f:
        is_zip = f.read(2) == b'PK'
    if is_zip and not zipfile.is_zipfile(filename):
        return (f'the zip archive is truncated or damaged ({size} bytes; torch said: '
                f'{str(err).split(". ")[0]})')
    if is_zip:
        return f'a damaged torch archive ({size} bytes; {type(err).__name__}: {err})'
    if isinstance(err, (EOFError, pickle.UnpicklingError, RuntimeError)):
        return (f'not a torch checkpoint ({size} bytes that are neither a torch zip archive '
                f'nor a complete pickle: {_detail(str(err))})')
    return None


def safe_load(f: Any, map_location: Any = None, mmap: bool = False) -> Any:
    """``torch.load(f, weights_only=True)`` with the allow-list and a clear refusal.

    Raises :class:`UnsafeCheckpointError` for a file that asks for a global outside the
    allow-list and :class:`CorruptCheckpointError` for an empty, truncated or garbled file.
    ``mmap=True`` (a file path only) maps the tensors instead of reading them: the archive and
    every global are still checked, for the cost of reading the pickle alone, which is how
    a checkpoint is vetted before the Runner loads it.
    """
    is_path = isinstance(f, (str, bytes)) or hasattr(f, '__fspath__')
    name = os.fsdecode(f) if is_path else repr(f)
    try:
        return torch.load(f, map_location=map_location, weights_only=True, mmap=mmap)
    except (pickle.UnpicklingError, RuntimeError, EOFError, IndexError, zipfile.BadZipFile,
            ValueError) as err:
        if isinstance(err, (UnsafeCheckpointError, CorruptCheckpointError)):
            raise
        problem = _corruption(name, err) if is_path and osp.isfile(name) else None
        if problem is not None:
            raise CorruptCheckpointError(name, problem) from None
        if isinstance(err, pickle.UnpicklingError):
            raise UnsafeCheckpointError(name, _offending(str(err)), _detail(str(err))) from None
        raise


def atomic_write(path: str | os.PathLike, data: bytes | str) -> None:
    """Write ``data`` to ``path`` so that ``path`` holds either its old or its new content.

    The bytes go to a temporary file in the same folder, are fsynced, and the file is renamed
    over ``path`` (atomic on POSIX); the folder is fsynced so the rename survives a crash.
    """
    path = os.fspath(path)
    folder = osp.dirname(osp.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f'.{osp.basename(path)}.', suffix='.tmp', dir=folder)
    try:
        with os.fdopen(fd, 'wb') as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if osp.exists(tmp):
            os.remove(tmp)
        raise
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


_MMENGINE_SAVE = mme_checkpoint.save_checkpoint


def save_checkpoint_atomically(checkpoint: dict, filename: str, file_client_args: Any = None,
                               backend_args: Any = None) -> None:
    """mmengine's ``save_checkpoint``, writing local files with :func:`atomic_write`."""
    if '://' in str(filename) or file_client_args is not None or backend_args is not None:
        return _MMENGINE_SAVE(checkpoint, filename, file_client_args=file_client_args,
                              backend_args=backend_args)
    os.makedirs(osp.dirname(osp.abspath(filename)), exist_ok=True)
    with io.BytesIO() as buffer:
        torch.save(checkpoint, buffer)
        atomic_write(filename, buffer.getvalue())


def _save_then_prune(self: CheckpointHook, runner: Any, step: int, meta: dict) -> None:
    """``CheckpointHook._save_checkpoint_with_step`` in a safe order.

    Save the new checkpoint, point ``last_checkpoint`` at it, and only then remove the
    checkpoints beyond ``max_keep_ckpts``: a kill at any moment leaves a loadable checkpoint
    named by ``last_checkpoint``.
    """
    ckpt_filename = self.filename_tmpl.format(step)
    self.last_ckpt = self.file_backend.join_path(self.out_dir, ckpt_filename)
    runner.message_hub.update_info('last_ckpt', self.last_ckpt)
    runner.save_checkpoint(self.out_dir, ckpt_filename, self.file_client_args,
                           save_optimizer=self.save_optimizer,
                           save_param_scheduler=self.save_param_scheduler, meta=meta,
                           by_epoch=self.by_epoch, backend_args=self.backend_args, **self.args)
    if is_main_process():
        atomic_write(osp.join(runner.work_dir, 'last_checkpoint'), self.last_ckpt)
    if self.max_keep_ckpts <= 0 or (self.keep_ckpt_ids and self.keep_ckpt_ids[-1] == step):
        return
    while len(self.keep_ckpt_ids) >= self.max_keep_ckpts:  # a deque of max_keep_ckpts
        old = self.file_backend.join_path(self.out_dir,
                                          self.filename_tmpl.format(self.keep_ckpt_ids.popleft()))
        if is_main_process() and self.file_backend.isfile(old):
            self.file_backend.remove(old)
        elif is_main_process() and self.file_backend.isdir(old):
            self.file_backend.rmtree(old)
    self.keep_ckpt_ids.append(step)
    runner.message_hub.update_info('keep_ckpt_ids', list(self.keep_ckpt_ids))


def load_from_local(filename: str, map_location: Any = None) -> Any:
    """mmengine's local scheme, loading with ``weights_only=True`` explicitly."""
    filename = osp.expanduser(filename)
    if not osp.isfile(filename):
        raise FileNotFoundError(f'{filename} can not be found.')
    return safe_load(filename, map_location)


_FORCE_ENV = ('TORCH_FORCE_WEIGHTS_ONLY_LOAD', 'TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD')


@contextlib.contextmanager
def _weights_only_everywhere() -> Iterator[None]:
    """Every ``torch.load`` inside is weights-only, whatever its caller passes.

    mmengine's other schemes (http, open-mmlab, ceph, pavi, ...) call ``torch.load`` without
    ``weights_only``, which ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` in the user's environment
    would turn off; torch's ``TORCH_FORCE_WEIGHTS_ONLY_LOAD`` overrides every call site.
    """
    saved = {name: os.environ.pop(name, None) for name in _FORCE_ENV}
    os.environ['TORCH_FORCE_WEIGHTS_ONLY_LOAD'] = '1'
    try:
        yield
    finally:
        for name, value in saved.items():
            os.environ.pop(name, None)
            if value is not None:
                os.environ[name] = value


def _naming_refusals(load_checkpoint: Callable) -> classmethod:
    """Wrap ``CheckpointLoader.load_checkpoint`` so that every scheme loads weights-only and
    its refusals name the file."""
    def wrapped(cls: type, filename: str, map_location: Any = None,
                logger: Any = 'current') -> Any:
        try:
            with _weights_only_everywhere():
                return load_checkpoint(filename, map_location, logger)
        except pickle.UnpicklingError as err:
            if isinstance(err, (UnsafeCheckpointError, CorruptCheckpointError)):
                raise
            raise UnsafeCheckpointError(filename, _offending(str(err)),
                                        _detail(str(err))) from None
    wrapped.__doc__ = load_checkpoint.__doc__
    setattr(wrapped, _PATCHED_ATTR, True)
    return classmethod(wrapped)


def apply() -> None:
    """Register the allow-list, patch mmengine's checkpoint loader and writer (idempotent)."""
    torch.serialization.add_safe_globals(ALLOWED_GLOBALS)
    mme_checkpoint.save_checkpoint = save_checkpoint_atomically
    mme_runner.save_checkpoint = save_checkpoint_atomically
    CheckpointHook._save_checkpoint_with_step = _save_then_prune
    loader = mme_checkpoint.CheckpointLoader
    loader.register_scheme(prefixes='', loader=load_from_local, force=True)
    if not getattr(loader.load_checkpoint, _PATCHED_ATTR, False):
        loader.load_checkpoint = _naming_refusals(loader.load_checkpoint)
