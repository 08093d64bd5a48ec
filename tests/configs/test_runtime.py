"""Every shipped config saves and loads its checkpoints through vitdense.SafeCheckpointHook
(atomic saves, weights_only=True loads) and seeds each process differently (seed + rank, as
the official DeiT / CaiT / XCiT training code), set once in the runtime pieces it inherits."""
import pytest
from mmengine.config import Config

from common import CONFIGS

LEAF_CONFIGS = sorted(p for p in CONFIGS.glob('*/*.py') if p.parent.name != '_base_')


@pytest.mark.parametrize('config', LEAF_CONFIGS, ids=lambda p: p.name)
def test_config_names_the_safe_checkpoint_hook_and_per_rank_seeds(config):
    cfg = Config.fromfile(str(config), import_custom_modules=False)
    assert cfg.default_hooks.checkpoint.type == 'vitdense.SafeCheckpointHook'
    assert cfg.randomness.diff_rank_seed is True
    # mmengine's Runner calls set_randomness(**randomness): a seed key must be there
    assert 'seed' in cfg.randomness
