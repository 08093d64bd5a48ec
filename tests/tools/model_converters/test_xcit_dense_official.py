"""tools/model_converters/xcit_dense_official.py on checkpoints synthesised in the official
layout: our model's weights renamed to the names of the official XCiT dense code
(facebookresearch/xcit ``detection/backbone/xcit.py``), converted back, loaded strictly."""
import re
import subprocess
import sys

import pytest
import torch
from mmengine.config import Config

from vitdense.model_factory import build_model

from common import CHECKOUT_ENV, REPO_ROOT

CONVERTER = REPO_ROOT / 'tools' / 'model_converters' / 'xcit_dense_official.py'

# our name -> official name; the official backbone keeps the pyramid at backbone.fpn1..4,
# calls LayerScale gamma1/2/3, the LPI branch local_mp with norm3, the encoding pos_embeder
TO_OFFICIAL = (
    (r'^backbone\.pyramid\.(fpn[1-4])\.', r'backbone.\1.'),
    (r'^backbone\.pos_embed\.', 'backbone.pos_embeder.'),
    (r'\.ls1\.gamma$', '.gamma1'),
    (r'\.ls2\.gamma$', '.gamma2'),
    (r'\.ls_lpi\.gamma$', '.gamma3'),
    (r'\.norm_lpi\.', '.norm3.'),
    (r'\.lpi\.', '.local_mp.'),
)


def _official(state_dict: dict) -> dict:
    renamed = {}
    for key, value in state_dict.items():
        for pattern, replacement in TO_OFFICIAL:
            key = re.sub(pattern, replacement, key)
        renamed[key] = value
    return renamed


def _build(config: str, seed: int):
    torch.manual_seed(seed)
    model = build_model(Config.fromfile(str(REPO_ROOT / config)), 'count')
    model.init_weights()
    return model.eval()


DENSE_CONFIGS = ['configs/xcit/mask-rcnn_xcit-t12-p16_fpn_3x_coco.py',
                 'configs/xcit/upernet_xcit-t12-p8_8xb2-160k_ade20k-512x512.py',
                 'configs/xcit/fpn_xcit-t12-p16_8xb2-80k_ade20k-512x512.py']


@pytest.mark.parametrize('config', DENSE_CONFIGS)
def test_official_dense_checkpoint_converts_to_our_model(config, tmp_path, run_command):
    reference = _build(config, seed=0)
    with torch.no_grad():  # non-trivial BN statistics, as in a trained checkpoint
        for buffer in reference.buffers():
            if buffer.is_floating_point():
                buffer.uniform_(0.5, 1.5)
    official = _official(reference.state_dict())
    assert {'backbone.blocks.0.gamma1', 'backbone.blocks.0.norm3.weight',
            'backbone.blocks.0.local_mp.conv1.weight', 'backbone.fpn1.0.weight',
            'backbone.pos_embeder.token_projection.weight',
            'backbone.patch_embed.proj.0.0.weight'} <= set(official)
    assert not any(re.search(r'pyramid|\.ls[12_]|\.lpi\.|norm_lpi', k) for k in official)
    source = tmp_path / 'official.pth'
    torch.save(dict(state_dict=official, meta=dict(config='mmdet 2.x config text')), source)

    converted = tmp_path / 'ours.pth'
    command = [str(source), str(converted), '--config', str(REPO_ROOT / config)]
    if config == DENSE_CONFIGS[0]:  # a new interpreter, as a user runs the converter, once
        result = subprocess.run([sys.executable, str(CONVERTER), *command], capture_output=True,
                                text=True, cwd=REPO_ROOT, env=CHECKOUT_ENV)
    else:
        result = run_command(CONVERTER, *command)
    assert result.returncode == 0, result.stderr
    assert f'loads strictly into the model of {REPO_ROOT / config}' in result.stdout

    model = _build(config, seed=1)
    checkpoint = torch.load(converted, map_location='cpu', weights_only=False)
    assert 'config' not in checkpoint['meta']
    model.load_state_dict(checkpoint['state_dict'], strict=True)
    image = torch.randn(1, 3, 96, 128)
    with torch.no_grad():
        for ours, theirs in zip(model.extract_feat(image), reference.extract_feat(image)):
            torch.testing.assert_close(ours, theirs)


def test_converter_rejects_a_classification_checkpoint(tmp_path, run_command):
    source = tmp_path / 'cls.pth'
    torch.save(dict(model={'blocks.0.gamma1': torch.ones(4)}), source)
    result = run_command(CONVERTER, str(source), str(tmp_path / 'o'))
    assert result.returncode != 0 and 'no backbone.* keys' in result.stderr


class _RunsCode:
    """Pickles as ``func(*args)`` on load: a checkpoint carrying a payload."""

    def __init__(self, func, *args) -> None:
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


TIMM_CONVERTER = REPO_ROOT / 'tools' / 'model_converters' / 'timm_to_vitdense.py'


@pytest.mark.parametrize('converter', ['xcit_dense_official', 'timm_to_vitdense'])
def test_converters_refuse_code_in_checkpoints(converter, tmp_path, run_command):
    marker = tmp_path / 'pwned'
    source = tmp_path / 'evil.pth'
    torch.save(dict(state_dict={'backbone.cls_token': torch.zeros(1)},
                    meta=_RunsCode(__import__('os').system, f'touch {marker}')), source)
    files = [str(source), str(tmp_path / 'out.pth')]
    result = (run_command(CONVERTER, *files) if converter == 'xcit_dense_official'
              else run_command(TIMM_CONVERTER, 'xcit', *files, '--arch', 'nano_12'))
    assert result.returncode != 0 and not marker.exists(), 'the payload ran'
    assert 'UnsafeCheckpointError' in result.stderr and str(source) in result.stderr
    assert 'weights_only` set to `False' not in result.stderr
    assert not (tmp_path / 'out.pth').exists()


def test_converter_names_a_truncated_checkpoint(tmp_path, run_command):
    source = tmp_path / 'cut.pth'
    torch.save({'state_dict': {'backbone.cls_token': torch.zeros(100)}}, source)
    source.write_bytes(source.read_bytes()[:200])
    result = run_command(CONVERTER, str(source), str(tmp_path / 'o'))
    assert result.returncode != 0
    assert f"checkpoint '{source}' is unreadable" in result.stderr and 'truncated' in result.stderr
