"""What the command-line tools share: one config, any of three host libraries.

A vitdense config names its host library in ``default_scope`` (``mmdet``, ``mmseg`` or
``mmpretrain``); :mod:`vitdense.engine.hosts` imports and registers it by name, so this module
itself imports none of them.
"""
from __future__ import annotations

import argparse
import ctypes
import datetime
import difflib
import gc
import inspect
import logging
import os
import os.path as osp
import re
import signal
import sys
from typing import Callable, Mapping, MutableMapping

import torch
from mmengine.config import Config, ConfigDict, DictAction
from mmengine.dist import (all_gather_object, broadcast_object_list, get_rank, get_world_size,
                           init_dist)
from mmengine.logging import print_log
from mmengine.runner import Runner
from torch.distributed import PrefixStore
from torch.distributed.constants import default_pg_timeout

from vitdense.checkpoint_io import CorruptCheckpointError, UnsafeCheckpointError, safe_load
from vitdense.engine.hosts import Host, host_of
from vitdense.engine.preemption import Preempted
from vitdense.engine.resume import find_resumable_checkpoint, remove_interrupted_saves


def tool_parser(description: str) -> argparse.ArgumentParser:
    """The arguments every OpenMMLab train/test tool takes: config, work dir, overrides, launcher"""
    parser = argparse.ArgumentParser(description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('config', help='config file')
    parser.add_argument('--work-dir', help='where logs, checkpoints and metrics go')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config entries, key=value (e.g. train_cfg.max_iters=10)')
    parser.add_argument('--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'],
                        default='none', help='job launcher')
    parser.add_argument('--local-rank', '--local_rank', type=int, default=0)
    parser.add_argument('--dist-timeout', type=float, metavar='SECONDS',
                        help='how long a process waits for the others in a collective '
                             'before failing (torch default: 30 min)')
    return parser


def parse_tool_args(parser: argparse.ArgumentParser) -> argparse.Namespace:
    """Parse, and export LOCAL_RANK for launchers that pass it as an argument."""
    args = parser.parse_args()
    os.environ.setdefault('LOCAL_RANK', str(args.local_rank))
    return args


# Top-level keys that Runner.from_cfg reads besides the config's own.
RUNNER_KEYS = frozenset(inspect.signature(Runner.__init__).parameters) - {'self', 'cfg'} | {
    'runner_type', 'launcher', 'custom_imports', 'default_scope', 'model_wrapper_cfg'}


def check_cfg_options(cfg: Config, cfg_options: dict, path: str) -> None:
    """Refuse ``--cfg-options`` whose top-level key neither the config nor the Runner knows.

    ``merge_from_dict`` accepts any key, so ``train_dataloder.batch_size=2`` would silently
    add an unused entry and train with the configured batch size.
    """
    known = set(cfg.keys()) | RUNNER_KEYS
    for option in cfg_options:
        top = option.split('.')[0]
        if top not in known:
            nearest = difflib.get_close_matches(top, sorted(known), n=1, cutoff=0.5)
            hint = f'; did you mean {nearest[0]!r}?' if nearest else ''
            raise KeyError(f'--cfg-options {option}: {path} has no top-level key {top!r} '
                           f'and the Runner reads none of that name{hint}')


def load_config(path: str, cfg_options: dict | None, launcher: str,
                work_dir: str | None, dist_timeout: float | None = None) -> tuple[Config, Host]:
    """Read a config, apply ``--cfg-options``, the launcher and the work dir, load its host.

    The work dir is, by priority, ``work_dir``, the config's own, ``work_dirs/<config name>``.
    ``dist_timeout`` (seconds) bounds how long a process waits for the others. Nothing of
    the process changes: a launched tool then joins its job with :func:`join_job`.
    """
    if not osp.isfile(path):
        raise FileNotFoundError(f'config file not found: {path}')
    cfg = Config.fromfile(path)
    if cfg_options:
        check_cfg_options(cfg, cfg_options, path)
        cfg.merge_from_dict(cfg_options)
    cfg.launcher = launcher
    if dist_timeout is not None:
        if dist_timeout <= 0:
            raise ValueError(f'--dist-timeout must be positive, got {dist_timeout}')
        cfg.setdefault('env_cfg', ConfigDict()).setdefault('dist_cfg', ConfigDict())
        cfg.env_cfg.dist_cfg.timeout = dist_timeout
    if work_dir is not None:
        cfg.work_dir = work_dir
    elif cfg.get('work_dir') is None:
        cfg.work_dir = osp.join('work_dirs', osp.splitext(osp.basename(path))[0])
    return cfg, host_of(cfg)


