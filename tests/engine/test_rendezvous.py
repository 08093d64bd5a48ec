"""vitdense/engine/launch.py, the rendezvous of a launched job: the port SLURM reserved for the
step, and a process that reaches another job's rendezvous stops at once, naming both jobs
and the port, instead of joining that job's process group (SLURM tasks on loopback, gloo;
a torchrun worker whose agent's store is another run's)."""
from __future__ import annotations

import datetime
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from torch.distributed import TCPStore

from vitdense.engine.launch import JOB_KEY, job_identity, join_rendezvous, slurm_master_port

from common import REPO_ROOT

#: a task of a SLURM job step as ``srun`` starts it: joins its job (--launcher slurm, a
#: 60 s process-group timeout), says how long joining took and what stopped it, and leaves
#: the group once told to (a line on its input)
TASK = '''
import sys, time
from mmengine.config import Config
from vitdense.engine.launch import close_process_group, join_job
cfg = Config(dict(launcher='slurm', env_cfg=dict(dist_cfg=dict(timeout=60))))
started = time.monotonic()
try:
    join_job(cfg)
except RuntimeError as err:
    print(f'{time.monotonic() - started:.2f} s: {err}', flush=True)
    sys.exit(3)
print('joined', flush=True)
sys.stdin.readline()
close_process_group()
'''


def test_slurm_port_is_the_one_reserved_for_the_step():
    job = dict(SLURM_JOB_ID='123457')
    for reserved, port in (('12000-12015', 12000), ('12000', 12000), ('12003-12004,12009', 12003)):
        assert slurm_master_port({**job, 'SLURM_STEP_RESV_PORTS': reserved}) == port
    assert slurm_master_port(job) == 15000 + 123457 % 15000  # none reserved: from the job id
    assert slurm_master_port(job) == slurm_master_port(dict(SLURM_JOB_ID='138457'))
    with pytest.raises(ValueError, match=r"SLURM_STEP_RESV_PORTS='ports' is no list of ports"):
        slurm_master_port({**job, 'SLURM_STEP_RESV_PORTS': 'ports'})


def test_job_identity_names_the_job_and_the_way_out():
    assert job_identity(dict(SLURM_JOB_ID='7', SLURM_STEP_ID='0'))[0] == 'SLURM job 7 step 0'
    assert 'srun --resv-ports' in job_identity(dict(SLURM_JOB_ID='7'))[1]
    torchrun = dict(SLURM_JOB_ID='7', TORCHELASTIC_RUN_ID='r1')  # torchrun inside a job
    assert job_identity(torchrun)[0] == "torchrun run 'r1'"
    assert job_identity({**torchrun, 'VITDENSE_RUN_ID': 'x'})[0] == "run 'x'"
    assert job_identity(dict(OMPI_MCA_ess_base_jobid='99'))[0] == 'Open MPI job 99'


def _free_derived_port() -> int:
    """A free port among those derived from SLURM job ids."""
    for port in range(15000 + os.getpid() % 10000, 30000):
        with socket.socket() as probe:
            if probe.connect_ex(('127.0.0.1', port)) != 0:
                return port
    raise RuntimeError('no free port in 15000-29999')


