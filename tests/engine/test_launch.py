"""vitdense/engine/launch.py, the command-line safety of the tools: mistyped --cfg-options keys,
--resume with nothing or a bad file to resume, a process-group timeout, workers that die with
their launcher, and the launch scripts' choice of interpreter."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from mmengine.logging import MMLogger

from vitdense.checkpoint_io import CorruptCheckpointError
from vitdense.engine.launch import add_safety_hooks, apply_resume, load_config

from common import REPO_ROOT

CONFIG = str(REPO_ROOT / 'configs/xcit/upernet_xcit-d6-p8_demo-ade.py')


def test_mistyped_top_level_key_names_the_nearest(tmp_path):
    with pytest.raises(KeyError, match=r"no top-level key 'train_dataloder'.*"
                                       r"did you mean 'train_dataloader'\?"):
        load_config(CONFIG, {'train_dataloder.batch_size': 2}, 'none', str(tmp_path))


def test_runner_keys_absent_from_the_config_are_accepted(tmp_path):
    cfg, _ = load_config(CONFIG, {'randomness.deterministic': True,
                                  'train_dataloader.batch_size': 2}, 'none', str(tmp_path))
    assert cfg.randomness.deterministic and cfg.train_dataloader.batch_size == 2


def test_dist_timeout_reaches_the_process_group_config(tmp_path):
    cfg, _ = load_config(CONFIG, None, 'none', str(tmp_path), dist_timeout=120)
    assert cfg.env_cfg.dist_cfg.timeout == 120
    with pytest.raises(ValueError, match='--dist-timeout must be positive'):
        load_config(CONFIG, None, 'none', str(tmp_path), dist_timeout=0)


def test_resume_with_nothing_to_resume_says_so(tmp_path, capfd):
    MMLogger.get_instance(f'resume-{tmp_path.name}')  # a logger writing to this test's stdout
    cfg, _ = load_config(CONFIG, None, 'none', str(tmp_path / 'typo'))
    apply_resume(cfg, 'auto')
    assert not cfg.resume and cfg.load_from is None
    assert 'NOTHING TO RESUME' in capfd.readouterr().out


def test_resume_from_a_named_file_must_load(tmp_path):
    cfg, _ = load_config(CONFIG, None, 'none', str(tmp_path))
    with pytest.raises(FileNotFoundError, match='missing.pth: no such checkpoint'):
        apply_resume(cfg, str(tmp_path / 'missing.pth'))
    (tmp_path / 'empty.pth').write_bytes(b'')
    with pytest.raises(CorruptCheckpointError, match='empty.pth.*empty'):
        apply_resume(cfg, str(tmp_path / 'empty.pth'))
    torch.save({'state_dict': {}}, tmp_path / 'good.pth')
    apply_resume(cfg, str(tmp_path / 'good.pth'))
    assert cfg.resume and cfg.load_from == str(tmp_path / 'good.pth')


def test_safety_hooks_added_once(tmp_path):
    cfg, _ = load_config(CONFIG, None, 'none', str(tmp_path))
    add_safety_hooks(cfg, max_nonfinite=2)
    add_safety_hooks(cfg)
    types = [hook['type'] for hook in cfg.custom_hooks]
    assert types.count('vitdense.ExactResumeHook') == 1
    assert [h for h in cfg.custom_hooks if h['type'] == 'vitdense.NonFiniteGuardHook'] == [
        dict(type='vitdense.NonFiniteGuardHook', max_consecutive=2)]


LAUNCHER = '''
import subprocess, sys, time
worker = subprocess.Popen([sys.executable, '-c', """
import time
from vitdense.engine.launch import exit_with_launcher
exit_with_launcher()
print('ready', flush=True)
time.sleep(60)
"""], stdout=subprocess.PIPE, text=True)
assert worker.stdout.readline().strip() == 'ready'
print(worker.pid, flush=True)
time.sleep(60)
'''


def test_worker_exits_when_its_launcher_is_killed():
    launcher = subprocess.Popen([sys.executable, '-c', LAUNCHER], stdout=subprocess.PIPE,
                                text=True, cwd=REPO_ROOT,
                                env={**os.environ,
                                     'PYTHONPATH': f'{REPO_ROOT}:{REPO_ROOT / "tools"}'})
    worker = int(launcher.stdout.readline())
    launcher.send_signal(signal.SIGKILL)
    launcher.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(worker, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.kill(worker, signal.SIGKILL)
    pytest.fail('the worker outlived its launcher')


def test_launch_script_prefers_the_project_environment(tmp_path):
    # A checkout whose .venv has a python: torchrun.sh runs it, not the one on PATH.
    checkout = tmp_path / 'checkout'
    (checkout / 'tools').mkdir(parents=True)
    (checkout / 'tools' / 'torchrun.sh').write_text((REPO_ROOT / 'tools/torchrun.sh').read_text())
    venv_python = checkout / '.venv' / 'bin' / 'python'
    venv_python.parent.mkdir(parents=True)
    venv_python.write_text(f'#!/bin/sh\necho "venv python $*"\nexec {sys.executable} "$@"\n')
    venv_python.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ('PYTHON', 'VITDENSE_VENV')}
    result = subprocess.run(['bash', str(checkout / 'tools/torchrun.sh'), '1', 'x.py', '--help'],
                            capture_output=True, text=True, env=env)
    assert 'venv python -m torch.distributed.run' in result.stdout