def join_job(cfg: Config) -> None:
    """A launched tool's process-level set-up (nothing for ``launcher='none'``): the kernel
    stops this worker when its launcher dies (:func:`exit_with_launcher`), the process group
    is opened before the Runner is built (:func:`open_process_group`) and the metrics gather
    their results over it (:func:`gather_results_over_process_group`). Tools call it right
    after :func:`load_config`, in their ``main`` that :func:`run_tool` runs."""
    if cfg.launcher == 'none':
        return
    exit_with_launcher()
    open_process_group(cfg, cfg.launcher)
    gather_results_over_process_group(cfg)


def open_process_group(cfg: Config, launcher: str) -> None:
    """Join the job's process group before the Runner is built, so that the processes can
    agree on what to resume from (:func:`apply_resume`); the Runner then uses this group.

    ``slurm`` and ``mpi``: the ranks and the rendezvous come from the variables ``srun`` or
    Open MPI's ``mpirun`` gives each process (:func:`export_slurm_environment`,
    :func:`export_mpi_environment`); the group is then opened as for ``pytorch``, which also
    works without GPUs (mmengine's SLURM and MPI starts need one GPU per process). The group
    is opened over the store of :func:`join_rendezvous`, which refuses another job's.
    """
    if launcher == 'slurm':
        export_slurm_environment(os.environ)
    elif launcher == 'mpi':
        export_mpi_environment(os.environ)
    dist_cfg = dict((cfg.get('env_cfg') or {}).get('dist_cfg') or {})
    if not torch.distributed.is_initialized():
        timeout = dist_cfg.get('timeout')
        store, rank, world_size = join_rendezvous(
            default_pg_timeout if timeout is None else datetime.timedelta(seconds=timeout))
        if torch.cuda.is_available():
            init_dist('pytorch', store=store, rank=rank, world_size=world_size, **dist_cfg)
        else:
            torch.distributed.init_process_group(
                backend='gloo', store=store, rank=rank, world_size=world_size,
                timeout=None if timeout is None else datetime.timedelta(seconds=timeout))
    if not torch.cuda.is_available():
        _prepare_cpu_distributed(cfg)


#: the rendezvous store's key that holds the identity of the job whose process 0 opened it
JOB_KEY = 'vitdense/job'
#: how long a process other than 0 waits for the job's identity in a store that process 0
#: opened (it writes it as soon as the store listens)
IDENTITY_WAIT = datetime.timedelta(seconds=30)


def job_identity(environ: Mapping[str, str]) -> tuple[str, str]:
    """Which job this process belongs to, and what to do when another job holds its
    rendezvous port.

    ``VITDENSE_RUN_ID`` (tools/torchrun.sh sets it on several nodes) first, then torchrun's
    run id (a fresh one for each one-node ``--standalone`` group), SLURM's job and step id,
    Open MPI's job (``PMIX_NAMESPACE`` or ``OMPI_MCA_ess_base_jobid``).
    """
    port = f'{environ.get("MASTER_ADDR")}:{environ.get("MASTER_PORT")}'
    another_port = f'start this job with another MASTER_PORT than {port}'
    if environ.get('VITDENSE_RUN_ID'):
        return (f'run {environ["VITDENSE_RUN_ID"]!r}',
                f'start this job with another PORT than {port}; if both are one job, its '
                'nodes were started with different command lines: set RUN_ID to one value '
                'on every node (tools/torchrun.sh)')
    if environ.get('TORCHELASTIC_RUN_ID'):
        return (f'torchrun run {environ["TORCHELASTIC_RUN_ID"]!r}',
                f'{another_port} (--master-port), or give each job its own --rdzv-id')
    if environ.get('SLURM_JOB_ID'):
        step = environ.get('SLURM_STEP_ID')
        job = f'SLURM job {environ["SLURM_JOB_ID"]}' + (f' step {step}' if step else '')
        if environ.get('SLURM_STEP_RESV_PORTS'):
            return job, ('a port SLURM reserved for this step is held by another process: '
                         'set MASTER_PORT to a free port')
        return job, ('two jobs on one node derived one port from their ids: add srun '
                     '--resv-ports (SRUN_ARGS=--resv-ports for tools/slurm_train.sh) where '
                     'the cluster reserves ports (MpiParams=ports=...), or set MASTER_PORT to '
                     'a free port')
    for name in ('PMIX_NAMESPACE', 'OMPI_MCA_ess_base_jobid'):
        if environ.get(name):
            return f'Open MPI job {environ[name]}', f'{another_port} (mpirun -x MASTER_PORT=...)'
    return 'a job without an id', f'{another_port}, or set VITDENSE_RUN_ID for each job'


