"""The weights of a TorchScript archive, read without running its code.

Some releases are TorchScript archives (OpenAI's CLIP ``.pt`` files): ``torch.load`` with
``weights_only=True`` refuses them, and ``torch.jit.load`` runs the archive's code. The
archive's ``data.pkl`` pickles the module tree: each module an object of a ``__torch__.*``
class whose state is its attributes (parameters and buffers as tensors, submodules as such
objects), each tensor ``torch._utils._rebuild_tensor_v2`` of a storage in ``data/<key>``.
:func:`read_torchscript_weights` unpickles it with a reader that builds those module objects
as plain attribute holders and allows no other global than the tensor rebuild, torch's
storage types and ``OrderedDict``; the tensors come back as a state dict named by attribute
paths (``visual.conv1.weight``). Nothing of the archive's ``code/`` is read.
"""
from __future__ import annotations

import collections
import io
import pickle
import sys
import warnings
import zipfile
from typing import Any, Iterator

import torch

#: what marks a TorchScript archive among torch's zip archives
CODE_FOLDER = '/code/'


class _ScriptModule:
    """A module of the archive as data: its attributes, set by the pickle's BUILD."""


def is_torchscript_archive(archive: zipfile.ZipFile) -> bool:
    """Whether a torch zip archive holds TorchScript code (beside its ``data.pkl``)."""
    names = archive.namelist()
    return any(CODE_FOLDER in name for name in names) and any(
        name.endswith('/constants.pkl') for name in names)


class _WeightsUnpickler(pickle.Unpickler):
    """``data.pkl`` of a TorchScript archive with tensors from ``data/`` and modules as
    :class:`_ScriptModule`; any other global is refused."""

    def __init__(self, archive: zipfile.ZipFile, root: str, map_location: Any) -> None:
        super().__init__(io.BytesIO(archive.read(f'{root}/data.pkl')))
        self.archive, self.root, self.map_location = archive, root, map_location

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ('torch._utils', '_rebuild_tensor_v2'):
            return torch._utils._rebuild_tensor_v2
        if (module, name) == ('collections', 'OrderedDict'):
            return collections.OrderedDict
        if module == 'torch' and name.endswith('Storage') and isinstance(
                getattr(torch, name, None), type) and hasattr(getattr(torch, name), 'dtype'):
            return getattr(torch, name)
        if module == '__torch__' or module.startswith('__torch__.'):
            return _ScriptModule
        raise pickle.UnpicklingError(f'a TorchScript archive asks for {module}.{name}, which '
                                     f'its weights do not need')

    def persistent_load(self, pid: Any) -> torch.storage.TypedStorage:
        kind, storage_type, key, _, _ = pid
        if kind != 'storage':
            raise pickle.UnpicklingError(f'unknown persistent record {kind!r}')
        data = bytearray(self.archive.read(f'{self.root}/data/{key}'))
        storage = torch.UntypedStorage.from_buffer(data, dtype=torch.uint8) if data else \
            torch.UntypedStorage(0)
        if isinstance(self.map_location, (str, torch.device)):
            storage = storage.to(device=torch.device(self.map_location))
        return torch.storage.TypedStorage(wrap_storage=storage, dtype=storage_type.dtype,
                                          _internal=True)


def _named_tensors(module: _ScriptModule, prefix: str = '') -> Iterator[tuple[str, Any]]:
    for name, value in vars(module).items():
        if isinstance(value, torch.Tensor):
            yield prefix + name, value
        elif isinstance(value, _ScriptModule):
            yield from _named_tensors(value, f'{prefix}{name}.')


def read_torchscript_weights(filename: str, map_location: Any = None) -> dict:
    """The state dict of the TorchScript archive ``filename`` (its modules' tensors named
    by attribute paths), read without running any of its code; ``map_location``: a device
    (name) for the tensors, else they stay on the CPU.

    Raises pickle.UnpicklingError when its ``data.pkl`` asks for anything but modules,
    tensors and their storages, and ValueError for an archive whose tensors are not
    little-endian or that has no ``data.pkl``.
    """
    with zipfile.ZipFile(filename) as archive:
        pickles = [name for name in archive.namelist() if name.endswith('/data.pkl')
                   and name.count('/') == 1]
        if not pickles:
            raise ValueError(f'{filename}: a TorchScript archive without data.pkl')
        root = pickles[0].split('/')[0]
        byte_order = f'{root}/byteorder'
        if byte_order in archive.namelist() and archive.read(byte_order) != b'little' or \
                sys.byteorder != 'little':
            raise ValueError(f'{filename}: the archive\'s tensors are not little-endian '
                             f'as this machine reads them')
        with warnings.catch_warnings():  # the storage types torch keeps for pickles
            warnings.filterwarnings('ignore', message='TypedStorage is deprecated')
            model = _WeightsUnpickler(archive, root, map_location).load()
    if not isinstance(model, _ScriptModule):
        raise pickle.UnpicklingError(f'{filename}: the TorchScript archive holds no module')
    return dict(_named_tensors(model))
