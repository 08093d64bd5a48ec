"""The host fixes (``vitdense.compat``): the start-up file of ``vitdense-mmcv-ext`` serves
mmcv-lite's ops to every interpreter without importing vitdense, pip installs it with
``vitdense[openmmlab]`` (editable or not) and removes it with ``pip uninstall``, ``import
vitdense`` applies nothing, host libraries import and resolve package config bases without
vitdense, ``python -m vitdense.compat`` runs a script with the fix, a fix meets a library
version it was not written for by turning itself off with a warning naming it, and the launch
scripts put no empty entry on the module path."""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

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


EXT = 'packaging/vitdense-mmcv-ext'
#: a host entry point reaching a served op, run from a folder outside any checkout
NMS = ("import sys, torch, mmcv.ops\n"
       "_, keep = mmcv.ops.nms(torch.tensor([[0., 0, 10, 10], [1, 1, 11, 11]]), "
       "torch.tensor([0.9, 0.8]), 0.5)\n"
       "print(keep.tolist(), sys.modules['mmcv._ext'].__file__, 'vitdense' in sys.modules)\n")


@pytest.mark.skipif(not MMCV_LITE, reason='a compiled mmcv._ext is installed')
@pytest.mark.parametrize('editable', [False, True], ids=['regular', 'editable'])
def test_pip_installs_and_uninstalls_the_mmcv_ops_startup_file(tmp_path, editable):
    # A fresh environment whose module path reaches this one's packages (torch, mmcv-lite,
    # the hosts) through a path entry, so that nothing big is installed again.
    source, venv, elsewhere = tmp_path / 'src', tmp_path / 'venv', tmp_path / 'elsewhere'
    # (a copy of the sources: pip builds in the source folder)
    for name in ('vitdense', EXT):
        shutil.copytree(REPO_ROOT / name, source / name,
                        ignore=shutil.ignore_patterns('__pycache__', 'build', '*.egg-info'))
    for name in ('setup.py', 'README.md'):
        shutil.copy(REPO_ROOT / name, source / name)
    subprocess.run([sys.executable, '-m', 'venv', '--without-pip', str(venv)], check=True)
    python = venv / 'bin' / 'python'
    site = Path(subprocess.run([python, '-c', 'import sysconfig; print(sysconfig.get_paths()'
                                "['purelib'])"], capture_output=True, text=True,
                               check=True).stdout.strip())
    (site / 'stack.pth').write_text(sysconfig.get_paths()['purelib'] + '\n')
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
    elsewhere.mkdir()

    def run(*args: str | Path) -> subprocess.CompletedProcess:
        return subprocess.run([python, *map(str, args)], cwd=elsewhere, capture_output=True,
                              text=True, env=env)

    # no installer: pip alone, the extra naming vitdense-mmcv-ext, no index
    pip = ['-m', 'pip', 'install', '--no-index', '--no-build-isolation',
           '--disable-pip-version-check', *(['-e'] if editable else [])]
    installed = run(*pip, f'{source}[openmmlab]', source / EXT)
    assert installed.returncode == 0, installed.stdout[-2000:] + installed.stderr[-2000:]
    served = run('-c', NMS)
    assert served.returncode == 0, served.stderr[-2000:]
    assert served.stdout.split() == ['[0]', str(site / 'vitdense/compat/mmcv_ext.py')
                                     if not editable else
                                     str(source / 'vitdense/compat/mmcv_ext.py'), 'False']
    record = run('-c', "from importlib.metadata import files; "
                       "print(sorted(str(f) for f in files('vitdense-mmcv-ext')))")
    assert 'vitdense-mmcv-ext.pth' in record.stdout, record.stdout + record.stderr

    removed = run('-m', 'pip', 'uninstall', '-y', '--disable-pip-version-check', 'vitdense',
                  'vitdense-mmcv-ext')
    assert removed.returncode == 0, removed.stderr[-2000:]
    assert sorted(p.name for p in site.iterdir()) == ['stack.pth']  # no vitdense file left
    refused = run('-c', NMS)
    assert "No module named 'mmcv._ext'" in refused.stderr, refused.stdout + refused.stderr


def test_launch_scripts_add_no_empty_module_path_entry(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
    script = f'source {REPO_ROOT}/tools/python_env.sh; printf %s "$PYTHONPATH"'
    alone = subprocess.run(['bash', '-c', script], capture_output=True, text=True, env=env)
    assert alone.stdout == str(REPO_ROOT), alone.stderr
    joined = subprocess.run(['bash', '-c', script], capture_output=True, text=True,
                            env={**env, 'PYTHONPATH': str(tmp_path)})
    assert joined.stdout == f'{REPO_ROOT}:{tmp_path}', joined.stderr


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