def join_rendezvous(timeout: datetime.timedelta) -> tuple[torch.distributed.Store, int, int]:
    """The store, rank and world size of the job's process group (the ``env://`` variables
    of this process), never another job's.

    torch's ``env://`` rendezvous gives a process any store that listens at MASTER_PORT: a
    process whose port another job holds would join that job's group and wait there until
    the timeout. Process 0 opens the store (or, under torchrun, finds its agent's) and writes
    the job's :func:`job_identity`; every other process reads it and stops at once, naming
    both jobs and the port, when it is not its own job's. A port already held stops process
    0 at once as well.
    """
    identity, advice = job_identity(os.environ)
    port = f'{os.environ["MASTER_ADDR"]}:{os.environ["MASTER_PORT"]}'
    try:
        store, rank, world_size = next(torch.distributed.rendezvous('env://', timeout=timeout))
    except torch.distributed.DistNetworkError as err:
        if 'EADDRINUSE' not in str(err):
            raise
        raise RuntimeError(f'rank 0 of {identity} cannot open the rendezvous at {port}: '
                           f'another process holds that port; {advice}') from err
    store = _this_attempt(store)
    if rank == 0:
        found = store.compare_set(JOB_KEY, '', identity).decode()
    else:
        agent_store = os.environ.get('TORCHELASTIC_USE_AGENT_STORE') == 'True'
        try:
            store.wait([JOB_KEY], timeout if agent_store else IDENTITY_WAIT)
        except torch.distributed.DistStoreError as err:
            raise RuntimeError(f'rank {rank} of {identity}: the store at {port} names no job '
                               f'(another program holds that port, or process 0 of this job '
                               f'did not start); {advice}') from err
        found = store.get(JOB_KEY).decode()
    if found != identity:
        raise RuntimeError(f'rank {rank} of {identity} reached the process group of {found} '
                           f'at {port} and stops instead of joining it; {advice}')
    store.set_timeout(timeout)
    return PrefixStore('default_pg', store), rank, world_size


def _this_attempt(store: torch.distributed.Store) -> torch.distributed.Store:
    """The keys of this start of the group: under ``torchrun --max-restarts``, a restarted
    group's processes meet in the store of the group before (its agent's), where the dead
    processes' addresses still stand under the keys gloo and NCCL look up (a process then
    connects to a dead peer's port and fails, "Connection refused"); each start gets keys
    of its own."""
    restarts = os.environ.get('TORCHELASTIC_RESTART_COUNT')
    return store if restarts is None else PrefixStore(f'vitdense/start_{restarts}', store)


#: first port of the rendezvous ports derived from SLURM job ids (below Linux's ephemeral
#: range, so no client socket holds it); two jobs on one node whose ids differ by a multiple
#: of SLURM_PORTS derive one port, which :func:`join_rendezvous` then refuses to share
SLURM_PORT_BASE, SLURM_PORTS = 15000, 15000


def slurm_master_port(environ: Mapping[str, str]) -> int:
    """The rendezvous port of a SLURM job step: the first of the ports SLURM reserved for the
    step (``SLURM_STEP_RESV_PORTS``: ``12000-12015``, ``12000`` or ``12000-12001,12005``;
    ``srun --resv-ports``) when there are some, else one derived from the job id."""
    reserved = environ.get('SLURM_STEP_RESV_PORTS')
    if reserved:
        first = re.fullmatch(r'\s*(\d+)(-\d+)?(,[\d,-]+)?\s*', reserved)
        if first is None:
            raise ValueError(f'SLURM_STEP_RESV_PORTS={reserved!r} is no list of ports '
                             '(expected e.g. 12000-12015)')
        return int(first.group(1))
    return SLURM_PORT_BASE + int(environ['SLURM_JOB_ID']) % SLURM_PORTS


