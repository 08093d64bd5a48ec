"""A tool's process in its job: the launch entry point (:func:`run_tool`), the check of the
temporary folder its loader workers need, joining the job's process group (torchrun, SLURM,
Open MPI; never another job's), the parent-death signal and the wake-up of stopped siblings.
Only a tool's ``main`` calls these (:func:`join_job`); importing vitdense or loading a config
changes nothing of the process.
"""
from __future__ import annotations

import atexit
import ctypes
import datetime
import gc
import os
import os.path as osp
import re
import signal
import sys
import tempfile
from typing import Callable, Mapping, MutableMapping

import torch
from mmengine.config import Config, ConfigDict
from mmengine.dist import get_rank, init_dist
from mmengine.logging import print_log
from torch.distributed import PrefixStore
from torch.distributed.constants import default_pg_timeout

from vitdense.engine.hooks.preemption import Preempted, collect_and_freeze_heap


def join_job(cfg: Config) -> None:
    """A tool's process-level set-up: its loader workers can hand it their batches
    (:func:`check_socket_folder`); then, for a launched tool (not ``launcher='none'``), the
    kernel stops this worker when its launcher dies (:func:`exit_with_launcher`), the process
    group is opened before the Runner is built (:func:`open_process_group`) and the metrics
    gather their results over it (:func:`gather_results_over_process_group`). Tools call it
    right after :func:`load_config`, in their ``main`` that :func:`run_tool` runs."""
    check_socket_folder(cfg)
    if cfg.launcher == 'none':
        return
    exit_with_launcher()
    open_process_group(cfg, cfg.launcher)
    gather_results_over_process_group(cfg)


#: the longest path of a Unix socket, in bytes (``sun_path`` of ``sockaddr_un``, 108 bytes on
#: Linux, with the terminating NUL that Python's ``bind`` requires)
UNIX_SOCKET_PATH_LIMIT = 107

#: what multiprocessing adds to the temporary folder for its sockets:
#: ``/pymp-XXXXXXXX/listener-XXXXXXXX`` (``multiprocessing.util.get_temp_dir``)
SOCKET_SUFFIX = len('/pymp-12345678/listener-12345678')


def check_socket_folder(cfg: Config) -> None:
    """Refuse a temporary folder (``TMPDIR``) too long for the Unix sockets of loader workers.

    A loader worker hands each batch's tensors to the trainer as file descriptors, through a
    Unix socket that multiprocessing opens in the temporary folder; past
    :data:`UNIX_SOCKET_PATH_LIMIT` bytes it cannot (``OSError: AF_UNIX path too long`` in the
    worker's queue thread, which drops the batch), and the trainer waits for its first batch
    for ever. Checked for configs whose loaders have workers.
    """
    loaders = [cfg.get(f'{split}_dataloader') or {} for split in ('train', 'val', 'test')]
    if not any(loader.get('num_workers', 0) for loader in loaders):
        return
    folder = tempfile.gettempdir()
    length = len(os.fsencode(folder)) + SOCKET_SUFFIX
    if length > UNIX_SOCKET_PATH_LIMIT:
        raise OSError(f'temporary folder {folder} is too long for the loader workers: their '
                      f'Unix socket <folder>/pymp-XXXXXXXX/listener-XXXXXXXX would take '
                      f'{length} bytes, over the {UNIX_SOCKET_PATH_LIMIT}-byte limit of a '
                      f'Unix socket path, and no batch would reach the trainer; set TMPDIR to '
                      f'a folder of at most {UNIX_SOCKET_PATH_LIMIT - SOCKET_SUFFIX} bytes '
                      '(e.g. TMPDIR=/tmp), or num_workers=0')


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
    both jobs and the port, when it is not its own job's; process 0 never overwrites
    another job's identity in a store it finds (torchrun's agent's). A port already held
    stops process 0 at once as well, naming the process that holds it (:func:`port_holder`).
    """
    identity, advice = job_identity(os.environ)
    port = f'{os.environ["MASTER_ADDR"]}:{os.environ["MASTER_PORT"]}'
    try:
        store, rank, world_size = next(torch.distributed.rendezvous('env://', timeout=timeout))
    except torch.distributed.DistNetworkError as err:
        if 'EADDRINUSE' not in str(err):
            raise
        holder = port_holder(int(os.environ['MASTER_PORT']))
        raise RuntimeError(f'rank 0 of {identity} cannot open the rendezvous at {port}: '
                           f'{holder} holds that port; {advice}') from err
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


def port_holder(port: int) -> str:
    """Who holds the TCP ``port`` of this machine that process 0 cannot listen on: ``process
    <pid> (<command line>)`` of the process of this user listening there (``/proc/net/tcp*``
    give the socket, ``/proc/<pid>/fd`` its owner; Linux), else ``another process``.

    The command line names the other job (its tool, config and work dir); the store such a
    process serves is not asked for its job's identity, since a client of a port where no
    store answers waits without a time limit."""
    sockets = set()
    for table in ('/proc/net/tcp', '/proc/net/tcp6'):
        try:
            with open(table) as rows:
                for row in list(rows)[1:]:
                    fields = row.split()
                    if fields[3] == '0A' and int(fields[1].rsplit(':', 1)[1], 16) == port:
                        sockets.add(f'socket:[{fields[9]}]')  # 0A: LISTEN
        except OSError:
            continue
    for entry in os.scandir('/proc') if sockets else ():
        if not entry.name.isdigit():
            continue
        try:
            if any(os.readlink(fd.path) in sockets for fd in os.scandir(f'{entry.path}/fd')):
                with open(f'{entry.path}/cmdline', 'rb') as command:
                    line = command.read().replace(b'\0', b' ').decode(errors='replace')
                return f'process {entry.name} ({line.strip()})'
        except OSError:
            continue
    return 'another process'


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
    with :data:`~vitdense.engine.hooks.preemption.PREEMPTED_EXIT_CODE` when a preemption signal
    stopped training after its checkpoint was saved (ignoring the stop signals from then on,
    so that a second one cannot kill the process before it exits), else return. Either way
    the process's exit skips the collection of its whole heap
    (:func:`~vitdense.engine.hooks.preemption.collect_and_freeze_heap`), seconds on a loaded
    machine. A worker of a launched job (its process group open, :func:`join_job`) that fails
    wakes its stopped siblings (:func:`wake_siblings`) before the error propagates."""
    status = 0
    try:
        main()
    except Preempted as stop:
        stop.ignore_signals()  # saved: a later stop signal must not turn the exit 75 into -15
        print(f'rank {get_rank()}: {stop}', file=sys.stderr, flush=True)
        status = stop.exit_code
    except (Exception, KeyboardInterrupt):
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            wake_siblings()
        raise
    close_process_group()  # after the except clause has let go of the runner's frames
    atexit.unregister(collect_and_freeze_heap)  # once, and before the other exit handlers
    atexit.register(collect_and_freeze_heap)
    if status:  # a normal end returns, so that a caller running the tool in-process goes on
        sys.exit(status)


def torchrun_restarts() -> int:
    """How many times torchrun (``--max-restarts``) started this process's group again
    (``TORCHELASTIC_RESTART_COUNT``); 0 outside torchrun."""
    return int(os.environ.get('TORCHELASTIC_RESTART_COUNT') or 0)
