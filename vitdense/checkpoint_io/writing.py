"""Checkpoint files written: atomically, and as plain data.

:func:`atomic_write` (temporary file in the same folder, fsync, rename, fsync of the
folder) leaves a path with either its old or its new content, never a half-written file;
:class:`AtomicLocalBackend` is mmengine's local file backend writing that way, registered as
``vitdense_atomic_local`` for ``backend_args=dict(backend='vitdense_atomic_local')``.
:func:`save_plain` writes a checkpoint as plain data (:mod:`.plain`) that way, and
:func:`plain_checkpoint` rewrites one mmengine wrote.
"""
from __future__ import annotations

import io
import os
import os.path as osp
import tempfile
from typing import Any

import torch
from mmengine.fileio import LocalBackend, register_backend

from .loading import safe_load
from .plain import to_plain


def atomic_write(path: str | os.PathLike, data: bytes | str, overwrite: bool = True) -> None:
    """Write ``data`` to ``path`` so that ``path`` holds either its old or its new content.

    The bytes go to a temporary file in the same folder, are fsynced, and the file is renamed
    over ``path`` (atomic on POSIX); the folder is fsynced so the rename survives a crash.
    ``overwrite=False``: the file is linked to ``path`` instead, which fails with
    FileExistsError if ``path`` exists, also when another process created it meanwhile.
    """
    path = os.fspath(path)
    folder = osp.dirname(osp.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f'.{osp.basename(path)}.', suffix='.tmp', dir=folder)
    try:
        with os.fdopen(fd, 'wb') as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        if overwrite:
            os.replace(tmp, path)
        else:
            try:
                os.link(tmp, path)
            except FileExistsError:
                raise FileExistsError(f'{path} exists; it is kept') from None
            os.remove(tmp)
    except BaseException:
        if osp.exists(tmp):
            os.remove(tmp)
        raise
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


ATOMIC_BACKEND = 'vitdense_atomic_local'


@register_backend(ATOMIC_BACKEND)
class AtomicLocalBackend(LocalBackend):
    """mmengine's local file backend whose writes are atomic (:func:`atomic_write`)."""

    def put(self, obj: bytes, filepath: str | os.PathLike) -> None:
        os.makedirs(osp.dirname(osp.abspath(filepath)), exist_ok=True)
        atomic_write(filepath, obj)

    def put_text(self, obj: str, filepath: str | os.PathLike, encoding: str = 'utf-8') -> None:
        self.put(obj.encode(encoding), filepath)


def save_plain(checkpoint: Any, path: str | os.PathLike, overwrite: bool = True) -> None:
    """Save ``checkpoint`` as plain data (:func:`to_plain`) to ``path``, atomically
    (:func:`atomic_write`, which ``overwrite=False`` makes refuse an existing ``path``): what
    converters and tools write loads with ``torch.load``'s defaults, and a failed save leaves
    ``path`` as it was."""
    buffer = io.BytesIO()
    torch.save(to_plain(checkpoint), buffer)
    atomic_write(path, buffer.getvalue(), overwrite=overwrite)


def plain_checkpoint(src: str | os.PathLike, dst: str | os.PathLike,
                     overwrite: bool = False) -> None:
    """Rewrite the checkpoint ``src`` (read with :func:`safe_load`) as ``dst`` holding plain
    data only (:func:`save_plain`); ``dst`` may exist only with ``overwrite``."""
    if osp.exists(dst) and not overwrite:
        raise FileExistsError(f'{os.fspath(dst)} exists; pass overwrite=True (--overwrite) to '
                              'replace it')
    save_plain(safe_load(src, map_location='cpu'), dst)
