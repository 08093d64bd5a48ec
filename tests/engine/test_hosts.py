"""vitdense/engine/hosts.py: the host tools' table is a look-up; registering the host library
is :func:`vitdense.model_factory.register_host`, an explicit call, idempotent."""
from unittest import mock

import pytest
from mmengine.config import Config

from vitdense import model_factory
from vitdense.engine.hosts import HOSTS, host_of


def test_the_look_up_imports_and_registers_nothing():
    cfg = Config(dict(default_scope='mmseg'))
    refuse = dict(side_effect=AssertionError('the look-up registered the host'))
    with mock.patch('importlib.import_module', **refuse), \
            mock.patch.object(model_factory, 'use_safe_loading', **refuse), \
            mock.patch.object(model_factory, 'apply_host_fixes', **refuse):
        assert host_of(cfg) is HOSTS['mmseg']


def test_registering_twice_is_registering_once():
    cfg = Config(dict(default_scope='mmseg'))
    model_factory.register_host(cfg)
    from mmseg.registry import MODELS
    registered = dict(MODELS.module_dict)
    model_factory.register_host(cfg)
    assert 'EncoderDecoder' in registered and dict(MODELS.module_dict) == registered


def test_a_config_of_another_library_is_refused_naming_the_hosts():
    with pytest.raises(ValueError, match=r"default_scope='mmocr'.*\['mmdet', 'mmpretrain', "
                                         r"'mmseg'\]"):
        host_of(Config(dict(default_scope='mmocr')))
    with pytest.raises(ValueError, match=r"default_scope='mmocr'"):
        model_factory.register_host(Config(dict(default_scope='mmocr')))
    assert set(HOSTS) == set(model_factory.HOST_SCOPES)
