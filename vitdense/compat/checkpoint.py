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
explicitly (so ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` cannot turn it off), and every
scheme of ``CheckpointLoader`` reports a refused file as :class:`UnsafeCheckpointError`
naming the file and the global it asked for.
"""
from __future__ import annotations

import os.path as osp
import pickle
import re
from typing import Any, Callable

import numpy as np
import torch
from mmengine.logging.history_buffer import HistoryBuffer
from mmengine.runner import checkpoint as mme_checkpoint

__all__ = ['UnsafeCheckpointError', 'safe_load', 'ALLOWED_GLOBALS', 'apply']

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
    boilerplate = ('Weights only load failed', 'Check the documentation', 'Please file an issue')
    kept = [part.strip() for part in message.split('\n\n')
            if part.strip() and not part.strip().startswith(boilerplate)]
    return ' '.join(kept) or message


def safe_load(f: Any, map_location: Any = None) -> Any:
    """``torch.load(f, weights_only=True)`` with the allow-list and a clear refusal."""
    try:
        return torch.load(f, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        if isinstance(err, UnsafeCheckpointError):
            raise
        name = f if isinstance(f, (str, bytes)) or hasattr(f, '__fspath__') else repr(f)
        raise UnsafeCheckpointError(str(name), _offending(str(err)),
                                    _detail(str(err))) from None


def load_from_local(filename: str, map_location: Any = None) -> Any:
    """mmengine's local scheme, loading with ``weights_only=True`` explicitly."""
    filename = osp.expanduser(filename)
    if not osp.isfile(filename):
        raise FileNotFoundError(f'{filename} can not be found.')
    return safe_load(filename, map_location)


def _naming_refusals(load_checkpoint: Callable) -> classmethod:
    """Wrap ``CheckpointLoader.load_checkpoint`` so refusals by any scheme name the file."""
    def wrapped(cls: type, filename: str, map_location: Any = None,
                logger: Any = 'current') -> Any:
        try:
            return load_checkpoint(filename, map_location, logger)
        except pickle.UnpicklingError as err:
            if isinstance(err, UnsafeCheckpointError):
                raise
            raise UnsafeCheckpointError(filename, _offending(str(err)),
                                        _detail(str(err))) from None
    wrapped.__doc__ = load_checkpoint.__doc__
    setattr(wrapped, _PATCHED_ATTR, True)
    return classmethod(wrapped)


def apply() -> None:
    """Register the allow-list and patch mmengine's checkpoint loader (idempotent)."""
    torch.serialization.add_safe_globals(ALLOWED_GLOBALS)
    loader = mme_checkpoint.CheckpointLoader
    loader.register_scheme(prefixes='', loader=load_from_local, force=True)
    if not getattr(loader.load_checkpoint, _PATCHED_ATTR, False):
        loader.load_checkpoint = _naming_refusals(loader.load_checkpoint)
