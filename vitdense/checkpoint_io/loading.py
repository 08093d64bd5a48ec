"""Checkpoint files loaded safely, with errors that name the file.

mmengine 0.10 calls ``torch.load`` without ``weights_only``, so a checkpoint that
mmengine's own hook wrote (``resume``, ``load_from``, ``init_cfg=dict(type='Pretrained')``) is
refused with ``Unsupported global: GLOBAL mmengine.logging.history_buffer.HistoryBuffer`` (and
numpy arrays / scalars in the message hub). Turning ``weights_only`` off would let any
checkpoint run code on load. :func:`safe_load` keeps ``weights_only=True`` (passed
explicitly, so ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` cannot turn it off) and allows, for that
one call, exactly what ``Runner.save_checkpoint`` writes besides tensors and builtins
(:data:`ALLOWED_GLOBALS`, found by saving a real checkpoint and listing
``torch.serialization.get_unsafe_globals_in_checkpoint``): numpy arrays, dtypes and scalars,
mmengine's ``HistoryBuffer`` (as :class:`_HistoryBufferFromFile`, which accepts only the state
mmengine writes and leaves the class-wide statistics table alone), the
``getattr(HistoryBuffer, 'min')``-style references that ``HistoryBuffer.__getstate__`` pickles
(served by a ``getattr`` that resolves nothing but HistoryBuffer's own statistics methods), and
``bytes()``, as the data of an empty array pickles (``bytes(n)`` would let a file allocate any
amount of memory); and ``argparse.Namespace``, the options timm's ``train.py`` saves beside its
weights (timm's own loader allows it too). Nothing is added to torch's process-wide allow-list.
:func:`use_safe_loading` makes mmengine's local-file scheme (``CheckpointLoader``) load
through :func:`safe_load`; :class:`vitdense.SafeCheckpointHook` and vitdense's tools call it,
so a config naming that hook gets it. :func:`load_checkpoint` loads one file the same way
without registering anything, for library code (``Pretrained`` initialisation of our
backbones, :func:`vitdense.cls.build_teacher`).

Errors: a file asking for a global outside the allow-list raises
:class:`UnsafeCheckpointError` naming the file and the global, without torch's advice to
turn ``weights_only`` off; an empty, truncated or garbled file raises
:class:`CorruptCheckpointError` naming the file and what is wrong with it (torch says
``PytorchStreamReader failed reading zip archive``, a bare ``EOFError`` or ``Unsupported
operand``, without the file's name).
The other schemes of ``CheckpointLoader`` (http, open-mmlab, ceph, ...) call ``torch.load``
without ``weights_only``; :func:`use_safe_loading` re-registers each as
:func:`load_from_remote`, which fetches the file as the scheme would and reads it with
:func:`safe_load`, the process environment untouched.
"""
from __future__ import annotations

import argparse
import io
import os
import os.path as osp
import pickle
import re
import zipfile
from typing import Any, Callable
from urllib.parse import urlparse

import numpy as np
import torch
from mmengine.fileio import get_file_backend
from mmengine.logging.history_buffer import HistoryBuffer
from mmengine.runner import checkpoint as mmengine_checkpoint
from mmengine.runner.checkpoint import CheckpointLoader

from vitdense.internals import checkpoint_loader_for, checkpoint_schemes
from .plain import _HISTORY_BUFFER_STATISTICS, _HistoryBufferFromFile, from_plain
from vitdense.torchscript_weights import is_torchscript_archive, read_torchscript_weights


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


def _history_buffer_getattr(obj: Any, name: str) -> Callable:
    """``getattr`` as HistoryBuffer pickles need it, and nothing else.

    ``HistoryBuffer.__getstate__`` stores its statistics methods, which pickle as
    ``getattr(HistoryBuffer, 'mean')`` (``HistoryBuffer`` resolving to
    :class:`_HistoryBufferFromFile`); only those built-in statistics resolve.
    """
    if obj is _HistoryBufferFromFile and name in _HISTORY_BUFFER_STATISTICS:
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
    # timm train.py checkpoints keep the command line's options (as timm's own loader allows)
    argparse.Namespace,
    (_HistoryBufferFromFile, 'mmengine.logging.history_buffer.HistoryBuffer'),
    (_history_buffer_getattr, 'builtins.getattr'),
    (_empty_bytes, 'builtins.bytes'),
    *_numpy_globals(),
]

