"""vitdense/engine/launch.py, the command-line safety of the tools: mistyped --cfg-options keys,
--resume with nothing or a bad file to resume, one resume decision for all processes (every
launcher), no training from iteration 0 over a work dir's checkpoints without --resume none
(tools/train.py as a user runs it, and one decision for all processes), a process-group
timeout, workers that die with their launcher, SLURM's and Open
MPI's variables, evaluation
results gathered over the process group, and the launch scripts' choice of interpreter."""
from __future__ import annotations

import ctypes
import os
import os.path as osp
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from mmengine.config import Config
from mmengine.logging import MMLogger

from vitdense.checkpoint_io import CorruptCheckpointError, safe_load
from vitdense.demo_data import make_demo_imagenet
from vitdense.engine.launch import (add_safety_hooks, apply_resume, export_mpi_environment,
                                    export_slurm_environment, first_host,
                                    gather_results_over_process_group, join_job,
                                    load_config, refuse_to_start_over)

from common import CHECKOUT_ENV, REPO_ROOT, free_port

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


@pytest.mark.skipif(not sys.platform.startswith('linux'), reason='prctl')
def test_loading_a_config_for_a_launcher_leaves_the_process_alone(tmp_path):
    excepthook, pdeathsig = sys.excepthook, ctypes.c_int(-1)
    cfg, _ = load_config(CONFIG, None, 'pytorch', str(tmp_path))
    assert cfg.launcher == 'pytorch' and sys.excepthook is excepthook
    assert not torch.distributed.is_initialized()
    assert 'collect_device' not in str(cfg.test_evaluator)  # join_job's, when launched
    pr_get_pdeathsig = 2
    ctypes.CDLL(None).prctl(pr_get_pdeathsig, ctypes.byref(pdeathsig))
    assert pdeathsig.value == 0  # no parent-death signal asked for


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


def test_a_group_torchrun_restarted_resumes_from_the_last_checkpoint(tmp_path, monkeypatch):
    # torchrun --max-restarts: the restarted group runs the same command line, without
    # --resume; it continues from the work dir's checkpoint instead of starting over it.
    torch.save({'state_dict': {}, 'meta': {'iter': 3}}, tmp_path / 'iter_3.pth')
    cfg, _ = load_config(CONFIG, None, 'none', str(tmp_path))
    apply_resume(cfg, None)
    assert cfg.get('load_from') is None  # the first start: as the command line says
    monkeypatch.setenv('TORCHELASTIC_RESTART_COUNT', '1')
    apply_resume(cfg, None)
    assert cfg.resume and cfg.load_from == str(tmp_path / 'iter_3.pth')


def test_training_from_iteration_0_over_a_checkpoint_is_refused(tmp_path, monkeypatch):
    cfg, _ = load_config(CONFIG, None, 'none', str(tmp_path))
    refuse_to_start_over(cfg)  # nothing there
    torch.save({'state_dict': {}, 'meta': {'iter': 3}}, tmp_path / 'iter_3.pth')
    with pytest.raises(FileExistsError, match=rf'work dir {tmp_path} holds the checkpoint '
                                              rf'{tmp_path}/iter_3.pth: training would start'):
        refuse_to_start_over(cfg)
    cfg.resume = True  # a config that resumes by itself (mmengine's resume=True)
    refuse_to_start_over(cfg)
    cfg.resume = False
    monkeypatch.setenv('TORCHELASTIC_RESTART_COUNT', '1')  # resumes (apply_resume)
    refuse_to_start_over(cfg)


TINY_CLASSIFIER = 'configs/vit/vit-mini-p16_1xb64-a2-8e_demo-in10-64px.py'


def _train(data_root: Path, work_dir: Path, epochs: int, *extra: str) -> tuple[int, str]:
    """``tools/train.py`` on the demo classifier: ``epochs`` of 3 iterations (20 images,
    batches of 8), a checkpoint after each; its exit status and output."""
    options = [f'{split}_dataloader.{key}' for split in ('train', 'val', 'test')
               for key in (f'dataset.data_root={data_root}', 'num_workers=0',
                           'persistent_workers=False')]
    done = subprocess.run(
        [sys.executable, 'tools/train.py', TINY_CLASSIFIER, '--work-dir', str(work_dir),
         '--skip-data-check', '--cfg-options', *options, 'train_dataloader.batch_size=8',
         f'train_cfg.max_epochs={epochs}', 'train_cfg.val_interval=100',
         'default_hooks.checkpoint.interval=1', 'default_hooks.logger.interval=1', *extra],
        cwd=REPO_ROOT, env={**CHECKOUT_ENV, 'OMP_NUM_THREADS': '1'}, capture_output=True,
        text=True, timeout=300)
    return done.returncode, done.stdout + done.stderr


