"""Shared by all tests.

- vitdense's host fixes (``vitdense.compat``: mmcv-lite's ops) are applied, as every
  vitdense tool applies them, before any test imports mmcv.ops through mmdet or mmseg.
- mmengine resolves each ``mmdet::`` / ``mmseg::`` / ``mmpretrain::`` config base by parsing
  the package's ~400 metafiles (about a second), and config tests resolve hundreds: each
  YAML text is parsed once a session (:class:`_YamlParsedOnce`, through mmengine's public
  file-handler registry), and every load still gets an object of its own.
- mmengine's default scope is process-wide and building a config's model sets it: each test
  leaves it as it found it, so no test depends on which ran before it.
- Fixtures that several test folders use.
- Which tests are slow, and how ``pytest -n`` (pytest-xdist, as ``tools/run_tests.sh`` runs
  the suite) shares them between its workers: see :func:`pytest_collection_modifyitems`.
"""
from __future__ import annotations

import pickle
from pathlib import Path
from typing import IO, Any

import numpy as np
import pytest
from mmengine.fileio import YamlHandler, register_handler
from mmengine.registry import DefaultScope
from PIL import Image

from vitdense.compat import apply_host_fixes
from vitdense.demo_data import make_demo_ade, make_demo_coco

apply_host_fixes()


@register_handler(['yaml', 'yml'])
class _YamlParsedOnce(YamlHandler):
    """mmengine's YAML handler that parses each text once: later loads of the same text get a
    copy (unpickled) of what it parsed to, as a new parse would give."""

    def __init__(self) -> None:
        self.parsed: dict[str, bytes] = {}  # a text's parse, pickled

    def load_from_fileobj(self, file: IO, **kwargs: Any) -> Any:
        if kwargs:  # a loader of the caller's choice: parsed as asked
            return super().load_from_fileobj(file, **kwargs)
        text = file.read()
        if text not in self.parsed:
            self.parsed[text] = pickle.dumps(super().load_from_fileobj(text))
        return pickle.loads(self.parsed[text])


@pytest.fixture(scope='session')
def demo_coco_root(tmp_path_factory) -> Path:
    """The demo COCO set at 64 px: 4 training images, 2 validation images."""
    return make_demo_coco(tmp_path_factory.mktemp('coco'), num_train=4, num_val=2, size=64)


@pytest.fixture(scope='session')
def demo_ade_root(tmp_path_factory) -> Path:
    """The demo ADE20k-layout set at 64 px: 4 training images, 2 validation images."""
    return make_demo_ade(tmp_path_factory.mktemp('ade'), num_train=4, num_val=2, size=64)


@pytest.fixture
def image_folder(tmp_path: Path) -> Path:
    """``tmp_path/images`` holding two random 64×48 RGB pictures, ``one.jpg`` and ``two.jpg``."""
    folder = tmp_path / 'images'
    folder.mkdir()
    rng = np.random.default_rng(0)
    for name in ('one', 'two'):
        Image.fromarray(rng.integers(0, 255, (48, 64, 3), dtype=np.uint8)).save(
            folder / f'{name}.jpg')
    return folder


@pytest.fixture
def iteration_clock(monkeypatch):
    """``TimeBudgetHook(clock='iterations')`` reads :class:`common.IterationClock`: one
    second per finished iteration, a reproducible time budget."""
    from common import IterationClock
    from vitdense.engine import TimeBudgetHook
    monkeypatch.setitem(TimeBudgetHook.CLOCKS, 'iterations', lambda: IterationClock.now[0])


def _restore_default_scope():
    from common import instances_kept
    with instances_kept(DefaultScope):
        yield


#: mmengine's default scope restored after each test, as its own
#: ``DefaultScope.overwrite_default_scope`` does, and after each module (module-scoped
#: fixtures, such as runners shared by a module's tests, set it before any test starts)
default_scope_as_found = pytest.fixture(autouse=True)(_restore_default_scope)
module_default_scope_as_found = pytest.fixture(autouse=True, scope='module')(
    _restore_default_scope)


# ----------------------------------------------------------------- slow tests, and workers
#: "SECONDS NODEID" lines: the tests that take SLOW_SECONDS or more (setup, call and teardown)
#: on the project's 2-core machine, written by ``--write-slow-tests``
SLOW_TESTS = Path(__file__).with_name('slow_tests.txt')
SLOW_SECONDS = 2.0
#: the tests (node ids, or their beginnings) that start groups of processes (distributed
#: trainings, launchers, SLURM tasks on a port drawn from the job id): one worker runs them
#: one after the other, so that two of them never share the two cores, nor a port
PROCESS_GROUPS = ('tests/engine/wrappers/test_distributed.py::', 'tests/engine/test_launch.py::',
                  'tests/engine/test_resume_choice.py::', 'tests/engine/hooks/test_nonfinite.py::',
                  'tests/engine/hooks/test_preemption.py::', 'tests/engine/test_rendezvous.py::',
                  'tests/engine/hooks/test_resume.py::',
                  'tests/tools/test_slurm.py::',
                  'tests/tools/test_train.py::test_dist_train_two_cpu_processes')
