"""vitdense/engine/tool_config.py, the command-line safety of the tools: mistyped --cfg-options
keys, Runner keys, the process-group timeout, a config loaded for a launcher leaving the
process alone, and the safety hooks added once."""
from __future__ import annotations

import ctypes
import subprocess
import sys

import pytest
import torch

from vitdense.engine.tool_config import add_safety_hooks, load_config

from common import CHECKOUT_ENV, REPO_ROOT

CONFIG = str(REPO_ROOT / 'configs/xcit/upernet_xcit-d6-p8_demo-ade.py')


def test_mistyped_top_level_key_names_the_nearest(tmp_path):
    with pytest.raises(KeyError, match=r"no top-level key 'train_dataloder'.*"
                                       r"did you mean 'train_dataloader'\?"):
        load_config(CONFIG, {'train_dataloder.batch_size': 2}, 'none', str(tmp_path))


def test_runner_keys_absent_from_the_config_are_accepted(tmp_path):
    cfg = load_config(CONFIG, {'randomness.deterministic': True,
                                  'train_dataloader.batch_size': 2}, 'none', str(tmp_path))
    assert cfg.randomness.deterministic and cfg.train_dataloader.batch_size == 2


def test_dist_timeout_reaches_the_process_group_config(tmp_path):
    cfg = load_config(CONFIG, None, 'none', str(tmp_path), dist_timeout=120)
    assert cfg.env_cfg.dist_cfg.timeout == 120
    with pytest.raises(ValueError, match='--dist-timeout must be positive'):
        load_config(CONFIG, None, 'none', str(tmp_path), dist_timeout=0)


@pytest.mark.skipif(not sys.platform.startswith('linux'), reason='prctl')
def test_loading_a_config_for_a_launcher_leaves_the_process_alone(tmp_path):
    excepthook, pdeathsig = sys.excepthook, ctypes.c_int(-1)
    cfg = load_config(CONFIG, None, 'pytorch', str(tmp_path))
    assert cfg.launcher == 'pytorch' and sys.excepthook is excepthook
    assert not torch.distributed.is_initialized()
    assert 'collect_device' not in str(cfg.test_evaluator)  # join_job's, when launched
    pr_get_pdeathsig = 2
    ctypes.CDLL(None).prctl(pr_get_pdeathsig, ctypes.byref(pdeathsig))
    assert pdeathsig.value == 0  # no parent-death signal asked for


def test_loading_a_config_imports_no_host_library(tmp_path):
    # in a fresh interpreter: this one has imported the hosts for other tests
    script = ('import sys\n'
              'from vitdense.engine.tool_config import load_config\n'
              f'load_config({CONFIG!r}, None, "none", {str(tmp_path)!r})\n'
              'print(sorted({m.split(".")[0] for m in sys.modules} & '
              '{"mmcv", "mmdet", "mmseg", "mmpretrain"}))\n')
    out = subprocess.run([sys.executable, '-c', script], env=CHECKOUT_ENV, check=True,
                         capture_output=True, text=True).stdout
    assert out.strip() == '[]', out


def test_safety_hooks_added_once(tmp_path):
    cfg = load_config(CONFIG, None, 'none', str(tmp_path))
    add_safety_hooks(cfg, max_nonfinite=2)
    add_safety_hooks(cfg)
    types = [hook['type'] for hook in cfg.custom_hooks]
    assert types.count('vitdense.ExactResumeHook') == 1
    assert [h for h in cfg.custom_hooks if h['type'] == 'vitdense.NonFiniteGuardHook'] == [
        dict(type='vitdense.NonFiniteGuardHook', max_consecutive=2)]
