"""Saving a checkpoint when the job is told to stop (preemption, a time limit), then exiting
or requeueing the job.

A cluster stops a job with a signal and a grace period before SIGKILL: SLURM sends SIGTERM
(KillWait later, SIGKILL) on preemption or cancellation, and ``--signal=B:USR1@120`` a
warning before the time limit; Kubernetes sends SIGTERM. Python's default for both is to
die on the spot, losing every iteration since the last interval checkpoint (16k iterations
of the UperNet recipe). mmengine has no hook for this, hence :class:`PreemptionHook`.

Launchers send the signal to more than the trainer: torchrun's agent to each worker's whole
process group (``os.killpg``), SLURM to every process of the job step. torch's loader
workers die on a SIGTERM that does not come from their parent (and the trainer then fails
with "DataLoader worker ... is killed by signal"), so the hook has every loader's workers
ignore the stop signals that come from anyone but the trainer (:func:`shield_loader_workers`);
the trainer ends them when it exits, and they exit by themselves when it is gone. A worker
starts with those signals blocked (the trainer blocks them while it starts the worker), so
one that arrives before the shield is set waits for the shield instead of ending the worker.

The signal only sets a flag. At the end of the iteration in progress (or of the validation
iteration in progress) every process takes part in one all-reduce of the flag, so all of
them stop after the same iteration even when the signal reached one of them only; all save
through the atomic writer
(:func:`~vitdense.engine.hooks.checkpoint.save_resumable`, random state and sampler position
included via :class:`~vitdense.engine.hooks.resume.ExactResumeHook`) and :class:`Preempted` is
raised. ``tools/train.py`` catches it and exits with :data:`PREEMPTED_EXIT_CODE`; under
SLURM process 0 first asks for the job to be requeued (``scontrol requeue``), and the
requeued job's ``--resume`` continues from that iteration. The process's exit skips the
collection of its whole heap (:func:`collect_and_freeze_heap`), the slowest part of a stop,
so that it ends well within a cluster's grace period.
"""
from __future__ import annotations

import atexit
import gc
import logging
import multiprocessing
import os
import shutil
import signal
import subprocess
import threading
from pathlib import Path
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from types import FrameType
from typing import Any, Callable, Sequence

import torch
from mmengine.dist import all_reduce, get_rank, get_world_size, is_main_process
from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.runner import IterBasedTrainLoop
from torch.utils.data import DataLoader

from vitdense.engine.hooks.checkpoint import save_resumable
from vitdense.engine.hooks.resume import restart_loop_iterator
from vitdense.internals import drop_loader_workers, shut_down_loader_workers
from vitdense.registry import HOOKS

#: exit status of a training process stopped by a preemption signal after its checkpoint
#: was saved (``EX_TEMPFAIL`` of sysexits.h: try again later, e.g. ``--resume``)
PREEMPTED_EXIT_CODE = 75


#: environment variable naming the directory where each process leaves the empty file
#: ``<global rank>.stopped`` once its stop checkpoint is saved, or ``<global rank>.finished``
#: once its training has ended (set by tools/torchrun.sh, which reads the outcome from them)
STOPPED_DIR_ENV = 'VITDENSE_STOPPED_DIR'


#: the outcomes a process leaves in the directory :data:`STOPPED_DIR_ENV` names
OUTCOMES = ('stopped', 'finished')


def leave_outcome(outcome: str | None) -> None:
    """Create this process's file ``<global rank>.<outcome>`` in the directory
    ``VITDENSE_STOPPED_DIR`` names, or with None remove those an earlier start of this
    process left in a directory used again (nothing when the variable is not set)."""
    directory = os.environ.get(STOPPED_DIR_ENV)
    if not directory:
        return
    if outcome is None:
        for name in OUTCOMES:
            Path(directory, f'{get_rank()}.{name}').unlink(missing_ok=True)
    else:
        Path(directory, f'{get_rank()}.{outcome}').touch()


