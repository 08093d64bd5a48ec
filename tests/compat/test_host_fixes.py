"""The host fixes (``vitdense.compat``): the default install's start-up file serves mmcv-lite's
ops to every interpreter without importing vitdense, ``import vitdense`` applies nothing, host
libraries import and resolve package config bases without vitdense, ``python -m
vitdense.compat`` runs a script with the fix, and a fix meets a library version it was not
written for by turning itself off with a warning naming it."""
from __future__ import annotations

import importlib.util
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from vitdense.compat.mmcv_finder import (STARTUP_FILE, STARTUP_LINE, remove_startup_file,
                                         write_startup_file)

from common import CHECKOUT_ENV, REPO_ROOT

MMCV_LITE = importlib.util.find_spec('mmcv._ext') is None or \
    importlib.util.find_spec('mmcv._ext').origin.endswith('vitdense/compat/mmcv_ext.py')


def _python(code: str, *args: str, cwd: Path = REPO_ROOT) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter of this environment with this checkout's vitdense."""
    return subprocess.run([sys.executable, '-c', code, *args], cwd=cwd, capture_output=True,
                          text=True, env=CHECKOUT_ENV)


def test_host_libraries_load_our_configs_without_vitdense(tmp_path):
    result = _python(
        'import sys\n'
        'from mmengine.config import Config\n'
        "cfg = Config.fromfile(sys.argv[1], import_custom_modules=False)\n"
        "assert 'vitdense' not in sys.modules, 'imported vitdense'\n"
        'print(cfg.model.type, cfg.default_hooks.checkpoint.type)\n',
        str(REPO_ROOT / 'configs/xcit/mask-rcnn_xcit-s12-p16_fpn_3x_coco.py'), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ['MaskRCNN', 'vitdense.SafeCheckpointHook']


@pytest.mark.skipif(not MMCV_LITE, reason='a compiled mmcv._ext is installed')
def test_default_install_serves_mmcv_ext_to_every_interpreter():
    result = _python('import sys\n'
                     "finders = [type(f).__module__ for f in sys.meta_path if 'vitdense' in "
                     'type(f).__module__]\n'
                     "loaded = sorted(n for n in sys.modules if n.split('.')[0] in "
                     "('torch', 'mmcv', 'vitdense'))\n"
                     'import mmdet.models, mmdet.apis, mmseg.models, mmseg.apis\n'
                     "print(finders, loaded, sys.modules['mmcv._ext'].__file__, "
                     "'vitdense' in sys.modules)\n")
    assert result.returncode == 0, result.stderr[-2000:]
    # at start-up: one finder, loaded from its own file, and nothing else of ours or torch's
    assert result.stdout.split() == [
        "['vitdense.compat.mmcv_finder']", "['vitdense.compat.mmcv_finder']",
        str(REPO_ROOT / 'vitdense/compat/mmcv_ext.py'), 'False']


def test_startup_file_is_the_one_line_and_rewriting_it_is_idempotent(tmp_path):
    site = sysconfig.get_paths()['purelib']
    assert (Path(site) / STARTUP_FILE).read_text() == STARTUP_LINE  # tools/install.sh wrote it
    path = Path(write_startup_file(str(tmp_path)))
    stamp = path.stat().st_mtime_ns
    assert write_startup_file(str(tmp_path)) == str(path) and path.stat().st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == [STARTUP_FILE]
    remove_startup_file(str(tmp_path))
    assert list(tmp_path.iterdir()) == []


WITHOUT_STARTUP_FINDER = """import sys
sys.meta_path[:] = [f for f in sys.meta_path if 'vitdense' not in type(f).__module__]
"""


@pytest.mark.skipif(not MMCV_LITE, reason='a compiled mmcv._ext is installed')
def test_without_the_startup_file_mmcv_ops_are_served_only_after_apply_host_fixes():
    result = _python(WITHOUT_STARTUP_FINDER +
                     'import vitdense\n'
                     'try:\n'
                     '    import mmcv.ops\n'
                     'except ImportError as error:\n'
                     '    print(type(error).__name__, error.name)\n'
                     'from vitdense.compat import apply_host_fixes\n'
                     'apply_host_fixes()\n'
                     "for name in [n for n in sys.modules if n.startswith('mmcv.ops')]:\n"
                     '    del sys.modules[name]\n'
                     'import mmcv.ops, mmdet.models, mmseg.models\n'
                     "print(sys.modules['mmcv._ext'].__file__)\n")
    assert result.returncode == 0, result.stderr[-2000:]
    refused, served = result.stdout.splitlines()
    assert refused == 'ModuleNotFoundError mmcv._ext'  # import vitdense installed nothing
    assert served.endswith('/vitdense/compat/mmcv_ext.py')


@pytest.mark.skipif(not MMCV_LITE, reason='a compiled mmcv._ext is installed')
def test_finder_steps_aside_for_a_compiled_extension_and_for_another_mmcv(tmp_path):
    (tmp_path / '_ext.py').write_text('COMPILED = True\n')
    result = _python('import sys, mmcv\n'
                     'mmcv.__path__.append(sys.argv[1])\n'
                     'import mmcv._ext\n'
                     "print(getattr(mmcv._ext, 'COMPILED', False))\n", str(tmp_path))
    assert result.returncode == 0 and result.stdout.split() == ['True'], result.stderr[-2000:]
    result = _python('import importlib.metadata, sys\n'
                     'real = importlib.metadata.distribution\n'
                     'def distribution(name):\n'
                     "    if name == 'mmcv-lite':\n"
                     '        raise importlib.metadata.PackageNotFoundError(name)\n'
                     '    return real(name)\n'
                     'importlib.metadata.distribution = distribution  # mmcv, not mmcv-lite\n'
                     'import mmcv.ops\n')
    assert result.returncode != 0 and "No module named 'mmcv._ext'" in result.stderr


@pytest.mark.skipif(not MMCV_LITE, reason='a compiled mmcv._ext is installed')
def test_fix_for_another_mmcv_version_is_off_with_a_warning():
    result = _python("import mmcv; mmcv.__version__ = '2.2.0'\n"
                     'from vitdense.compat import apply_host_fixes\n'
                     'apply_host_fixes()\n'
                     'import mmcv.ops\n')
    assert result.returncode != 0 and "No module named 'mmcv._ext'" in result.stderr
    assert ('vitdense host fix "torch-native mmcv ops" is off: it was written for '
            'mmcv>=2.0.0,<2.2.0 and mmcv 2.2.0 is installed') in result.stderr


def test_python_m_vitdense_compat_runs_a_script_with_the_fix(tmp_path):
    script = tmp_path / 'script.py'
    script.write_text('import sys\n'
                      'import mmcv.ops\n'
                      "finders = [f for f in sys.meta_path if 'vitdense' in type(f).__module__]\n"
                      "print(__name__, sys.argv[1:], len(finders), "
                      "sys.modules['mmcv._ext'].__file__)\n")
    result = subprocess.run([sys.executable, '-m', 'vitdense.compat', str(script), 'a', '--b'],
                            cwd=tmp_path, capture_output=True, text=True, env=CHECKOUT_ENV)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ['__main__', "['a',", "'--b']", '1',
                                     str(REPO_ROOT / 'vitdense/compat/mmcv_ext.py')]