#: files whose tests the workers take one at a time (by default a worker takes a whole
#: file, so that a module's fixtures are built once): their fixtures are cheap beside
#: their tests, which are long
ONE_BY_ONE = ('tests/test_guide_commands.py', 'tests/configs/test_host_heads.py',
              'tests/tools/test_train.py')


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption('--write-slow-tests', action='store_true',
                     help=f'record in {SLOW_TESTS.name} the tests of this run that take '
                          f'{SLOW_SECONDS:g} s or more, keeping the lines of tests it did not run')


def _measured() -> dict[str, float]:
    """The seconds of each test of :data:`SLOW_TESTS`, by node id."""
    lines = SLOW_TESTS.read_text().splitlines() if SLOW_TESTS.exists() else []
    return {nodeid: float(seconds) for seconds, nodeid in
            (line.split(' ', 1) for line in lines if line and not line.startswith('#'))}


def _group(nodeid: str) -> str | None:
    """The xdist group of a test: its file's, the process groups', or none (one by one)."""
    if nodeid.startswith(PROCESS_GROUPS):
        return 'process-groups'
    path = nodeid.split('::', 1)[0]
    return None if path in ONE_BY_ONE else path


def _collected_whole(config: pytest.Config, path: str, collected: set[str]) -> bool:
    """Whether the command line named the test file ``path`` whole (or a folder above it),
    not some of its tests, and it was collected (or is not there any more)."""
    file = config.rootpath / path
    named = [(config.invocation_params.dir / arg).resolve() for arg in config.args
             if '::' not in arg]
    return any(file == whole or whole in file.parents for whole in named) and (
        not file.exists() or any(nodeid.startswith(f'{path}::') for nodeid in collected))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark ``slow`` each test that :data:`SLOW_TESTS` lists; give each its ``xdist_group``
    (``--dist loadgroup`` gives a worker a whole group at a time); under xdist, start the
    groups that take longest first, so that no long one is left for the end while the
    other worker idles. Runs before ``-m`` and xdist read the marks."""
    seconds = _measured()
    collected = {item.nodeid for item in items}
    stale = [nodeid for nodeid in seconds if nodeid not in collected and
             _collected_whole(config, nodeid.split('::', 1)[0], collected)]
    if stale:
        raise pytest.UsageError(
            f'{SLOW_TESTS} names tests that are not there any more: {", ".join(stale)}; '
            f'delete their lines, or rerun their files with --write-slow-tests')
    group_seconds: dict[str | None, float] = {}
    for item in items:
        if seconds.get(item.nodeid, 0.0) >= SLOW_SECONDS:
            item.add_marker(pytest.mark.slow)
        group = _group(item.nodeid)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
        group_seconds[group] = group_seconds.get(group, 0.0) + seconds.get(item.nodeid, 0.0)
    if hasattr(config, 'workerinput'):  # an xdist worker: xdist hands the groups out in
        def longest_first(item: pytest.Item) -> float:  # the order the workers collect them
            group = _group(item.nodeid)
            return -(seconds.get(item.nodeid, 0.0) if group is None else group_seconds[group])
        items.sort(key=longest_first)


class _SlowTestsRecorder:
    """Adds up each test's setup, call and teardown seconds; rewrites :data:`SLOW_TESTS`."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        nodeid = report.nodeid  # under --dist loadgroup: NODEID@GROUP
        if nodeid.rfind('@') > nodeid.rfind(']'):
            nodeid = nodeid.rsplit('@', 1)[0]
        self.seconds[nodeid] = self.seconds.get(nodeid, 0.0) + report.duration

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        kept = {nodeid: spent for nodeid, spent in _measured().items()
                if nodeid not in self.seconds}
        slow = {**kept, **{nodeid: spent for nodeid, spent in self.seconds.items()
                           if spent >= SLOW_SECONDS}}
        header = [line for line in SLOW_TESTS.read_text().splitlines()
                  if line.startswith('#')] if SLOW_TESTS.exists() else []
        SLOW_TESTS.write_text('\n'.join(header + [
            f'{spent:.1f} {nodeid}' for nodeid, spent in
            sorted(slow.items(), key=lambda pair: (-pair[1], pair[0]))]) + '\n')


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption('--write-slow-tests') and not hasattr(config, 'workerinput'):
        config.pluginmanager.register(_SlowTestsRecorder(), 'vitdense-slow-tests')