def first_host(nodelist: str) -> str:
    """The first host of a SLURM node list (``gpu[03-05,09],cpu1`` -> ``gpu03``), as
    ``scontrol show hostnames`` would list it first, without needing scontrol."""
    depth, end = 0, len(nodelist)
    for i, char in enumerate(nodelist):
        depth += {'[': 1, ']': -1}.get(char, 0)
        if char == ',' and depth == 0:
            end = i
            break
    return re.sub(r'\[([^\]]+)\]', lambda m: re.split('[,-]', m.group(1))[0], nodelist[:end])


def export_slurm_environment(environ: MutableMapping[str, str]) -> None:
    """RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT from the variables ``srun``
    gives each task (the port: :func:`slurm_master_port`); a MASTER_ADDR or MASTER_PORT
    already set is kept."""
    needed = ('SLURM_PROCID', 'SLURM_NTASKS', 'SLURM_LOCALID', 'SLURM_NODELIST', 'SLURM_JOB_ID')
    missing = [name for name in needed if not environ.get(name)]
    if missing:
        raise RuntimeError(f'--launcher slurm: {", ".join(missing)} not set; start the tool '
                           'with srun (tools/slurm_train.sh), or use --launcher pytorch under '
                           'torchrun (tools/dist_train.sh)')
    environ.update(RANK=environ['SLURM_PROCID'], WORLD_SIZE=environ['SLURM_NTASKS'],
                   LOCAL_RANK=environ['SLURM_LOCALID'])
    environ.setdefault('MASTER_ADDR', first_host(environ['SLURM_NODELIST']))
    environ.setdefault('MASTER_PORT', str(slurm_master_port(environ)))


#: the rendezvous port of ``--launcher mpi`` when MASTER_PORT is not set (torch's default)
MPI_DEFAULT_PORT = '29500'


def export_mpi_environment(environ: MutableMapping[str, str]) -> None:
    """RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT from the variables Open
    MPI's ``mpirun`` gives each process. MASTER_ADDR, when not set, is this machine if every
    process runs on it, else an error says to pass node 0's address; MASTER_PORT, when not
    set, is :data:`MPI_DEFAULT_PORT`."""
    needed = ('OMPI_COMM_WORLD_RANK', 'OMPI_COMM_WORLD_SIZE', 'OMPI_COMM_WORLD_LOCAL_RANK')
    missing = [name for name in needed if not environ.get(name)]
    if missing:
        raise RuntimeError(f'--launcher mpi: {", ".join(missing)} not set; start the tool '
                           'with Open MPI\'s mpirun, or use --launcher pytorch under torchrun '
                           '(tools/dist_train.sh)')
    environ.update(RANK=environ['OMPI_COMM_WORLD_RANK'],
                   WORLD_SIZE=environ['OMPI_COMM_WORLD_SIZE'],
                   LOCAL_RANK=environ['OMPI_COMM_WORLD_LOCAL_RANK'])
    if not environ.get('MASTER_ADDR'):
        if environ.get('OMPI_COMM_WORLD_LOCAL_SIZE') != environ['WORLD_SIZE']:
            raise RuntimeError('--launcher mpi on several nodes: set MASTER_ADDR to the '
                               'address of the node of process 0 (mpirun -x MASTER_ADDR=...)')
        environ['MASTER_ADDR'] = '127.0.0.1'
    environ.setdefault('MASTER_PORT', MPI_DEFAULT_PORT)


def gather_results_over_process_group(cfg: Config) -> None:
    """Have every evaluation metric gather the processes' results over the process group.

    mmengine's default gathers them through files in a relative ``.dist_test/`` folder, which
    fails (FileNotFoundError on rank 0) when the processes' working directories are not one
    shared folder, e.g. on several nodes. ``collect_device='gpu'`` is mmengine's name for
    gathering over the process group; it works on gloo (CPU) too. A metric that sets
    ``collect_device`` or ``collect_dir`` itself is left as it is.
    """
    for key in ('val_evaluator', 'test_evaluator'):
        evaluator = cfg.get(key)
        if isinstance(evaluator, dict) and 'metrics' in evaluator:
            evaluator = evaluator['metrics']
        for metric in evaluator if isinstance(evaluator, (list, tuple)) else [evaluator]:
            if isinstance(metric, dict) and not {'collect_device', 'collect_dir'} & set(metric):
                metric['collect_device'] = 'gpu'


