"""Checkpoints as plain data: tensors and Python builtins only.

What vitdense writes (:class:`vitdense.SafeCheckpointHook`, the converters) holds
tensors and Python builtins only, so ``torch.load`` with torch's defaults (``weights_only=True``
since torch 2.6, no allow-list) reads it wherever it runs, e.g. in the hosts' own tools and
inferencers. :func:`to_plain` writes the message hub's ``HistoryBuffer`` s and numpy arrays and
scalars as tagged dicts of tensors; :func:`from_plain` rebuilds them exactly (dtype, shape,
numbers), so resuming stays exact. :func:`.writing.plain_checkpoint` rewrites a checkpoint
mmengine wrote.
"""
from __future__ import annotations

import copy
import pickle
from typing import Any, Callable

import numpy as np
import torch
from mmengine.logging.history_buffer import HistoryBuffer


# The statistics HistoryBuffer registers for itself (``HistoryBuffer.__init__``).
_HISTORY_BUFFER_STATISTICS = ('min', 'max', 'current', 'mean')
# What ``HistoryBuffer.__getstate__`` writes: its ``__dict__`` and the statistics table.
_HISTORY_BUFFER_STATE = {'max_length', '_log_history', '_count_history', 'statistics_methods'}


class _HistoryBufferFromFile:
    """What a file's ``mmengine.logging.history_buffer.HistoryBuffer`` unpickles as: the
    file's state, checked, until :func:`from_plain` builds the ``HistoryBuffer`` from it.

    mmengine's ``HistoryBuffer.__setstate__`` merges the file's ``statistics_methods`` into a
    table shared by the class (a file could make every later ``statistics('mean')`` return
    the max) and puts any other key of the state on the instance. This stand-in accepts the
    state mmengine writes and nothing else (each statistic named by its own method, the
    history arrays, ``max_length``); the buffer is then made by ``HistoryBuffer``'s own
    constructor, which leaves the class table as it is. (torch's weights-only unpickler keeps
    the object it created for the file's class, so the buffer cannot be made during
    unpickling: :func:`safe_load` hands what it loaded to :func:`from_plain`.)
    """

    def __setstate__(self, state: Any) -> None:
        methods = state.get('statistics_methods', {}) if isinstance(state, dict) else None
        if not (isinstance(methods, dict) and set(state) <= _HISTORY_BUFFER_STATE and
                all(name in _HISTORY_BUFFER_STATISTICS and method is HistoryBuffer.__dict__[name]
                    for name, method in methods.items()) and
                isinstance(state.get('max_length'), int) and
                all(isinstance(state.get(key), np.ndarray)
                    for key in ('_log_history', '_count_history')) and
                state['_log_history'].shape == state['_count_history'].shape):
            raise pickle.UnpicklingError(
                'Unsupported state: a HistoryBuffer state other than mmengine writes '
                f'(keys {sorted(state) if isinstance(state, dict) else type(state).__name__}, '
                f'statistics {methods!r:.200})')
        self.log_history: np.ndarray = state['_log_history']
        self.count_history: np.ndarray = state['_count_history']
        self.max_length: int = state['max_length']

    def history_buffer(self) -> HistoryBuffer:
        """The ``HistoryBuffer`` the file holds, with its numbers, dtypes and length."""
        return HistoryBuffer(self.log_history, self.count_history, self.max_length)


# Key of the dicts that stand for numpy values and HistoryBuffers in a plain checkpoint.
PLAIN_TAG = '__vitdense_plain__'
_KEEP = object()


def _walk(obj: Any, convert: Callable[[Any], Any]) -> Any:
    """``obj`` with ``convert`` applied top-down to every value of its dicts, lists and tuples
    (``convert`` returns ``_KEEP`` to descend). A container none of whose members changed is
    returned as it is, so tensors and an ``OrderedDict``'s ``_metadata`` stay untouched."""
    new = convert(obj)
    if new is not _KEEP:
        return new
    if isinstance(obj, dict):
        items = {key: _walk(value, convert) for key, value in obj.items()}
        if all(items[key] is obj[key] for key in obj):
            return obj
        out = copy.copy(obj)
        out.update(items)
        return out
    if type(obj) in (list, tuple):
        items = [_walk(value, convert) for value in obj]
        return obj if all(a is b for a, b in zip(items, obj)) else type(obj)(items)
    return obj


def _numpy_as_tensor(value: np.ndarray | np.generic) -> torch.Tensor | None:
    """A tensor with ``value``'s dtype, shape and numbers, or None where torch has no such
    dtype."""
    try:
        return torch.from_numpy(np.array(value, order='C'))
    except TypeError:
        return None


def _to_plain(obj: Any) -> Any:
    if isinstance(obj, HistoryBuffer):
        logs, counts = obj.data
        return {PLAIN_TAG: 'HistoryBuffer', 'max_length': int(obj.max_length),
                'log_history': to_plain(logs), 'count_history': to_plain(counts)}
    if isinstance(obj, (np.ndarray, np.generic)):
        data = _numpy_as_tensor(obj)
        if data is not None:
            return {PLAIN_TAG: 'ndarray' if isinstance(obj, np.ndarray) else 'numpy_scalar',
                    'data': data}
    return _KEEP


def _from_plain(obj: Any) -> Any:
    if isinstance(obj, _HistoryBufferFromFile):
        return obj.history_buffer()
    if not (isinstance(obj, dict) and PLAIN_TAG in obj):
        return _KEEP
    kind = obj[PLAIN_TAG]
    if kind in ('ndarray', 'numpy_scalar') and isinstance(obj.get('data'), torch.Tensor):
        array = obj['data'].cpu().numpy()  # Runner.resume maps the whole file to its device
        return array if kind == 'ndarray' else array[()]
    if kind == 'HistoryBuffer' and isinstance(obj.get('max_length'), int):
        logs, counts = from_plain(obj['log_history']), from_plain(obj['count_history'])
        if isinstance(logs, np.ndarray) and isinstance(counts, np.ndarray) and \
                logs.shape == counts.shape:
            return HistoryBuffer(logs, counts, obj['max_length'])
    raise ValueError(f'not plain checkpoint data vitdense writes: {PLAIN_TAG}={kind!r} with '
                     f'keys {sorted(obj)}')


def to_plain(obj: Any) -> Any:
    """``obj`` with its numpy arrays and scalars and mmengine ``HistoryBuffer`` s as dicts of
    tensors and builtins, which ``torch.load`` reads with its defaults (``weights_only=True``,
    no allow-list); :func:`from_plain` rebuilds them exactly (dtype, shape, numbers)."""
    return _walk(obj, _to_plain)


def from_plain(obj: Any) -> Any:
    """What :func:`to_plain` was given, and the ``HistoryBuffer`` s of a file mmengine wrote
    built from the states :func:`safe_load` checked; other data is returned as it is."""
    return _walk(obj, _from_plain)
