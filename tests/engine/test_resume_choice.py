"""vitdense/engine/resume_choice.py, one resume decision: --resume with nothing or a bad file to
resume, one decision for all processes (every launcher, node-local work dirs), a group torchrun
restarted, and no training from iteration 0 over a work dir's checkpoints without --resume none
(tools/train.py as a user runs it)."""
from __future__ import annotations

import os
import os.path as osp
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from mmengine.config import Config
from mmengine.logging import MMLogger

from vitdense.checkpoint_io import CorruptCheckpointError, safe_load
from vitdense.demo_data import make_demo_imagenet
from vitdense.model_factory import register_host
from vitdense.engine.launch import join_job
from vitdense.engine.resume_choice import apply_resume, refuse_to_start_over
from vitdense.engine.tool_config import load_config

from common import CHECKOUT_ENV, REPO_ROOT, free_port

CONFIG = str(REPO_ROOT / 'configs/xcit/upernet_xcit-d6-p8_demo-ade.py')


def test_resume_with_nothing_to_resume_says_so(tmp_path, capfd):
    MMLogger.get_instance(f'resume-{tmp_path.name}')  # a logger writing to this test's stdout
    cfg = load_config(CONFIG, None, 'none', str(tmp_path / 'typo'))
    apply_resume(cfg, 'auto')
    assert not cfg.resume and cfg.load_from is None
    assert 'NOTHING TO RESUME' in capfd.readouterr().out


def test_resume_from_a_named_file_must_load(tmp_path):
    cfg = load_config(CONFIG, None, 'none', str(tmp_path))
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
    cfg = load_config(CONFIG, None, 'none', str(tmp_path))
    apply_resume(cfg, None)
    assert cfg.get('load_from') is None  # the first start: as the command line says
    monkeypatch.setenv('TORCHELASTIC_RESTART_COUNT', '1')
    apply_resume(cfg, None)
    assert cfg.resume and cfg.load_from == str(tmp_path / 'iter_3.pth')


def test_a_resumed_run_is_built_with_its_checkpoints_seed(tmp_path, capfd):
    # The shipped runtime draws its seed (seed=None); a run resuming through --resume, or
    # through a config's resume=True alone (mmengine's last_checkpoint), takes the
    # checkpoint's, with a warning when the config named another. diff_rank_seed is kept.
    MMLogger.get_instance(f'seed-{tmp_path.name}')
    torch.save({'state_dict': {}, 'meta': {'iter': 3, 'seed': 1234}}, tmp_path / 'iter_3.pth')
    (tmp_path / 'last_checkpoint').write_text(str(tmp_path / 'iter_3.pth'))
    cfg = load_config(str(REPO_ROOT / TINY_CLASSIFIER), None, 'none', str(tmp_path))
    shipped = dict(cfg.randomness)
    assert shipped['seed'] is None and shipped['diff_rank_seed']
    apply_resume(cfg, str(tmp_path / 'iter_3.pth'))
    assert cfg.randomness == dict(shipped, seed=1234)
    cfg = load_config(str(REPO_ROOT / TINY_CLASSIFIER), {'resume': True, 'randomness.seed': 7}, 'none',
                      str(tmp_path))
    apply_resume(cfg, None)
    assert cfg.randomness == dict(shipped, seed=1234)
    assert 'randomness.seed=7 is replaced by the seed of the checkpoint resumed, 1234' in (
        capfd.readouterr().out)
    cfg = load_config(str(REPO_ROOT / TINY_CLASSIFIER), None, 'none', str(tmp_path))
    apply_resume(cfg, None)  # not resuming: the seed is drawn
    assert cfg.randomness.seed is None


def test_training_from_iteration_0_over_a_checkpoint_is_refused(tmp_path, monkeypatch):
    cfg = load_config(CONFIG, None, 'none', str(tmp_path))
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


def _resume_on_rank(rank: int, port: int, nodes: list[str], out: str, launcher: str,
                    action: str) -> None:
    """Process ``rank`` of two runs ``--resume`` (``action='resume'``), or starts without it
    (``'start'``), on its node (the folder it works in, where the work dir ``work_dirs/run``
    is); writes what happened. ``launcher='mpi'``: the process
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
        cfg = load_config(osp.join(out, 'job.py'), None, 'mpi', 'work_dirs/run')
        join_job(cfg)
    else:
        os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT=str(port), RANK=str(rank),
                          WORLD_SIZE='2')
        torch.distributed.init_process_group('gloo')
        cfg = Config(dict(work_dir='work_dirs/run'))
    try:
        if action == 'resume':
            apply_resume(cfg, 'auto')
            outcome = (f'resume={cfg.resume} load_from={cfg.load_from} '
                       f'seed={cfg.get("randomness", {}).get("seed")}')
        else:
            refuse_to_start_over(cfg)
            outcome = 'starts from iteration 0'
    except (RuntimeError, FileExistsError) as err:
        outcome = f'error: {err}'
    with open(os.path.join(out, f'rank{rank}.txt'), 'w') as f:
        f.write(outcome)
    torch.distributed.destroy_process_group()


def _resume_two_processes(nodes: list[Path], out: Path, launcher: str = 'pytorch',
                          action: str = 'resume') -> list[str]:
    (out / 'job.py').write_text("default_scope = 'mmseg'\n")  # a job's config, host imported
    # registered here, so that forks start with it
    register_host(load_config(str(out / 'job.py'), None, 'none', None))
    port = free_port()
    mp.start_processes(_resume_on_rank, nprocs=2, start_method='fork',
                       args=(port, [str(n) for n in nodes], str(out), launcher, action))
    return [(out / f'rank{rank}.txt').read_text() for rank in (0, 1)]


def _checkpoint(node: Path, step: int, size: int = 1) -> None:
    (node / 'work_dirs/run').mkdir(parents=True, exist_ok=True)
    torch.save({'state_dict': {'w': torch.zeros(size)}, 'meta': {'iter': step, 'seed': 1234}},
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
    outcomes = _resume_two_processes([node0, node0], tmp_path, launcher)  # with its seed
    assert outcomes == ['resume=True load_from=work_dirs/run/iter_6.pth seed=1234'] * 2


def test_one_start_over_refusal_for_the_job(tmp_path):
    # Node-local work dirs: node 0 holds a checkpoint, node 1 none. Process 0 decides for
    # both: both refuse, naming node 0's checkpoint; with the checkpoint on node 1 only, both
    # start.
    node0, node1 = tmp_path / 'node0', tmp_path / 'node1'
    _checkpoint(node0, 6)
    (node1 / 'work_dirs/run').mkdir(parents=True)
    for outcome in _resume_two_processes([node0, node1], tmp_path, action='start'):
        assert outcome.startswith('error: work dir work_dirs/run holds the checkpoint '
                                  'work_dirs/run/iter_6.pth: training would start'), outcome
    outcomes = _resume_two_processes([node1, node0], tmp_path, action='start')
    assert outcomes == ['starts from iteration 0'] * 2