class Preempted(Exception):
    """Training stopped on a preemption signal; ``checkpoint`` holds the last iteration.

    The hook's handlers of ``signals`` are still installed, so that a second signal cannot
    kill the process between the save and its exit: a process that exits sets them to be
    ignored (:func:`~vitdense.engine.launch.run_tool`), a caller that goes on puts the
    previous ones back (:meth:`restore_signals`)."""

    exit_code = PREEMPTED_EXIT_CODE

    def __init__(self, checkpoint: Path, iteration: int, requeued: bool,
                 signals: Sequence[int] = (),
                 restore_signals: Callable[[], None] | None = None) -> None:
        self.checkpoint, self.iteration, self.requeued = checkpoint, iteration, requeued
        self.signals, self._restore_signals = list(signals), restore_signals
        then = 'the job was requeued' if requeued else 'run with --resume to continue'
        super().__init__(f'stopped by a preemption signal after iteration {iteration}; '
                         f'saved {checkpoint}; {then}')

    def restore_signals(self) -> None:
        """Put back the handlers the stop signals had before the hook was built."""
        if self._restore_signals is not None:
            self._restore_signals()

    def ignore_signals(self) -> None:
        """Have this process ignore the stop signals until it exits: its checkpoint is saved
        and it exits with :attr:`exit_code` (an ignored signal stays ignored while the
        interpreter shuts down, where a handler is put back to the default, which kills)."""
        for sig in self.signals:
            signal.signal(sig, signal.SIG_IGN)


def slurm_job_to_requeue() -> str | None:
    """The SLURM job id ``scontrol requeue`` takes (``<array job>_<task>`` for an array
    task), or None outside a SLURM job."""
    array_job, task = os.environ.get('SLURM_ARRAY_JOB_ID'), os.environ.get('SLURM_ARRAY_TASK_ID')
    if array_job and task:
        return f'{array_job}_{task}'
    return os.environ.get('SLURM_JOB_ID')


class _ShieldedWorker:
    """A loader's ``worker_init_fn`` that first has the worker ignore ``signals`` unless the
    trainer sends them: the worker keeps them blocked, and a thread of its own takes each one
    (``sigwaitinfo``, which names the sender), those that arrived while the worker was
    starting included; the trainer's SIGTERM (torch's way of ending a worker that did not
    stop, and multiprocessing's at the trainer's exit) ends the worker as torch's own handler
    would.

    The trainer is the process that started the worker (``multiprocessing.parent_process``),
    whatever the start method: with ``forkserver`` the worker's parent in the kernel
    (``os.getppid``) is the fork server, which never sends it a signal.

    Picklable, so loaders that start workers with ``spawn`` or ``forkserver`` get it too.
    """

    def __init__(self, init_fn: Any, signals: Sequence[int]) -> None:
        self.init_fn, self.signals = init_fn, sorted({signal.SIGTERM, *signals})

    def __call__(self, worker_id: int) -> None:
        # blocked since the worker started (:class:`_StartBlocked`), unless its loader's
        # context started it otherwise (a forkserver)
        signal.pthread_sigmask(signal.SIG_BLOCK, self.signals)
        threading.Thread(target=self._take_signals, args=(multiprocessing.parent_process().pid,),
                         daemon=True, name='stop-signals').start()
        if self.init_fn is not None:
            self.init_fn(worker_id)

    def _take_signals(self, trainer: int) -> None:
        while True:
            info = signal.sigwaitinfo(self.signals)
            if info.si_pid == trainer and info.si_signo == signal.SIGTERM:
                os._exit(0)


class _StartBlocked:
    """A process of a loader's multiprocessing context whose ``start`` blocks ``signals`` in
    the calling thread until the child exists: a forked child keeps that thread's signal mask,
    and an executed one (``spawn``) keeps it through ``exec``, so the child starts with them
    blocked. Everything else is the process's own."""

    def __init__(self, process: BaseProcess, signals: Sequence[int]) -> None:
        vars(self).update(process=process, signals=signals)

    def start(self) -> None:
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, self.signals)
        try:
            self.process.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.process, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.process, name, value)


class _WorkersStartBlocked(BaseContext):
    """A loader's multiprocessing context (``None``: multiprocessing's default when a worker
    starts) whose processes start with ``signals`` blocked (:class:`_StartBlocked`); its
    queues, events and locks are that context's.

    torch's loader takes a context (``DataLoader.multiprocessing_context``) and nothing else
    that runs where a worker is started. A ``forkserver`` forks workers from its server
    process, whose mask is not the trainer's: those are started as the context starts them
    and are shielded from the moment their ``worker_init_fn`` runs.
    """

    def __init__(self, context: BaseContext | None, signals: Sequence[int]) -> None:
        self.context, self.signals = context, signals

    def get_context(self, method: str | None = None) -> BaseContext:
        return (self.context or multiprocessing.get_context()).get_context(method)

    def get_start_method(self, allow_none: bool = False) -> str:
        return self.get_context().get_start_method(allow_none)

    def Process(self, *args: Any, **kwargs: Any) -> BaseProcess | _StartBlocked:  # noqa: N802
        context = self.get_context()
        process = context.Process(*args, **kwargs)
        if context.get_start_method() == 'forkserver':
            return process
        return _StartBlocked(process, self.signals)


