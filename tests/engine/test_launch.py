"""vitdense/engine/launch.py, a tool's process in its job: workers that die with their launcher,
a failing worker waking its stopped siblings, SLURM's and Open MPI's variables, evaluation
results gathered over the process group, a temporary folder too long for the loader workers'
sockets, and the launch scripts' choice of interpreter, rendezvous and forwarded signals."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from vitdense.engine.launch import (SOCKET_SUFFIX, UNIX_SOCKET_PATH_LIMIT, export_mpi_environment,
                                    export_slurm_environment, first_host,
                                    gather_results_over_process_group, join_job)
from vitdense.engine.tool_config import load_config

from common import REPO_ROOT, Watched, free_port

CONFIG = str(REPO_ROOT / 'configs/xcit/upernet_xcit-d6-p8_demo-ade.py')


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
print(f'worker {worker.pid}', flush=True)
time.sleep(60)
'''


def test_worker_exits_when_its_launcher_is_killed():
    launcher = Watched([sys.executable, '-c', LAUNCHER],
                       env={**os.environ, 'PYTHONPATH': f'{REPO_ROOT}:{REPO_ROOT / "tools"}'})
    worker = int(launcher.until('worker ', 120).split()[1])
    launcher.process.send_signal(signal.SIGKILL)
    launcher.process.wait(timeout=60)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(worker, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.kill(worker, signal.SIGKILL)
    pytest.fail('the worker outlived its launcher')


FAILING_WORKER = """
import os, sys, torch
from vitdense.engine.launch import run_tool


def main():
    if sys.argv[1] == 'launched':  # a worker of a job: its process group is open
        os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=sys.argv[2], RANK='0',
                          WORLD_SIZE='1')
        torch.distributed.init_process_group('gloo')
    raise RuntimeError('a peer timed out')


run_tool(main)
"""


def _state(pid: int) -> str:
    """The process's state letter (``T``: stopped)."""
    return Path(f'/proc/{pid}/stat').read_text().rsplit(') ', 1)[1].split()[0]


@pytest.mark.skipif(not sys.platform.startswith('linux'), reason='reads /proc')
def test_a_failing_launched_worker_wakes_its_stopped_siblings(tmp_path):
    sibling = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])
    try:
        os.kill(sibling.pid, signal.SIGSTOP)
        while _state(sibling.pid) != 'T':
            time.sleep(0.05)
        port = str(free_port())
        for how, state in (('alone', 'T'), ('launched', 'S')):  # 'none': nobody to wake
            worker = subprocess.run([sys.executable, '-c', FAILING_WORKER, how, port],
                                    cwd=tmp_path, capture_output=True, text=True, timeout=300,
                                    env={**os.environ, 'PYTHONPATH': str(REPO_ROOT)})
            assert worker.returncode == 1 and 'RuntimeError: a peer timed out' in worker.stderr
            deadline = time.monotonic() + 10
            while _state(sibling.pid) != state and time.monotonic() < deadline:
                time.sleep(0.05)
            assert _state(sibling.pid) == state, how
    finally:
        sibling.kill()
        sibling.wait()


def test_launch_script_prefers_the_project_environment(tmp_path):
    # A checkout whose .venv has a python: torchrun.sh runs it, not the one on PATH.
    checkout = tmp_path / 'checkout'
    (checkout / 'tools').mkdir(parents=True)
    for script in ('torchrun.sh', 'python_env.sh'):
        (checkout / 'tools' / script).write_text((REPO_ROOT / 'tools' / script).read_text())
    venv_python = checkout / '.venv' / 'bin' / 'python'
    venv_python.parent.mkdir(parents=True)
    venv_python.write_text(f'#!/bin/sh\necho "venv python $*"\nexec {sys.executable} "$@"\n')
    venv_python.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ('PYTHON', 'VITDENSE_VENV')}
    result = subprocess.run(['bash', str(checkout / 'tools/torchrun.sh'), '1', 'x.py', '--help'],
                            capture_output=True, text=True, env=env, timeout=120)
    assert 'venv python -m torch.distributed.run' in result.stdout


@pytest.mark.parametrize('nodes, rendezvous', [
    ({}, '--standalone'),  # one node: a free port, two jobs on one node do not collide
    (dict(NNODES='2', NODE_RANK='1', MASTER_ADDR='10.0.0.1', PORT='29533'),
     '--nnodes=2 --node_rank=1 --master_addr=10.0.0.1 --master_port=29533')])
def test_launch_script_rendezvous_and_forwarded_signals(tmp_path, nodes, rendezvous):
    python = tmp_path / 'python'
    python.write_text('#!/bin/sh\necho "python $*"\n')  # says how torchrun would be started
    python.chmod(0o755)
    env = {**{k: v for k, v in os.environ.items() if k not in ('NNODES', 'PORT')},
           'PYTHON': str(python), **nodes}
    result = subprocess.run(['bash', str(REPO_ROOT / 'tools/torchrun.sh'), '2', 'x.py', '--a'],
                            capture_output=True, text=True, env=env, check=True, timeout=120)
    assert result.stdout.splitlines()[-1] == (
        f'python -m torch.distributed.run {rendezvous} '
        '--signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1 --shutdown-timeout=300 '
        '--nproc_per_node=2 x.py --a --launcher pytorch')