def _prepare_cpu_distributed(cfg: Config) -> None:
    """Multi-process training without GPUs: DDP without device ids (over the gloo group that
    :func:`open_process_group` opens).

    mmengine's ``init_dist`` calls ``torch.cuda.set_device`` and its default DDP wrapper passes
    ``device_ids=[LOCAL_RANK]``; both assume one GPU per process. The Runner skips
    ``init_dist`` when a group exists, and the model is wrapped by
    ``vitdense.CPUDistributedDataParallel``, which also turns SyncBN layers into plain BN
    (each process normalises with its own batch) and lays DDP's gradient buckets out once,
    before the first iteration (a resumed run repeats the uninterrupted one bit for bit).
    """
    wrapper = ConfigDict(cfg.get('model_wrapper_cfg') or {})
    if wrapper.get('type') == 'vitdense.FullyShardedModel':  # shards on any device
        return
    if wrapper.get('type', 'MMDistributedDataParallel') != 'MMDistributedDataParallel':
        raise ValueError(f'model_wrapper_cfg.type={wrapper.type!r}: on CPU (no CUDA device) '
                         'vitdense tools wrap models in vitdense.CPUDistributedDataParallel, '
                         'a MMDistributedDataParallel, or shard them with '
                         'vitdense.FullyShardedModel')
    wrapper.type = 'vitdense.CPUDistributedDataParallel'
    cfg.model_wrapper_cfg = wrapper
    print_log(f'no CUDA device: rank {os.environ.get("RANK")} of '
              f'{os.environ.get("WORLD_SIZE")} runs on CPU with the gloo backend; '
              f'SyncBN layers normalise per process', logger='current')


def exit_with_launcher() -> None:
    """Have the kernel stop this worker when its launcher (torchrun's agent) dies.

    A killed launcher otherwise leaves its workers training on, holding the GPUs, and a
    worker whose peers are gone waits in its next collective until the timeout.
    """
    if not sys.platform.startswith('linux'):
        return
    parent = os.getppid()
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGTERM))
    if os.getppid() != parent:  # the launcher died before the request took effect
        raise SystemExit(f'launcher (pid {parent}) is gone; worker {os.getpid()} exits')


