"""mmengine's package look-ups without ``pkg_resources``.

Symptom: setuptools >= 81 no longer ships ``pkg_resources`` (torch 2.14 needs setuptools
>= 77, and the pinned set uses a current one), but mmengine 0.10's
``mmengine.utils.is_installed`` / ``get_installed_path`` / ``package2module`` import it.  Every config whose
``_base_`` names a package file (``'mmdet::_base_/models/mask-rcnn_r50_fpn.py'``), and
``mmengine.hub.get_config`` / ``get_model``, fail with
``ModuleNotFoundError: No module named 'pkg_resources'``.

Fix: the same functions (and ``package2module``, which they use) on
``importlib.metadata``, installed wherever mmengine imported them by name.
"""
from __future__ import annotations

import importlib.util
import os.path as osp
from importlib import metadata

from mmengine.utils import package_utils

__all__ = ['is_installed', 'package2module', 'get_installed_path', 'apply']


def _distribution(package: str) -> metadata.Distribution | None:
    try:
        return metadata.distribution(package)
    except metadata.PackageNotFoundError:
        return None


def is_installed(package: str) -> bool:
    """True if ``package`` is an installed distribution or an importable module."""
    if _distribution(package) is not None:
        return True
    spec = importlib.util.find_spec(package)
    return spec is not None and spec.origin is not None


def package2module(package: str) -> str:
    """Top-level module of an installed distribution ('mmsegmentation' -> 'mmseg')."""
    dist = _distribution(package)
    if dist is None:
        raise metadata.PackageNotFoundError(package)
    top_level = (dist.read_text('top_level.txt') or '').split()
    if top_level:
        return top_level[0]
    packages = sorted({f.parts[0] for f in dist.files or ()
                       if len(f.parts) == 2 and f.name == '__init__.py'})
    if not packages:
        raise ValueError(f'can not infer the module name of {package}')
    return packages[0]


def get_installed_path(package: str) -> str:
    """Directory of ``package`` (distribution name, e.g. 'mmdet' or 'mmsegmentation')."""
    dist = _distribution(package)
    if dist is None:
        spec = importlib.util.find_spec(package)
        if spec is None:
            raise metadata.PackageNotFoundError(package)
        if spec.origin is None:
            raise RuntimeError(f'{package} is a namespace package, which is invalid for '
                               '`get_installed_path`')
        return osp.dirname(spec.origin)
    location = str(dist.locate_file(''))
    possible_path = osp.join(location, package)
    if osp.exists(possible_path):
        return possible_path
    return osp.join(location, package2module(package))


def apply() -> None:
    """Replace mmengine's pkg_resources-based look-ups everywhere it bound them."""
    import mmengine.config.config as config_module
    import mmengine.hub.hub as hub_module
    import mmengine.utils as utils_module
    for module in (package_utils, utils_module, config_module, hub_module):
        for name, func in (('is_installed', is_installed), ('package2module', package2module),
                           ('get_installed_path', get_installed_path)):
            if hasattr(module, name):
                setattr(module, name, func)