def test_slurm_variables_become_the_process_group_environment():
    environ = dict(SLURM_PROCID='5', SLURM_NTASKS='8', SLURM_LOCALID='1', SLURM_JOB_ID='123457',
                   SLURM_NODELIST='gpu-a[007-008,010],cpu1')
    export_slurm_environment(environ)
    assert (environ['RANK'], environ['WORLD_SIZE'], environ['LOCAL_RANK']) == ('5', '8', '1')
    assert environ['MASTER_ADDR'] == 'gpu-a007'
    assert environ['MASTER_PORT'] == '18457'  # from the job id (tests/engine/test_rendezvous.py)
    reserved = {**environ, 'SLURM_STEP_RESV_PORTS': '12000-12015'}
    del reserved['MASTER_PORT']
    export_slurm_environment(reserved)
    assert reserved['MASTER_PORT'] == '12000'  # srun --resv-ports: the step's first port
    preset = {**reserved, 'MASTER_ADDR': '10.0.0.9', 'MASTER_PORT': '23456'}
    export_slurm_environment(preset)  # the user's address and port win
    assert (preset['MASTER_ADDR'], preset['MASTER_PORT']) == ('10.0.0.9', '23456')
    assert first_host('rack[2-3]-n[04,06]') == 'rack2-n04' and first_host('node1') == 'node1'
    with pytest.raises(RuntimeError, match='SLURM_PROCID, SLURM_JOB_ID not set; start the tool '
                                           'with srun'):
        export_slurm_environment(dict(SLURM_NTASKS='2', SLURM_LOCALID='0', SLURM_NODELIST='n1'))


def test_open_mpi_variables_become_the_process_group_environment():
    environ = dict(OMPI_COMM_WORLD_RANK='3', OMPI_COMM_WORLD_SIZE='4',
                   OMPI_COMM_WORLD_LOCAL_RANK='1', OMPI_COMM_WORLD_LOCAL_SIZE='2',
                   MASTER_ADDR='10.0.0.1')
    export_mpi_environment(environ)
    assert (environ['RANK'], environ['WORLD_SIZE'], environ['LOCAL_RANK']) == ('3', '4', '1')
    assert (environ['MASTER_ADDR'], environ['MASTER_PORT']) == ('10.0.0.1', '29500')
    preset = {**environ, 'MASTER_PORT': '23456'}
    export_mpi_environment(preset)
    assert preset['MASTER_PORT'] == '23456'
    one_node = dict(OMPI_COMM_WORLD_RANK='0', OMPI_COMM_WORLD_SIZE='2',
                    OMPI_COMM_WORLD_LOCAL_RANK='0', OMPI_COMM_WORLD_LOCAL_SIZE='2')
    export_mpi_environment(one_node)
    assert one_node['MASTER_ADDR'] == '127.0.0.1'
    with pytest.raises(RuntimeError, match='on several nodes: set MASTER_ADDR'):
        export_mpi_environment({**one_node, 'OMPI_COMM_WORLD_LOCAL_SIZE': '1',
                                'MASTER_ADDR': ''})
    with pytest.raises(RuntimeError, match='OMPI_COMM_WORLD_LOCAL_RANK not set; start the '
                                           "tool with Open MPI's mpirun"):
        export_mpi_environment(dict(OMPI_COMM_WORLD_RANK='0', OMPI_COMM_WORLD_SIZE='2'))


def test_distributed_metrics_gather_over_the_process_group(tmp_path):
    cfg = load_config(CONFIG, None, 'none', str(tmp_path))
    cfg.test_evaluator = [dict(type='IoUMetric'), dict(type='IoUMetric', collect_dir='/shared')]
    cfg.val_evaluator = dict(type='Evaluator', metrics=dict(type='IoUMetric'))
    gather_results_over_process_group(cfg)
    assert cfg.test_evaluator == [dict(type='IoUMetric', collect_device='gpu'),
                                  dict(type='IoUMetric', collect_dir='/shared')]
    assert cfg.val_evaluator.metrics == dict(type='IoUMetric', collect_device='gpu')


LOADER = '''
import torch
from torch.utils.data import DataLoader
print([batch.shape[0] for batch in DataLoader(torch.zeros(6, 3), batch_size=2, num_workers=2,
                                              timeout=60)])
'''


def test_a_temporary_folder_too_long_for_loader_sockets_is_refused(tmp_path, monkeypatch):
    # At the limit (the Unix socket path multiprocessing makes there takes 107 bytes) a
    # loader's workers hand their batches over; one byte more, and a tool with loader workers
    # stops at once, naming the limit and the fix, where its trainers would wait for their
    # first batch for ever.
    longest = tmp_path / ('x' * (UNIX_SOCKET_PATH_LIMIT - SOCKET_SUFFIX - len(str(tmp_path)) - 1))
    longest.mkdir()
    assert len(str(longest)) + SOCKET_SUFFIX == UNIX_SOCKET_PATH_LIMIT
    done = subprocess.run([sys.executable, '-c', LOADER], capture_output=True, text=True,
                          env={**os.environ, 'TMPDIR': str(longest)}, timeout=300)
    assert done.stdout.strip() == '[2, 2, 2]', done.stderr[-3000:]
    cfg = load_config(CONFIG, None, 'none', str(tmp_path / 'work'))
    monkeypatch.setattr(tempfile, 'tempdir', str(longest))
    join_job(cfg)
    monkeypatch.setattr(tempfile, 'tempdir', f'{longest}y')
    with pytest.raises(OSError, match=rf'temporary folder {longest}y is too long for the loader '
                                      r'workers: .* would take 108 bytes, over the 107-byte limit '
                                      r'.*set TMPDIR to a folder of at most 75 bytes'):
        join_job(cfg)
    for split in ('train', 'val', 'test'):
        cfg[f'{split}_dataloader'].num_workers = 0
    join_job(cfg)  # no loader workers: no sockets
