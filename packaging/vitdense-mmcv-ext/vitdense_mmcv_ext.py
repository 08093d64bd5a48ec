"""Registers vitdense's ``mmcv._ext`` finder at interpreter start (``vitdense-mmcv-ext.pth``).

The finder (``vitdense/compat/mmcv_finder.py``) is loaded by its file path, found through
vitdense's installed location, so that start-up imports neither torch nor the ``vitdense``
package. Where vitdense is not installed this does nothing.
"""
from __future__ import annotations

import importlib.util
import os.path as osp
import sys

FINDER = 'vitdense.compat.mmcv_finder'


def register_finder() -> None:
    """Load ``vitdense/compat/mmcv_finder.py`` (once) and put its finder on ``sys.meta_path``."""
    if FINDER not in sys.modules:
        package = importlib.util.find_spec('vitdense')
        if package is None or not package.submodule_search_locations:
            return
        path = osp.join(package.submodule_search_locations[0], 'compat', 'mmcv_finder.py')
        if not osp.isfile(path):
            return
        spec = importlib.util.spec_from_file_location(FINDER, path)
        sys.modules[FINDER] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    sys.modules[FINDER].register()
