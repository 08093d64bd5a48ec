"""vitdense/engine/hosts.py: the host tools' table is a look-up; registering the host library
is :func:`vitdense.model_factory.register_host`, an explicit call, idempotent."""
import subprocess
import sys

import pytest
from mmengine.config import Config

from vitdense.engine.hosts import HOSTS, host_of

from common import REPO_ROOT

LOOK_UP_THEN_REGISTER = """
import sys
from mmengine.config import Config
from vitdense.engine.hosts import HOSTS, host_of
from vitdense.model_factory import register_host

cfg = Config(dict(default_scope='mmseg'))
assert host_of(cfg) is HOSTS['mmseg']
assert 'mmseg' not in sys.modules, 'the look-up imported the host library'
register_host(cfg)
from mmseg.registry import MODELS
registered = dict(MODELS.module_dict)
assert 'EncoderDecoder' in registered
register_host(cfg)
assert dict(MODELS.module_dict) == registered
"""


def test_the_look_up_imports_nothing_and_registering_twice_is_registering_once():
    result = subprocess.run([sys.executable, '-c', LOOK_UP_THEN_REGISTER], cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr


def test_a_config_of_another_library_is_refused_naming_the_hosts():
    with pytest.raises(ValueError, match=r"default_scope='mmocr'.*\['mmdet', 'mmpretrain', "
                                         r"'mmseg'\]"):
        host_of(Config(dict(default_scope='mmocr')))
    assert set(HOSTS) == {'mmdet', 'mmpretrain', 'mmseg'}