def children_of(pid: int) -> list[int]:
    """The ids of the processes whose parent is ``pid`` (from ``/proc``; Linux)."""
    found = []
    for entry in os.scandir('/proc'):
        if entry.name.isdigit():
            try:
                with open(osp.join(entry.path, 'stat')) as f:
                    if int(f.read().rsplit(') ', 1)[1].split()[1]) == pid:
                        found.append(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
    return found


def wake_siblings() -> None:
    """Send SIGCONT to the other processes of this worker's launcher.

    A stopped worker (SIGSTOP, a suspended job) makes its peers fail at the process-group
    timeout; the launcher then sends every worker SIGTERM, which a stopped process does not
    act on until it is continued, so torchrun would wait its 30 s grace period and SIGKILL
    it. Continued at once, the worker acts on the SIGTERM (or finds its peer gone in its
    next collective) and exits, so every process is gone shortly after the timeout.
    """
    if not sys.platform.startswith('linux'):
        return
    for pid in children_of(os.getppid()):
        if pid != os.getpid():
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass


def close_process_group() -> None:
    """Tear the process group down before the interpreter exits; call it once the runner is
    gone (after ``main()`` returns).

    Left to interpreter shutdown, gloo's threads can be destroyed while still joinable
    (``terminate called without an active exception``): a worker that finished its work then
    dies with SIGABRT and torchrun reports the run as failed. A DistributedDataParallel model
    holds the group as well, so the garbage is collected first (the runner and its wrapped
    model are in reference cycles), every process waits for the others at a barrier, and only
    then is the group destroyed.
    """
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        gc.collect()
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def run_tool(main: Callable[[], None]) -> None:
    """The tools' launch entry point: run a tool's ``main`` and close the process group; exit
    with :data:`~vitdense.engine.preemption.PREEMPTED_EXIT_CODE` when a preemption signal
    stopped training after its checkpoint was saved, else return. A worker of a launched job
    (its process group open, :func:`join_job`) that fails wakes its stopped siblings
    (:func:`wake_siblings`) before the error propagates."""
    status = 0
    try:
        main()
    except Preempted as stop:
        print(f'rank {get_rank()}: {stop}', file=sys.stderr, flush=True)
        status = stop.exit_code
    except (Exception, KeyboardInterrupt):
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            wake_siblings()
        raise
    close_process_group()  # after the except clause has let go of the runner's frames
    if status:  # a normal end returns, so that a caller running the tool in-process goes on
        sys.exit(status)


def add_safety_hooks(cfg: Config, max_nonfinite: int = 5) -> None:
    """Exact resume (random state in checkpoints), the non-finite step guard and the save on
    preemption signals, unless the config has them already."""
    hooks = list(cfg.get('custom_hooks') or [])
    present = {str(hook.get('type')).split('.')[-1] for hook in hooks}
    wanted = dict(ExactResumeHook=dict(type='vitdense.ExactResumeHook'),
                  NonFiniteGuardHook=dict(type='vitdense.NonFiniteGuardHook',
                                          max_consecutive=max_nonfinite),
                  PreemptionHook=dict(type='vitdense.PreemptionHook'))
    cfg.custom_hooks = hooks + [hook for name, hook in wanted.items() if name not in present]


def log_to_tensorboard(cfg: Config) -> None:
    """Also write the run's scalars as TensorBoard events (``<work_dir>/<time>/vis_data``),
    beside the backends the config already has."""
    backends = cfg.visualizer.setdefault('vis_backends', [])
    if not any(backend.get('type') == 'TensorboardVisBackend' for backend in backends):
        backends.append(dict(type='TensorboardVisBackend'))


def torchrun_restarts() -> int:
    """How many times torchrun (``--max-restarts``) started this process's group again
    (``TORCHELASTIC_RESTART_COUNT``); 0 outside torchrun."""
    return int(os.environ.get('TORCHELASTIC_RESTART_COUNT') or 0)


def apply_resume(cfg: Config, resume: str | None) -> None:
    """Set up ``--resume`` (``'auto'``: the newest loadable checkpoint of the work dir), one
    decision for the whole job.

    Process 0 chooses the checkpoint and sends its path to the others; every process checks
    that it can read that file, and if any cannot, every process stops with an error naming
    the file and those processes (e.g. node-local work dirs that hold different checkpoints),
    so no process ever starts from other weights than the rest. A named checkpoint must exist
    and load. With ``'auto'`` and nothing to resume, the run says so loudly and starts from
    iteration 0, so one command line both starts and continues a run. Every process prints
    what it resumes from (mmengine's logger shows process 0 only).

    A group that torchrun restarted (``--max-restarts``; ``TORCHELASTIC_RESTART_COUNT`` > 0)
    resumes as with ``'auto'``: it continues from the work dir's last checkpoint instead of
    training from iteration 0 over the checkpoints of the group before it.
    """
    restarts = torchrun_restarts()
    if resume is None and restarts > 0:
        print_log(f'torchrun restarted this group ({restarts} restart(s)): resuming from the '
                  'work dir\'s last checkpoint, as with --resume', logger='current',
                  level=logging.WARNING)
        resume = 'auto'
    if resume is None:
        return
    choice: list = [_choose_checkpoint(cfg.work_dir, resume) if get_rank() == 0 else None]
    if get_world_size() > 1:
        broadcast_object_list(choice, src=0)
    path, error, fingerprint = choice[0]
    if error is not None:
        raise FileNotFoundError(error)
    if get_world_size() == 1 and path is not None:
        safe_load(path, map_location='cpu', mmap=True)  # its own error names the file
    problems = all_gather_object(_cannot_read(path, fingerprint)) if get_world_size() > 1 else []
    failed = {rank: problem for rank, problem in enumerate(problems) if problem}
    if failed:
        raise RuntimeError(f'--resume: process 0 chose {path}, which rank(s) '
                           f'{sorted(failed)} cannot read ({"; ".join(failed.values())}); '
                           'give every node the same work dir (a shared file system) or copy '
                           'the checkpoint to each node, then resume again')
    if path is None:
        print_log(f'--resume: NOTHING TO RESUME in work dir {osp.abspath(cfg.work_dir)} '
                  '(no checkpoint there that loads); training starts from iteration 0',
                  logger='current', level=logging.WARNING)
    where = f'rank {get_rank()} of {get_world_size()}: ' if get_world_size() > 1 else ''
    print(f'{where}--resume: ' + (f'resuming from {path}' if path else
                                  'nothing to resume, starting from iteration 0'), flush=True)
    cfg.resume, cfg.load_from = path is not None, path


def refuse_to_start_over(cfg: Config) -> None:
    """Stop a run that would train from iteration 0 in a work dir holding a checkpoint that
    loads, before it overwrites that run's checkpoints; one decision for the whole job.

    Process 0 looks for the newest loadable checkpoint and sends its path to the others, so
    every process stops with the same error, which names the checkpoint and the options of
    ``tools/train.py`` that continue it (``--resume auto``) or start over on purpose
    (``--resume none``, or another ``--work-dir``). A group that torchrun restarted and a
    config that resumes by itself (``resume = True``) continue instead (:func:`apply_resume`,
    mmengine), so they are let through.
    """
    if torchrun_restarts() > 0 or cfg.get('resume'):
        return
    found: list = [find_resumable_checkpoint(cfg.work_dir) if get_rank() == 0 else None]
    if get_world_size() > 1:
        broadcast_object_list(found, src=0)
    if found[0] is not None:
        raise FileExistsError(
            f'work dir {cfg.work_dir} holds the checkpoint {found[0]}: training would start '
            'from iteration 0 and overwrite that run. Add --resume auto to continue it, or '
            '--resume none to start over in this work dir (its checkpoints are overwritten), '
            'or pass another --work-dir')


Choice = tuple[str | None, str | None, tuple | None]


def _choose_checkpoint(work_dir: str, resume: str) -> Choice:
    """(checkpoint to resume from or None, error or None, its fingerprint), on process 0."""
    if resume == 'auto':
        if osp.isdir(work_dir):
            remove_interrupted_saves(work_dir)
        path = find_resumable_checkpoint(work_dir)
    elif not osp.isfile(resume):
        return None, f'--resume {resume}: no such checkpoint file', None
    else:
        path = resume
    return path, None, None if path is None else _fingerprint(path)


def _fingerprint(path: str) -> tuple:
    """Size and iteration of a checkpoint: a file of that name on another node that is not
    the same checkpoint differs in one of them."""
    meta = safe_load(path, map_location='cpu', mmap=True).get('meta') or {}
    return osp.getsize(path), meta.get('iter')


def _cannot_read(path: str | None, fingerprint: tuple | None) -> str | None:
    """Why this process cannot load the checkpoint process 0 chose, or None when it can (or
    there is none)."""
    rank = f'rank {get_rank()}'
    if path is None:
        return None
    if not osp.isfile(path):
        return f'{rank}: no such file'
    try:
        mine = _fingerprint(path)
    except (CorruptCheckpointError, UnsafeCheckpointError, OSError) as err:
        return f'{rank}: {err}'
    if mine != fingerprint:
        return (f'{rank}: its file of that name is another checkpoint (size, iteration '
                f'{mine}, process 0 has {fingerprint})')
    return None


def point_at_data_root(cfg: Config, data_root: str | os.PathLike) -> None:
    """Read every split from ``data_root``; evaluators with an annotation file (COCO) read
    the file of the same name from ``data_root/annotations``."""
    for loader in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        cfg[loader].dataset.data_root = str(data_root)
    for evaluator in ('val_evaluator', 'test_evaluator'):
        if 'ann_file' in cfg[evaluator]:
            name = osp.basename(cfg[evaluator].ann_file)
            cfg[evaluator].ann_file = osp.join(str(data_root), 'annotations', name)


def add_test_metric(cfg: Config, metric: dict) -> None:
    """Append ``metric`` to the test evaluator (a dict or a list of dicts)."""
    evaluator = cfg.test_evaluator
    metrics = list(evaluator) if isinstance(evaluator, (list, tuple)) else [evaluator]
    cfg.test_evaluator = metrics + [metric]
