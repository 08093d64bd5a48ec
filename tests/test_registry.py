"""The ``vitdense`` scope: our modules build from mmdet, mmseg and mmpretrain registries."""
from __future__ import annotations

import pytest
from mmdet.registry import MODELS as MMDET_MODELS
from mmengine.registry import MODELS as ROOT_MODELS
from mmpretrain.registry import MODELS as MMPRETRAIN_MODELS
from mmseg.registry import MODELS as MMSEG_MODELS
from torch import nn

from vitdense.registry import MODELS

HOSTS = {'mmdet': MMDET_MODELS, 'mmseg': MMSEG_MODELS, 'mmpretrain': MMPRETRAIN_MODELS}


@pytest.fixture
def dummies():
    """Test-only modules in the vitdense scope, one named like mmpretrain's own ViT."""

    class Dummy(nn.Module):
        def __init__(self, width: int = 3) -> None:
            super().__init__()
            self.width = width

    class VisionTransformer(nn.Module):
        pass

    MODELS.register_module(name='Dummy', module=Dummy)
    MODELS.register_module(name='VisionTransformer', module=VisionTransformer)
    yield Dummy, VisionTransformer
    for name in ('Dummy', 'VisionTransformer'):
        MODELS._module_dict.pop(name)


def test_scope_is_a_child_of_the_root_registry():
    assert MODELS.scope == 'vitdense'
    assert MODELS.parent is ROOT_MODELS
    assert ROOT_MODELS.children['vitdense'] is MODELS


@pytest.mark.parametrize('host', sorted(HOSTS))
def test_dummy_builds_from_host_registry(host, dummies):
    dummy_cls, _ = dummies
    module = HOSTS[host].build(dict(type='vitdense.Dummy', width=7))
    assert type(module) is dummy_cls and module.width == 7


def test_names_do_not_clash_with_mmpretrain(dummies):
    _, ours = dummies
    theirs = MMPRETRAIN_MODELS.get('VisionTransformer')
    assert theirs.__module__.startswith('mmpretrain.')
    assert MMPRETRAIN_MODELS.get('vitdense.VisionTransformer') is ours
    assert MMPRETRAIN_MODELS.get('mmpretrain.VisionTransformer') is theirs


def test_unknown_vitdense_name_is_not_found():
    with pytest.raises(KeyError, match='vitdense.NoSuchModule'):
        MMDET_MODELS.build(dict(type='vitdense.NoSuchModule'))
