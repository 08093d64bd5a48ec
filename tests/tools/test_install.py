"""tools/install.sh: its --help, and a disk too small for torch's CUDA build, which stops the
install with a message naming the filesystem and the space before pip has changed anything."""
from __future__ import annotations

import os
import re
import subprocess
import sys

from common import REPO_ROOT

# `df -Pk` as POSIX prints it, for a filesystem with 100 MB free.
FAKE_DF = '''#!/bin/sh
echo "Filesystem 1024-blocks Used Available Capacity Mounted on"
echo "smalldisk 1048576 946176 102400 91% /small"
'''


def test_install_stops_when_the_disk_is_too_small(tmp_path):
    constraints = (REPO_ROOT / 'requirements/constraints.txt').read_text()
    torch_version = re.search(r'^torch==(\S+)$', constraints, re.M).group(1)
    # No pip in this environment: were the check missing, the install would fail at once
    # instead of downloading torch.
    venv = tmp_path / 'venv'
    subprocess.run([sys.executable, '-m', 'venv', '--without-pip', str(venv)], check=True)
    bin_dir = tmp_path / 'bin'
    bin_dir.mkdir()
    (bin_dir / 'df').write_text(FAKE_DF)
    (bin_dir / 'df').chmod(0o755)
    env = {**os.environ, 'VITDENSE_VENV': str(venv), 'PATH': f'{bin_dir}:{os.environ["PATH"]}'}
    result = subprocess.run(['bash', str(REPO_ROOT / 'tools/install.sh')], env=env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    assert (f'installing torch {torch_version} (a CUDA build) and the OpenMMLab stack needs '
            f'about 7 GB free on the filesystem of {venv}, which has 100 MB free'
            ) in result.stderr
    assert 'VITDENSE_VENV' in result.stderr
    assert not list(venv.glob('lib/python*/site-packages/torch'))


def test_help_prints_the_whole_header_and_nothing_else():
    result = subprocess.run(['bash', str(REPO_ROOT / 'tools/install.sh'), '--help'],
                            capture_output=True, text=True, check=True, timeout=30)
    lines = result.stdout.splitlines()
    assert lines[0].startswith('Install vitdense and the OpenMMLab stack')
    assert any(line.startswith('Disk: a fresh install takes') for line in lines)
    assert lines[-1].startswith('MAX_JOBS')
    assert not any(line.startswith(('#', 'set ')) for line in lines)