def shield_loader_workers(loader: DataLoader, signals: Sequence[int]) -> bool:
    """Have ``loader``'s workers ignore ``signals`` (and SIGTERM) from any process but the
    trainer (:class:`_ShieldedWorker`), from the moment they start
    (:class:`_WorkersStartBlocked`); whether anything changed (False for a loader without
    workers, or one shielded before). Workers that a persistent loader started before are
    let go, so that the next pass starts shielded ones."""
    if loader.num_workers == 0 or isinstance(loader.worker_init_fn, _ShieldedWorker):
        return False
    shield = _ShieldedWorker(loader.worker_init_fn, signals)
    loader.worker_init_fn = shield
    loader.multiprocessing_context = _WorkersStartBlocked(loader.multiprocessing_context,
                                                          shield.signals)
    drop_loader_workers(loader)
    return True


def collect_and_freeze_heap() -> None:
    """Collect the young garbage (the stop's own: loader iterators, the exception's frames),
    then leave every object to the process's end (``gc.freeze``).

    Run first at the exit that follows a stop, or the end of a tool's run
    (:func:`~vitdense.engine.launch.run_tool`). The interpreter's last collections walk a
    training process's whole heap (half a million objects on the demo classifier) as its
    modules are torn down: 3.5-5 s per process at a load of 8 on two cores, most of the time
    from the stop signal to the exit. What must reach the disk is written before (the
    checkpoint, ``last_checkpoint``) or by the exit handlers, which still run (log files);
    the rest the operating system frees.
    """
    gc.collect(1)
    gc.freeze()


def stop_loader_workers(runner: Any) -> None:
    """End the worker processes of the runner's loaders now; a persistent loader lets go of
    its ended iterator (a later pass starts new workers).

    Left to interpreter exit, torch skips its own shutdown of persistent workers (its exit
    flag is set by then) and leaves them to multiprocessing's exit handler. Left to the
    garbage collector (the runner is in reference cycles), each iterator's end waits 5 s
    (``MP_STATUS_CHECK_INTERVAL``) for workers that never get torch's end-of-work message:
    the collector has run the index queues' finalizers first, which close them. Ended here,
    the workers are gone before the trainer's exit status reaches the launcher.
    """
    for name in ('_train_loop', '_val_loop', '_test_loop'):
        loop = getattr(runner, name, None)
        shut_down_loader_workers(loop)
        if isinstance(getattr(loop, 'dataloader', None), DataLoader):
            drop_loader_workers(loop.dataloader)


