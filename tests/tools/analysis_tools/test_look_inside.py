"""tools/analysis_tools/look_inside.py on tiny backbones: every analysis writes its PNG, and
its JSON holds the numbers the library computes for the same model and image."""
import json

import numpy as np
import pytest
import torch
from PIL import Image

from tools.analysis_tools import look_inside

from vitdense.analysis import (attention_rollout, build_backbone, image_to_tensor,
                               mean_attention_distance, position_encodings, position_similarity,
                               record_attention)

from common import TINY_ARCH, TINY_BACKBONES, TINY_CONVIT_ARCH

# ConViT with two gated blocks: the gate test reads the second one's gates
BACKBONES = dict(TINY_BACKBONES, convit=dict(type='vitdense.ConViT', arch=TINY_CONVIT_ARCH))


@pytest.fixture
def workspace(tmp_path, image_folder):
    """A checkpoint and config per family, at 32 pixels, beside ``image_folder``."""
    for family, backbone in BACKBONES.items():
        torch.manual_seed(0)
        (tmp_path / f'{family}.py').write_text(
            f'model = dict(backbone={dict(backbone, img_size=32)!r})\n')
        model = build_backbone(config=str(tmp_path / f'{family}.py'))
        torch.save(dict(state_dict={f'backbone.{k}': v for k, v in model.state_dict().items()}),
                   tmp_path / f'{family}.pth')
    return tmp_path


def run(workspace, analysis, family, *extra):
    out = workspace / 'out'
    result = look_inside.main([analysis, '--config', str(workspace / f'{family}.py'),
                               '--checkpoint', str(workspace / f'{family}.pth'),
                               '--out-dir', str(out), *extra])
    assert json.loads((out / f'{analysis}.json').read_text())['analysis'] == analysis
    return result, out


def _input(workspace, family, name):
    model = build_backbone(config=str(workspace / f'{family}.py'),
                           checkpoint=str(workspace / f'{family}.pth'))
    image = np.asarray(Image.open(workspace / 'images' / f'{name}.jpg').convert('RGB'))
    return model, image_to_tensor(image, (32, 32))


def test_class_attention_maps_of_every_image(workspace):
    result, out = run(workspace, 'class-attention', 'cait', '--image',
                      str(workspace / 'images'))
    assert sorted(p.name for p in out.glob('*.png')) == ['class-attention_one.png',
                                                         'class-attention_two.png']
    model, x = _input(workspace, 'cait', 'two')
    weights = record_attention(model, x).class_attention[0][0]
    maps = np.array(result['images']['two']['maps'])
    heads = TINY_ARCH['num_heads']
    assert maps.shape == (heads, 2, 2)
    np.testing.assert_allclose(maps.reshape(heads, -1), weights[:, 1:].numpy(), atol=1e-5)
    np.testing.assert_allclose(maps.sum((1, 2)) + result['images']['two'][
        'class_token_self_weight'], 1, atol=1e-4)


def test_attention_distance_is_averaged_over_the_images(workspace):
    result, out = run(workspace, 'attention-distance', 'vit', '--image',
                      str(workspace / 'images'))
    assert (out / 'attention-distance.png').is_file()
    expected = 0
    for name in ('one', 'two'):
        model, x = _input(workspace, 'vit', name)
        expected = expected + mean_attention_distance(record_attention(model, x).trunk[3],
                                                      (2, 2), patch_size=16) / 2
    np.testing.assert_allclose(result['per_block'][3], expected.numpy(), atol=1e-3)


def test_convit_gates_and_nonlocality(workspace):
    result, out = run(workspace, 'convit', 'convit', '--image',
                      str(workspace / 'images' / 'one.jpg'))
    model, _ = _input(workspace, 'convit', 'one')
    np.testing.assert_allclose(result['gates'][1], torch.sigmoid(
        model.blocks[1].attn.gating).detach().numpy(), atol=1e-5)
    assert sorted(result['nonlocality_patches']) == [0, 1, 2, 3]
    assert (out / 'convit.png').is_file()


@pytest.mark.parametrize('analysis,family', [
    ('attention', 'convit'), ('rollout', 'vit'), ('rollout', 'xcit'),
    ('position-similarity', 'xcit'), ('patch-filters', 'vit'), ('features', 'xcit')])
def test_other_analyses_write_a_picture(workspace, analysis, family):
    result, out = run(workspace, analysis, family, '--image',
                      str(workspace / 'images' / 'one.jpg'))
    assert list(out.glob(f'{analysis}*.png'))
    if analysis == 'features':
        assert [s[1:] for s in result['images']['one']['shapes']] == [[8, 8], [4, 4], [2, 2],
                                                                    [1, 1]]
    if analysis == 'rollout' and family == 'xcit':  # class attention over the patches
        np.testing.assert_allclose(np.sum(result['images']['one']['map']), 1, atol=1e-4)


def test_rollout_is_the_class_token_row(workspace):
    result, _ = run(workspace, 'rollout', 'vit', '--image', str(workspace / 'images' / 'one.jpg'))
    model, x = _input(workspace, 'vit', 'one')
    trunk = record_attention(model, x).trunk
    expected = attention_rollout([trunk[i] for i in range(4)])[0, 0, 1:]
    np.testing.assert_allclose(np.ravel(result['images']['one']['map']), expected, atol=1e-5)


@pytest.mark.parametrize('analysis,family,message', [
    ('class-attention', 'vit', 'no class-attention stage'),
    ('attention', 'xcit', 'attends over channels'),
    ('convit', 'vit', 'no gated positional self-attention'),
])
def test_analyses_a_family_lacks_are_refused(workspace, analysis, family, message):
    with pytest.raises((SystemExit, TypeError), match=message):
        run(workspace, analysis, family, '--image', str(workspace / 'images' / 'one.jpg'))


def test_position_similarity_at_another_size(workspace):
    result, _ = run(workspace, 'position-similarity', 'vit', '--img-size', '48')
    model, _ = _input(workspace, 'vit', 'one')
    vectors, hw = position_encodings(model, (3, 3))
    assert tuple(result['grid']) == (3, 3)
    np.testing.assert_allclose(result['similarity'], position_similarity(vectors, hw),
                               atol=1e-4)