def _task(job: int, rank: int) -> subprocess.Popen:
    """Task ``rank`` of a 2-task step of SLURM job ``job`` on this node."""
    env = {**os.environ, 'SLURM_JOB_ID': str(job), 'SLURM_STEP_ID': '0',
           'SLURM_PROCID': str(rank), 'SLURM_LOCALID': str(rank), 'SLURM_NTASKS': '2',
           'SLURM_NODELIST': 'localhost', 'PYTHONPATH': str(REPO_ROOT), 'OMP_NUM_THREADS': '1'}
    for name in ('MASTER_ADDR', 'MASTER_PORT', 'RANK', 'WORLD_SIZE', 'TORCHELASTIC_RUN_ID',
                 'SLURM_STEP_RESV_PORTS', 'VITDENSE_RUN_ID'):
        env.pop(name, None)
    return subprocess.Popen([sys.executable, '-c', TASK], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(('127.0.0.1', port)) == 0


def test_a_task_on_another_jobs_port_stops_at_once():
    # Two jobs whose ids differ by 15000 derive one port (no ports reserved for the steps).
    port = _free_derived_port()
    job, other = port - 15000, port
    first = _task(job, 0)  # job's rank 0 opens the rendezvous and waits for its rank 1
    tasks = [first]
    try:
        deadline = time.monotonic() + 120
        while not _listening(port):
            assert first.poll() is None and time.monotonic() < deadline, first.stdout.read()
            time.sleep(0.2)
        # The other job's tasks on the same node join neither; the first job's rank 1 does.
        foreign = [_task(other, rank) for rank in (1, 0)]
        second = _task(job, 1)
        tasks += [*foreign, second]
        outputs = [task.communicate(timeout=60)[0] for task in foreign]
        assert [task.returncode for task in foreign] == [3, 3], outputs
        refused = re.match(rf'([\d.]+) s: rank 1 of SLURM job {other} step 0 reached the process '
                           rf'group of SLURM job {job} step 0 at localhost:{port} and stops '
                           'instead of joining it; two jobs on one node derived one port from '
                           'their ids: add srun --resv-ports', outputs[0].splitlines()[-1])
        assert refused and float(refused.group(1)) < 5, outputs[0]
        # the job holding the port is named: the process of the first job's rank 0
        assert (f'rank 0 of SLURM job {other} step 0 cannot open the rendezvous at localhost:'
                f'{port}: process {first.pid} ({sys.executable} -c ') in outputs[1], outputs[1]
        for task in (first, second):  # both leave the group together
            task.stdin.write('\n')
            task.stdin.flush()
        for task in (first, second):
            assert task.communicate(timeout=120)[0].splitlines()[-1] == 'joined'
            assert task.returncode == 0
    finally:
        for task in tasks:
            task.kill()
            task.wait()


def test_a_torchrun_worker_checks_its_agents_store(monkeypatch):
    # torchrun's agent hosts the store; the workers are its clients. A worker whose agent
    # reached another run's store (e.g. two multi-node jobs on one PORT) stops at once.
    agent = TCPStore('127.0.0.1', 0, is_master=True, wait_for_workers=False)
    agent.set(JOB_KEY, "run 'job-a'")
    for name, value in dict(TORCHELASTIC_USE_AGENT_STORE='True', TORCHELASTIC_RUN_ID='none',
                            MASTER_ADDR='127.0.0.1', MASTER_PORT=str(agent.port), RANK='1',
                            WORLD_SIZE='2', VITDENSE_RUN_ID='job-b').items():
        monkeypatch.setenv(name, value)
    timeout = datetime.timedelta(seconds=60)
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=rf"rank 1 of run 'job-b' reached the process group "
                                           rf"of run 'job-a' at 127.0.0.1:{agent.port} and "
                                           'stops .* set RUN_ID to one value on every node'):
        join_rendezvous(timeout)
    assert time.monotonic() - started < 5
    monkeypatch.setenv('VITDENSE_RUN_ID', 'job-a')
    assert join_rendezvous(timeout)[1:] == (1, 2)
    monkeypatch.setenv('RANK', '0')  # process 0 finds its job's own identity there
    assert join_rendezvous(timeout)[1:] == (0, 2)
    monkeypatch.setenv('VITDENSE_RUN_ID', 'job-b')  # and leaves another job's as it is
    with pytest.raises(RuntimeError, match=r"rank 0 of run 'job-b' reached the process group "
                                           r"of run 'job-a'"):
        join_rendezvous(timeout)
    assert agent.get(JOB_KEY) == b"run 'job-a'"


def _torchrun_run_id(tmp_path: Path, *args: str, **variables: str) -> str:
    """The VITDENSE_RUN_ID that tools/torchrun.sh gives the processes it starts."""
    python = tmp_path / 'python'
    python.write_text('#!/bin/sh\necho "$VITDENSE_RUN_ID"\n')
    python.chmod(0o755)
    env = {**{k: v for k, v in os.environ.items()
              if k not in ('NNODES', 'NODE_RANK', 'MASTER_ADDR', 'PORT', 'RUN_ID')},
           'PYTHON': str(python), **variables}
    return subprocess.run(['bash', str(REPO_ROOT / 'tools/torchrun.sh'), '2', *args],
                          capture_output=True, text=True, env=env, check=True,
                          timeout=120).stdout.strip()


def test_torchrun_script_gives_the_nodes_of_a_job_one_id(tmp_path):
    nodes = dict(NNODES='2', MASTER_ADDR='10.0.0.1', PORT='29500')
    node0 = _torchrun_run_id(tmp_path, 'train.py', 'a.py', NODE_RANK='0', **nodes)
    assert node0 and node0 == _torchrun_run_id(tmp_path, 'train.py', 'a.py', NODE_RANK='1',
                                               **nodes)
    assert _torchrun_run_id(tmp_path, 'train.py', 'b.py', NODE_RANK='1', **nodes) != node0
    assert _torchrun_run_id(tmp_path, 'train.py', 'b.py', RUN_ID='mine', **nodes) == 'mine'
    assert _torchrun_run_id(tmp_path, 'train.py', 'a.py') == ''  # one node: torchrun's own id
