"""Shared by all tests.

- vitdense's host fixes (``vitdense.compat``: mmcv-lite's ops) are applied, as every
  vitdense tool applies them, before any test imports mmcv.ops through mmdet or mmseg.
- mmengine resolves each ``mmdet::`` / ``mmseg::`` / ``mmpretrain::`` config base by parsing
  the package's ~400 metafiles (about a second) and, for ``_base_`` files, raising ValueError;
  the answer is fixed for a session, so it is memoised (config tests resolve hundreds).
- mmengine's default scope is process-wide and building a config's model sets it: each test
  leaves it as it found it, so no test depends on which ran before it.
- Fixtures that several test folders use.
"""
import functools
from pathlib import Path

import numpy as np
import pytest
from mmengine.config import config as mmengine_config
from mmengine.registry import DefaultScope
from PIL import Image

from vitdense.compat import apply_host_fixes

apply_host_fixes()


def _memoised(lookup):
    answers: dict = {}

    @functools.wraps(lookup)
    def memoised(package_path: str, cfg_file: str) -> str:
        key = (package_path, cfg_file)
        if key not in answers:
            try:
                answers[key] = lookup(package_path, cfg_file)
            except ValueError as error:
                answers[key] = error
        if isinstance(answers[key], ValueError):
            raise answers[key]
        return answers[key]
    return memoised


mmengine_config._get_external_cfg_path = _memoised(mmengine_config._get_external_cfg_path)


@pytest.fixture
def image_folder(tmp_path: Path) -> Path:
    """``tmp_path/images`` holding two random 64×48 RGB pictures, ``one.jpg`` and ``two.jpg``."""
    folder = tmp_path / 'images'
    folder.mkdir()
    rng = np.random.default_rng(0)
    for name in ('one', 'two'):
        Image.fromarray(rng.integers(0, 255, (48, 64, 3), dtype=np.uint8)).save(
            folder / f'{name}.jpg')
    return folder


@pytest.fixture
def iteration_clock(monkeypatch):
    """``TimeBudgetHook(clock='iterations')`` reads :class:`common.IterationClock`: one
    second per finished iteration, a reproducible time budget."""
    from common import IterationClock
    from vitdense.engine import TimeBudgetHook
    monkeypatch.setitem(TimeBudgetHook.CLOCKS, 'iterations', lambda: IterationClock.now[0])


def _restore_default_scope():
    saved = DefaultScope._instance_dict.copy()
    yield
    DefaultScope._instance_dict = saved


#: mmengine's default scope restored after each test, as its own
#: ``DefaultScope.overwrite_default_scope`` does, and after each module (module-scoped
#: fixtures, such as runners shared by a module's tests, set it before any test starts)
default_scope_as_found = pytest.fixture(autouse=True)(_restore_default_scope)
module_default_scope_as_found = pytest.fixture(autouse=True, scope='module')(
    _restore_default_scope)