_GLOBAL_RE = re.compile(r'GLOBAL (\S+)|GETATTR (\S+)|unrecognized function (.+?)(?: which|$)|'
                        r"but got <class '([^']+)'>|Unsupported state: (.+?) \(", re.M)


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
    if match.group(4):
        return f'an instance of `{match.group(4)}`'
    return match.group(5)


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
    """``torch.load(f, weights_only=True)`` with the allow-list and a clear refusal; plain
    data written by :func:`to_plain` comes back as the numpy values and HistoryBuffers it was.

    A TorchScript archive (OpenAI's CLIP files), which ``torch.load`` refuses weights-only,
    gives its modules' tensors as a state dict, read without running its code
    (:func:`vitdense.torchscript_weights.read_torchscript_weights`).

    Raises :class:`UnsafeCheckpointError` for a file that asks for a global outside the
    allow-list and :class:`CorruptCheckpointError` for an empty, truncated or garbled file.
    ``mmap=True`` (a file path only) maps the tensors instead of reading them: the archive and
    every global are still checked, for the cost of reading the pickle alone, which is how
    a checkpoint is vetted before the Runner loads it.
    """
    is_path = isinstance(f, (str, bytes)) or hasattr(f, '__fspath__')
    name = os.fsdecode(f) if is_path else repr(f)
    if is_path and osp.isfile(name) and zipfile.is_zipfile(name):
        with zipfile.ZipFile(name) as archive:
            torchscript = is_torchscript_archive(archive)
        if torchscript:
            try:
                return read_torchscript_weights(name, map_location)
            except pickle.UnpicklingError as refused:
                raise UnsafeCheckpointError(name, 'a global of a TorchScript archive',
                                            str(refused)) from None
    try:
        with torch.serialization.safe_globals(ALLOWED_GLOBALS):
            loaded = torch.load(f, map_location=map_location, weights_only=True, mmap=mmap)
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
    try:
        return from_plain(loaded)
    except ValueError as err:
        raise CorruptCheckpointError(name, str(err)) from None


def load_from_local(filename: str, map_location: Any = None) -> Any:
    """mmengine's local-file checkpoint scheme, loading through :func:`safe_load`."""
    filename = osp.expanduser(filename)
    if not osp.isfile(filename):
        raise FileNotFoundError(f'{filename} can not be found.')
    return safe_load(filename, map_location)


def _remote_file(filename: str) -> str | bytes:
    """Where mmengine's scheme of ``filename`` finds the file: a local path (a URL's copy in
    torch's hub cache, as mmengine's ``load_from_http`` keeps it; a named model's file) or
    the bytes of an s3 / petrel object."""
    if re.match(r'(\S+:)?(s3|petrel)://', filename):
        return get_file_backend(filename, backend_args={'backend': 'petrel'}).get(filename)
    scheme, name = filename.split('://', 1)
    if scheme in ('torchvision', 'modelzoo'):
        filename = mmengine_checkpoint.get_torchvision_models()[name]
    elif scheme == 'mmcls':
        filename = mmengine_checkpoint.get_mmcls_models()[name]
    elif scheme in ('open-mmlab', 'openmmlab'):
        name = mmengine_checkpoint.get_deprecated_model_names().get(name, name)
        filename = mmengine_checkpoint.get_external_models()[name]
        if not filename.startswith(('http://', 'https://')):
            return osp.join(mmengine_checkpoint._get_mmengine_home(), filename)
    elif scheme not in ('http', 'https'):
        raise ValueError(f'{filename}: checkpoints of the {scheme}:// scheme cannot be read '
                         f'weights-only here; copy the file and load its local path')
    cached = osp.join(torch.hub.get_dir(), 'checkpoints', osp.basename(urlparse(filename).path))
    if not osp.isfile(cached):
        os.makedirs(osp.dirname(cached), exist_ok=True)
        torch.hub.download_url_to_file(filename, cached)
    return cached


def load_from_remote(filename: str, map_location: Any = None) -> Any:
    """Every scheme of mmengine's ``CheckpointLoader`` but local files (http(s), the named
    models of open-mmlab / torchvision / mmcls, s3 / petrel), fetched as mmengine fetches
    them and read by :func:`safe_load`: ``weights_only=True`` passed explicitly, nothing in
    the process environment changed (mmengine's own loaders call ``torch.load`` without it,
    and ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` would turn them unsafe)."""
    found = _remote_file(filename)
    if isinstance(found, bytes):
        with io.BytesIO(found) as buffer:
            return safe_load(buffer, map_location)
    checkpoint = safe_load(found, map_location)
    if filename.startswith('mmcls://'):
        checkpoint = mmengine_checkpoint._process_mmcls_checkpoint(checkpoint)
    return checkpoint


def use_safe_loading() -> None:
    """Have mmengine load every checkpoint safely (idempotent).

    ``CheckpointLoader.register_scheme`` is mmengine's own extension point for loaders: local
    paths (prefix ``''``, what ``load_from``, ``resume`` and ``Pretrained`` use) load with
    :func:`load_from_local`; every other scheme registered by then with
    :func:`load_from_remote`. Called by :class:`vitdense.SafeCheckpointHook`, i.e. by a
    config that names it, and by vitdense's tools; call it yourself to load a Runner checkpoint
    elsewhere, e.g. as ``Pretrained`` weights of a model built outside a Runner.
    """
    CheckpointLoader.register_scheme(prefixes='', loader=load_from_local, force=True)
    for prefix, loader in checkpoint_schemes().items():
        if prefix and loader is not load_from_remote:
            CheckpointLoader.register_scheme(prefix, load_from_remote, force=True)


def load_checkpoint(filename: str, map_location: Any = 'cpu') -> Any:
    """``CheckpointLoader.load_checkpoint`` loading weights-only for every scheme, registering
    nothing: a local file through :func:`safe_load`, any other scheme weights-only with a
    refusal naming the file. For library code that loads a file it was given
    (``Pretrained`` initialisation of our backbones, :func:`vitdense.cls.build_teacher`)."""
    if checkpoint_loader_for(filename) is checkpoint_schemes().get(''):
        return load_from_local(filename, map_location)
    return load_from_remote(filename, map_location)
