"""tools/model_converters/merge_peft.py on the path a user takes: the LoRA demo recipe loads
its trunk from the demo UperNet's checkpoint, trains (trunk frozen) and checkpoints what
trains (vitdense.PeftCheckpointHook), and the merge tool writes a plain checkpoint that the demo config without ``peft`` loads strictly and that computes
what the adapted model does; an existing OUT is kept, a config without peft refused."""
from __future__ import annotations

import subprocess
import sys

import torch
from mmengine.runner import Runner

from vitdense.checkpoint_io import safe_load
from vitdense.demo_data import make_demo_ade
from vitdense.engine.hooks.peft_checkpoint import fill_frozen_base
from vitdense.model_factory import build_model
from vitdense.engine.tool_config import point_at_data_root

from common import CHECKOUT_ENV, REPO_ROOT, load_tool_config, max_relative_diff, perturb_

MERGE = REPO_ROOT / 'tools/model_converters/merge_peft.py'
DEMO = 'configs/vit/upernet_vit-d6-p8_demo-ade.py'
LORA_DEMO = 'configs/vit/upernet_vit-d6-p8_lora_demo-ade.py'


def _demo_checkpoint(path) -> dict:
    """A trained demo UperNet's checkpoint, as the Runner writes it (its weights drawn)."""
    model = perturb_(build_model(load_tool_config(str(REPO_ROOT / DEMO), None, 'none', None),
                                 'count'))
    state_dict = {key: value.clone() for key, value in model.state_dict().items()}
    torch.save(dict(state_dict=state_dict, meta=dict(iter=700)), path)
    return state_dict


def test_lora_run_merges_into_a_checkpoint_of_the_plain_config(tmp_path, run_command):
    pretrained = _demo_checkpoint(tmp_path / 'demo.pth')
    data_root = make_demo_ade(tmp_path / 'data', num_train=2, num_val=1, size=64)
    cfg = load_tool_config(str(REPO_ROOT / LORA_DEMO),
                           {'model.backbone.init_cfg.checkpoint': str(tmp_path / 'demo.pth')},
                           'none', str(tmp_path / 'work'))
    point_at_data_root(cfg, data_root)
    cfg.model.data_preprocessor.size = (64, 64)
    cfg.train_dataloader.update(batch_size=2, num_workers=0, persistent_workers=False)
    cfg.train_cfg.update(max_iters=2, val_interval=100)
    cfg.val_cfg = cfg.val_dataloader = cfg.val_evaluator = None
    cfg.test_cfg = cfg.test_dataloader = cfg.test_evaluator = None
    cfg.default_hooks.checkpoint.interval = 2
    cfg.default_hooks.pop('visualization')
    cfg.randomness = dict(seed=0)
    Runner.from_cfg(cfg).train()
    saved = safe_load(tmp_path / 'work' / 'iter_2.pth')
    # the checkpoint holds what trains (adapters, pyramid, heads) and names its base
    assert saved['meta']['peft_bases']['backbone.']['path'] == str(tmp_path / 'demo.pth')
    assert not any(key.startswith('backbone.') and '.lora_' not in key and
                   not key.startswith('backbone.pyramid.') for key in saved['state_dict'])
    assert any(value.abs().sum() > 0 for key, value in saved['state_dict'].items()
               if '.lora_B.' in key)

    out = tmp_path / 'merged.pth'
    result = subprocess.run([sys.executable, str(MERGE), str(REPO_ROOT / LORA_DEMO),
                             str(tmp_path / 'work' / 'iter_2.pth'), str(out)],
                            capture_output=True, text=True, env=CHECKOUT_ENV)
    assert result.returncode == 0, result.stderr[-2000:]
    assert 'merged 24 adapted layers' in result.stdout
    assert torch.serialization.get_unsafe_globals_in_checkpoint(out) == []

    plain = build_model(load_tool_config(str(REPO_ROOT / DEMO), None, 'none', None), 'deploy',
                        checkpoint=str(out))  # a strict load
    adapted = build_model(cfg, 'count')
    fill_frozen_base(adapted, saved)  # the trunk: the demo checkpoint's
    for key, value in saved['state_dict'].items():
        if key.startswith('backbone.') and key.replace('.base_layer.', '.') in pretrained \
                and not key.startswith('backbone.pyramid.'):
            assert torch.equal(value, pretrained[key.replace('.base_layer.', '.')]), key
    adapted.load_state_dict(saved['state_dict'], strict=True)
    adapted.eval()
    image = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        for ours, reference in zip(plain.extract_feat(image), adapted.extract_feat(image)):
            assert max_relative_diff(ours, reference) <= 1e-5
    assert torch.load(out)['meta']['peft_merged_from'] == str(tmp_path / 'work' / 'iter_2.pth')

    written = out.read_bytes()
    again = run_command(MERGE, str(REPO_ROOT / LORA_DEMO), str(tmp_path / 'work' / 'iter_2.pth'),
                        str(out))
    assert again.returncode != 0 and f'{out} exists; it is kept' in again.stderr
    assert out.read_bytes() == written
    plain_config = run_command(MERGE, str(REPO_ROOT / DEMO), str(out), str(tmp_path / 'x.pth'))
    assert plain_config.returncode != 0 and 'no backbone with a peft option' in \
        plain_config.stderr
    assert sorted(p.name for p in tmp_path.iterdir() if p.suffix == '.pth') == [
        'demo.pth', 'merged.pth']