@HOOKS.register_module()
class PreemptionHook(Hook):
    """On any of ``signals``: save a checkpoint of the iteration in progress, then stop.

    Args:
        signals: names of the signals that mean "stop soon" (default SIGTERM and SIGUSR1).
        requeue: under SLURM (``SLURM_JOB_ID`` set, ``scontrol`` on the PATH), have process
            0 requeue the job once the checkpoint is saved (the job needs ``--requeue``).

    The handlers are installed when the hook is built and put back when the run ends
    (``after_run``), leaving the process as it was. A stop keeps them (a second signal after
    the save cannot kill the process, whose exit status must say "stopped"):
    :class:`Preempted` says how to put them back or ignore the signals. The training,
    validation and test loaders' workers are shielded before they start
    (:func:`shield_loader_workers`); an iteration loop's loader, whose workers start with the
    loop, before the hooks run, is restarted once. A signal during validation stops at the
    end of that validation iteration with a checkpoint of the training iteration it follows.

    With :data:`STOPPED_DIR_ENV` set (by ``tools/torchrun.sh``), each process creates the
    empty file ``<that dir>/<global rank>.stopped`` once the stop checkpoint is saved, or
    ``<global rank>.finished`` once training has ended: a process that is then killed (a
    signal in the tail of a finished run, torchrun's agent giving up its shutdown) is a stop
    or a finished run to the launcher, not a failure.
    """

    priority = 'LOWEST'  # after every other hook has finished the iteration (checkpoint, logs)

    def __init__(self, signals: Sequence[str] = ('SIGTERM', 'SIGUSR1'),
                 requeue: bool = True) -> None:
        unknown = [name for name in signals if name in ('SIGKILL', 'SIGSTOP') or
                   not isinstance(getattr(signal, str(name), None), signal.Signals)]
        if unknown or not signals:
            raise ValueError(f'PreemptionHook signals={list(signals)!r}: give one or more '
                             f'names of signals a process can catch, such as SIGTERM, SIGUSR1 '
                             f'(not these: {unknown})')
        self.signals = [getattr(signal, name) for name in signals]
        self.requeue = requeue
        self.received: signal.Signals | None = None
        self.saved = False  # the stop checkpoint is saved: a signal has nothing left to stop
        self.previous: dict[signal.Signals, Any] = {}
        self.training = False
        self._install()

    def _install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            print_log('PreemptionHook built outside the main thread, where Python cannot '
                      'install signal handlers: preemption signals will not be caught',
                      logger='current', level=logging.WARNING)
            return
        for sig in self.signals:
            self.previous[sig] = signal.signal(sig, self._on_signal)

    def _uninstall(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        self.previous = {}

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        """Only a flag and one line on stderr (os.write: a handler may run mid-print)."""
        if self.saved:
            os.write(2, f'[pid {os.getpid()}] {signal.Signals(signum).name} received after '
                        f'the stop checkpoint was saved: exiting as stopped\n'.encode())
        elif self.received is None:
            os.write(2, f'[pid {os.getpid()}] {signal.Signals(signum).name} received: saving '
                        f'a checkpoint at the end of this iteration, then stopping\n'.encode())
        self.received = signal.Signals(signum)

    def _agreed(self) -> bool:
        """Whether any process received a signal (every process calls this each iteration)."""
        flag = torch.tensor([0 if self.received is None else 1], dtype=torch.int32)
        if get_world_size() > 1:
            all_reduce(flag, op='max')
        return bool(flag.item())

    def before_train(self, runner) -> None:
        self.training = True
        leave_outcome(None)  # an earlier start's, in a directory used again
        loop = runner.train_loop
        if shield_loader_workers(loop.dataloader, self.signals) and isinstance(
                loop, IterBasedTrainLoop):
            restart_loop_iterator(loop)  # its workers started with the loop

    def before_val(self, runner) -> None:
        shield_loader_workers(runner.val_loop.dataloader, self.signals)

    def before_test(self, runner) -> None:
        shield_loader_workers(runner.test_loop.dataloader, self.signals)

    def after_train_iter(self, runner, batch_idx: int, data_batch: Any = None,
                         outputs: Any = None) -> None:
        if self._agreed():
            self._stop(runner, runner.iter + 1)

    def after_val_iter(self, runner, batch_idx: int, data_batch: Any = None,
                       outputs: Any = None) -> None:
        """A signal during validation between training epochs (or iterations) stops there:
        the checkpoint is of the training iteration validated (``runner.iter``)."""
        if self.training and self._agreed():
            self._stop(runner, runner.iter)

    def _stop(self, runner, step: int) -> None:
        """Save the checkpoint of ``step`` finished iterations, then raise ``Preempted``."""
        path = save_resumable(runner, step)
        self.saved = True
        leave_outcome('stopped')  # every process returns from the save once it is written
        how = self.received.name if self.received is not None else 'another process\'s signal'
        print_log(f'rank {get_rank()}: stopping after iteration {step} on {how}; process 0 '
                  f'saved {path}', logger='current', level=logging.WARNING)
        requeued = self._requeue()
        stop_loader_workers(runner)
        atexit.unregister(collect_and_freeze_heap)  # once, and before the other handlers
        atexit.register(collect_and_freeze_heap)
        raise Preempted(path, step, requeued, list(self.previous), self._uninstall)

    def after_train(self, runner) -> None:
        self.training = False
        leave_outcome('finished')  # the last checkpoint hooks ran before (after_train_*)

    def after_run(self, runner) -> None:
        """Put the signal handlers back and end the loaders' workers (a finished run's exit
        waits for none of them)."""
        self._uninstall()
        stop_loader_workers(runner)

    def _requeue(self) -> bool:
        """Process 0 requeues the SLURM job; whether that was done."""
        job = slurm_job_to_requeue()
        if not (self.requeue and job and is_main_process()):
            return False
        scontrol = shutil.which('scontrol')
        if scontrol is None:
            print_log(f'SLURM job {job}: scontrol is not on the PATH, the job is not '
                      'requeued', logger='current', level=logging.WARNING)
            return False
        done = subprocess.run([scontrol, 'requeue', job], capture_output=True, text=True)
        if done.returncode != 0:
            print_log(f'scontrol requeue {job} failed ({done.stderr.strip()}); was the job '
                      'submitted with --requeue?', logger='current', level=logging.WARNING)
            return False
        print_log(f'SLURM job {job} requeued', logger='current')
        return True