def test_train_tool_refuses_to_start_over_and_its_advice_works(tmp_path):
    # A run of 1 epoch, then the same command for 2 epochs, without --resume: refused before
    # anything is written; each option the error names then does what it says.
    data_root = make_demo_imagenet(tmp_path / 'in10', num_train=2, num_val=1, size=72)
    work = tmp_path / 'work'
    status, log = _train(data_root, work, 1)
    assert status == 0, log[-3000:]
    first = safe_load(str(work / 'epoch_1.pth'))['meta']['iter']
    saved = (work / 'epoch_1.pth').read_bytes()
    status, log = _train(data_root, work, 2)
    refusal = log.strip().splitlines()[-1]
    assert status == 1 and refusal == (
        f'FileExistsError: work dir {work} holds the checkpoint {work}/epoch_1.pth: training '
        'would start from iteration 0 and overwrite that run. Add --resume auto to continue '
        'it, or --resume none to start over in this work dir (its checkpoints are '
        'overwritten), or pass another --work-dir'), log[-3000:]
    assert (work / 'epoch_1.pth').read_bytes() == saved and not (work / 'epoch_2.pth').exists()
    advice = {aim: option for option, aim in
              re.findall(r'(--resume \w+) to (continue|start over)', refusal)}
    assert len(advice) == 2

    status, log = _train(data_root, work, 2, *advice['continue'].split())
    assert status == 0 and f'--resume: resuming from {work}/epoch_1.pth' in log, log[-3000:]
    assert not re.search(r'Epoch\(train\) +\[1\]', log)  # epoch 1 was not trained again
    assert safe_load(str(work / 'epoch_2.pth'))['meta']['iter'] == 2 * first

    status, log = _train(data_root, work, 1, *advice['start over'].split())
    assert status == 0 and re.search(r'Epoch\(train\) +\[1\]\[1/', log), log[-3000:]
    assert (work / 'last_checkpoint').read_text() == str(work / 'epoch_1.pth')
    assert safe_load(str(work / 'epoch_1.pth'))['meta']['iter'] == first


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
                                    cwd=tmp_path, capture_output=True, text=True,
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
                            capture_output=True, text=True, env=env)
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
                            capture_output=True, text=True, env=env, check=True)
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
    cfg, _ = load_config(CONFIG, None, 'none', str(tmp_path))
    cfg.test_evaluator = [dict(type='IoUMetric'), dict(type='IoUMetric', collect_dir='/shared')]
    cfg.val_evaluator = dict(type='Evaluator', metrics=dict(type='IoUMetric'))
    gather_results_over_process_group(cfg)
    assert cfg.test_evaluator == [dict(type='IoUMetric', collect_device='gpu'),
                                  dict(type='IoUMetric', collect_dir='/shared')]
    assert cfg.val_evaluator.metrics == dict(type='IoUMetric', collect_device='gpu')


def _resume_on_rank(rank: int, port: int, nodes: list[str], out: str, launcher: str) -> None:
    """Process ``rank`` of two runs ``--resume`` on its node (the folder it works in, where
    the work dir ``work_dirs/run`` is); writes what happened. ``launcher='mpi'``: the process
    has the variables Open MPI's mpirun gives it and joins the job through the tools' own
    set-up (:func:`load_config`, :func:`join_job`)."""
    torch.set_num_threads(1)
    os.chdir(nodes[rank])
    if launcher == 'mpi':
        os.environ.update(OMPI_COMM_WORLD_RANK=str(rank), OMPI_COMM_WORLD_LOCAL_RANK=str(rank),
                          OMPI_COMM_WORLD_SIZE='2', OMPI_COMM_WORLD_LOCAL_SIZE='2',
                          MASTER_PORT=str(port))
        for name in ('MASTER_ADDR', 'RANK', 'WORLD_SIZE'):
            os.environ.pop(name, None)
        cfg, _ = load_config(osp.join(out, 'job.py'), None, 'mpi', 'work_dirs/run')
        join_job(cfg)
    else:
        os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port), RANK=str(rank),
                          WORLD_SIZE='2')
        torch.distributed.init_process_group('gloo')
        cfg = Config(dict(work_dir='work_dirs/run'))
    try:
        apply_resume(cfg, 'auto')
        outcome = f'resume={cfg.resume} load_from={cfg.load_from}'
    except RuntimeError as err:
        outcome = f'error: {err}'
    with open(os.path.join(out, f'rank{rank}.txt'), 'w') as f:
        f.write(outcome)
    torch.distributed.destroy_process_group()


def _resume_two_processes(nodes: list[Path], out: Path, launcher: str = 'pytorch') -> list[str]:
    (out / 'job.py').write_text("default_scope = 'mmseg'\n")  # a job's config, host imported
    load_config(str(out / 'job.py'), None, 'none', None)  # here, so that forks start with it
    port = free_port()
    mp.start_processes(_resume_on_rank, args=(port, [str(n) for n in nodes], str(out), launcher),
                       nprocs=2, start_method='fork')
    return [(out / f'rank{rank}.txt').read_text() for rank in (0, 1)]


def _checkpoint(node: Path, step: int, size: int = 1) -> None:
    (node / 'work_dirs/run').mkdir(parents=True, exist_ok=True)
    torch.save({'state_dict': {'w': torch.zeros(size)}, 'meta': {'iter': step}},
               node / f'work_dirs/run/iter_{step}.pth')


@pytest.mark.parametrize('launcher', ['pytorch', 'mpi'])
def test_one_resume_decision_for_the_job(tmp_path, launcher):
    # Node-local work dirs after both nodes were killed: node 0 holds iter_6; node 1 iter_3,
    # then an iter_6 of another run; then both see one shared folder.
    node0, node1 = tmp_path / 'node0', tmp_path / 'node1'
    _checkpoint(node0, 6)
    _checkpoint(node1, 3)
    for outcome in _resume_two_processes([node0, node1], tmp_path, launcher):
        assert outcome == ('error: --resume: process 0 chose work_dirs/run/iter_6.pth, which '
                           'rank(s) [1] cannot read (rank 1: no such file); give every node '
                           'the same work dir (a shared file system) or copy the checkpoint '
                           'to each node, then resume again')
    _checkpoint(node1, 6, size=1000)
    for outcome in _resume_two_processes([node0, node1], tmp_path, launcher):
        assert 'rank(s) [1] cannot read (rank 1: its file of that name is another' in outcome
    outcomes = _resume_two_processes([node0, node0], tmp_path, launcher)
    assert outcomes == ['resume=True load_from=work_dirs/run/iter_6.pth'] * 2
