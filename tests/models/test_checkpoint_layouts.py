"""The checkpoint layouts users hold, each built by its source library from perturbed random
weights, saved, loaded through ``init_cfg=dict(type='Pretrained', ...)`` and compared in
float32 with the source library's own forward: max relative difference <= 1e-5 on the
class token and the dense maps."""
import re

import pytest
import torch
from mmengine.logging import MessageHub
from timm.models.vision_transformer import VisionTransformer

from vitdense.models import ViT, XCiT

from common import TINY_ARCH, assert_features_match, max_relative_diff, perturb_

FLOOR = 1e-5


def _pretrained(path, prefix=None, **kwargs):
    model = ViT(TINY_ARCH, init_cfg=dict(type='Pretrained', checkpoint=str(path),
                                         prefix=prefix), **kwargs)
    model.init_weights()
    return model.eval()


def _openmmlab_checkpoint(path, state_dict: dict) -> None:
    """A whole OpenMMLab checkpoint as mmengine's runner writes it: ``meta``, the model's
    ``state_dict``, the message hub."""
    hub = MessageHub.get_instance('checkpoint_layouts')
    hub.update_scalar('train/loss', 0.5)
    torch.save(dict(meta=dict(epoch=3, iter=300, mmengine_version='0.10', seed=0,
                              dataset_meta=dict(classes=('a', 'b'))),
                    state_dict=state_dict, message_hub=hub.state_dict()), path)


@pytest.mark.parametrize('layout', ['deit3', 'dinov2_reg4'])
def test_timm_tables_without_class_row_and_registers(tmp_path, layout):
    """DeiT III (``no_embed_class``, LayerScale) and DINOv2 with registers (also patch 14,
    ``reg_tokens=4``): refused by a default ViT with the options that load them, then
    exact."""
    options = dict(patch_size=16, img_size=64) if layout == 'deit3' else \
        dict(patch_size=14, img_size=56, reg_tokens=4)
    torch.manual_seed(0)
    reference = perturb_(VisionTransformer(embed_dim=32, depth=4, num_heads=2, num_classes=10,
                                           no_embed_class=True, init_values=1e-5, **options))
    path = tmp_path / f'{layout}.pth'
    torch.save(reference.state_dict(), path)
    ours_options = dict(patch_size=options['patch_size'], img_size=options['img_size'],
                        reg_tokens=options.get('reg_tokens', 0))
    expected = 'reg_tokens=4; no_embed_class=True' if layout != 'deit3' else \
        'no_embed_class=True'
    with pytest.raises(ValueError, match=rf'layer_scale=1e-5(.|\n)*; {expected}'):
        _pretrained(path, patch_size=options['patch_size'], img_size=options['img_size'],
                    pyramid=False)
    ours = dict(no_embed_class=True, layer_scale=1., **ours_options)
    images = torch.randn(2, 3, options['img_size'], options['img_size'])
    with torch.no_grad():
        classifier = _pretrained(path, out_type='cls_token', **ours)
        assert_features_match(classifier(images), [reference.forward_head(
            reference.forward_features(images), pre_logits=True)])
        dense = _pretrained(path, pyramid=False, out_indices=(0, 1, 2, 3), **ours)
        assert_features_match(dense(images), reference.forward_intermediates(
            images, indices=[0, 1, 2, 3], norm=False, intermediates_only=True))


@pytest.mark.parametrize('source', ['VisionTransformer', 'DeiT3'])
def test_mmpretrain_classifier_checkpoints(tmp_path, source):
    """mmpretrain's ViT (DeiT's recipes: ``deit-small``, ``b``) and DeiT III as whole
    ImageClassifier checkpoints read through ``prefix='backbone.'``. mmpretrain normalises
    the last block's map with its final norm, so the dense maps compared are the others'."""
    from mmpretrain.models import ImageClassifier
    torch.manual_seed(0)
    backbone = dict(type=source, arch=dict(embed_dims=32, num_layers=4, num_heads=2,
                                           feedforward_channels=128),
                    img_size=64, patch_size=16, out_indices=(0, 1, 2, 3))
    classifier = perturb_(ImageClassifier(backbone=backbone, head=dict(
        type='VisionTransformerClsHead', num_classes=10, in_channels=32)))
    if source == 'DeiT3':
        # mmpretrain 1.2's DeiT3 layer normalises its FFN input with ln1 too (ln2 is saved
        # and unused; the official DeiT III and ours use it): tie them for the comparison
        for layer in classifier.backbone.layers:
            layer.ln2.load_state_dict(layer.ln1.state_dict())
    path = tmp_path / 'mmpretrain.pth'
    _openmmlab_checkpoint(path, classifier.state_dict())
    deit3 = dict(no_embed_class=True, layer_scale=1.) if source == 'DeiT3' else {}
    images = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        classifier.backbone.out_type = 'cls_token'
        ours = _pretrained(path, 'backbone.', img_size=64, out_type='cls_token', **deit3)
        assert_features_match(ours(images), classifier.backbone(images)[-1:])
        classifier.backbone.out_type = 'featmap'
        ours = _pretrained(path, 'backbone.', img_size=64, pyramid=False,
                           out_indices=(0, 1, 2), **deit3)
        assert_features_match(ours(images), classifier.backbone(images)[:3])


def test_mmseg_encoder_decoder_checkpoint_needs_its_layer_norm_eps(tmp_path):
    """mmseg's ViT (torch's MultiheadAttention, no patch bias) in a whole EncoderDecoder
    checkpoint: its LayerNorm eps is its config's (1e-6 in mmseg's UperNet, SETR and
    Segmenter configs, its class default 1e-5 in DPT's), which no tensor shows: a model
    built without ``norm_eps`` is refused, naming it; with the file's 1e-5, exact at the
    file's size and a non-square one. The wrong eps is more than the floor off."""
    from mmseg.models.backbones import VisionTransformer as MMSegViT
    torch.manual_seed(0)
    reference = perturb_(MMSegViT(img_size=64, embed_dims=32, num_layers=4, num_heads=2,
                                  out_indices=(0, 1, 2, 3), final_norm=False))
    with torch.no_grad():  # small embeddings, whose variance the eps is not negligible to
        for tensor in (reference.patch_embed.projection.weight, reference.pos_embed,
                       reference.cls_token):
            tensor.mul_(1e-3)
    state_dict = {f'backbone.{k}': v for k, v in reference.state_dict().items()}
    state_dict['decode_head.conv_seg.weight'] = torch.randn(10, 32, 1, 1)
    path = tmp_path / 'upernet_vit.pth'
    _openmmlab_checkpoint(path, state_dict)
    dense = dict(img_size=64, pyramid=False, out_indices=(0, 1, 2, 3))
    with pytest.raises(ValueError, match=r'to load it: norm_eps=1e-06 or norm_eps=1e-05'):
        _pretrained(path, 'backbone.', **dense)
    ours = _pretrained(path, 'backbone.', norm_eps=1e-5, **dense)
    other_eps = _pretrained(path, 'backbone.', norm_eps=1e-6, **dense)
    with torch.no_grad():
        for image_hw in ((64, 64), (48, 80)):
            images = torch.randn(2, 3, *image_hw)
            expected = reference(images)
            assert_features_match(ours(images), expected)
            off = max_relative_diff(other_eps(images)[0], expected[0])
            print(f'norm_eps=1e-6 at {image_hw}: {off:.1e}')
            assert off > 100 * FLOOR


def test_mmpretrain_xcit_classifier_checkpoint(tmp_path):
    """mmpretrain's XCiT ImageClassifier (ConvModules in the stem and LPI, separate q, k, v
    in class attention; BN statistics and temperatures perturbed)."""
    from mmpretrain.models import ImageClassifier
    from mmpretrain.models.backbones import XCiT as MMPretrainXCiT
    torch.manual_seed(0)
    arch = dict(embed_dims=32, depth=4, num_heads=2, img_size=64, patch_size=16,
                layer_scale_init_value=1e-5, tokens_norm=True)
    classifier = perturb_(ImageClassifier(backbone=dict(type='XCiT', **arch), head=dict(
        type='LinearClsHead', num_classes=10, in_channels=32)))
    dense_reference = MMPretrainXCiT(out_type='featmap', out_indices=(0, 1, 2), **arch)
    dense_reference.load_state_dict(classifier.backbone.state_dict())
    dense_reference.eval()
    path = tmp_path / 'mmpretrain_xcit.pth'
    _openmmlab_checkpoint(path, classifier.state_dict())
    images = torch.randn(2, 3, 64, 64)
    # tokens_norm: the config's (no tensor shows it; the size is no released XCiT's)
    options = dict(init_cfg=dict(type='Pretrained', checkpoint=str(path), prefix='backbone.'),
                   tokens_norm=True)
    with torch.no_grad():
        ours = XCiT(TINY_ARCH, out_type='cls_token', **options)
        ours.init_weights()
        assert_features_match(ours.eval()(images), classifier.backbone(images))
        ours = XCiT(TINY_ARCH, pyramid=False, out_indices=(0, 1, 2), **options)
        ours.init_weights()
        assert_features_match(ours.eval()(images), dense_reference(images))


def test_mmpretrain_vit_trained_at_384_needs_its_size_then_computes_as_mmpretrain(tmp_path):
    """mmpretrain resamples position tables with plain bicubic in forward: a checkpoint
    trained at 384 into a model of 224 would be resampled down, otherwise than mmpretrain's
    own 384 model computes at every size: refused, naming ``img_size=384``; built so, read
    at 224, 288 and 384 it equals mmpretrain's forward; the antialiased kernel, asked for,
    is more than the floor off."""
    from mmpretrain.models import ImageClassifier
    arch = dict(embed_dims=32, num_layers=4, num_heads=2, feedforward_channels=128)
    torch.manual_seed(0)
    reference = perturb_(ImageClassifier(
        backbone=dict(type='VisionTransformer', arch=arch, img_size=384,
                      out_type='cls_token', out_indices=(3,)),
        head=dict(type='VisionTransformerClsHead', num_classes=10, in_channels=32))).eval()
    path = tmp_path / 'vit_384.pth'
    _openmmlab_checkpoint(path, reference.state_dict())
    with pytest.raises(ValueError, match=r'to load it: img_size=384 \(the file.s position '
                                         r'table is a 24 x 24 grid'):
        _pretrained(path, 'backbone.', img_size=224, out_type='cls_token')
    ours = _pretrained(path, 'backbone.', img_size=384, out_type='cls_token')
    assert not ours.pos_antialias
    antialiased = _pretrained(path, 'backbone.', img_size=384, out_type='cls_token',
                              pos_antialias=True)
    with torch.no_grad():
        for size in (224, 288, 384):
            images = torch.randn(2, 3, size, size)
            expected = reference.backbone(images)
            assert_features_match(ours(images), expected)
            if size != 384:
                off = max_relative_diff(antialiased(images)[0], expected[0])
                print(f'antialiased kernel at {size}: {off:.1e}')
                assert off > 5 * FLOOR


def test_mmseg_file_trained_at_512_computes_as_mmseg_at_every_size(tmp_path):
    """An mmseg ViT fine-tuned at 512 (a 32 x 32 table, in a whole EncoderDecoder file):
    mmseg's forward resamples the table from its grid to each input's (plain bicubic,
    ``align_corners=False``). Into the default ``img_size`` the table would be resampled down
    first: refused, naming ``img_size=512``; built so, the dense maps equal mmseg's at 512,
    224 and 384 x 640. (mmseg resamples only where the token count differs from the
    table's: a grid of another shape with 32 x 32 tokens it reads unresampled.)"""
    from mmseg.models.backbones import VisionTransformer as MMSegViT
    torch.manual_seed(0)
    reference = perturb_(MMSegViT(img_size=512, embed_dims=32, num_layers=4, num_heads=2,
                                  out_indices=(0, 1, 2, 3), final_norm=False))
    reference.eval()
    path = tmp_path / 'upernet_vit_512.pth'
    _openmmlab_checkpoint(path, {f'backbone.{k}': v for k, v in reference.state_dict().items()})
    dense = dict(pyramid=False, out_indices=(0, 1, 2, 3), norm_eps=1e-5)
    with pytest.raises(ValueError, match=r'to load it: img_size=512 \(the file.s position '
                                         r'table is a 32 x 32 grid, finer than this model.s '
                                         r'14 x 14'):
        _pretrained(path, 'backbone.', **dense)
    ours = _pretrained(path, 'backbone.', img_size=512, **dense)
    with torch.no_grad():
        for image_hw in ((512, 512), (224, 224), (384, 640)):
            images = torch.randn(1, 3, *image_hw)
            assert_features_match(ours(images), reference(images))


def test_mmseg_table_of_14x14_at_512_with_mmsegs_kernel(tmp_path):
    """mmseg's ViT pretrained at 224 (a 14 x 14 table) fine-tuned at 512: mmseg resamples
    the table with plain bicubic when it loads it; ours, built without ``pos_antialias``,
    takes that kernel from the checkpoint's layout: the dense maps equal mmseg's."""
    from mmseg.models.backbones import VisionTransformer as MMSegViT
    options = dict(embed_dims=32, num_layers=4, num_heads=2, out_indices=(0, 1, 2, 3),
                   final_norm=False)
    torch.manual_seed(0)
    path = tmp_path / 'vit_224.pth'
    torch.save(perturb_(MMSegViT(img_size=224, **options)).state_dict(), path)
    reference = MMSegViT(img_size=512, init_cfg=dict(type='Pretrained', checkpoint=str(path)),
                         **options)
    reference.init_weights()
    reference.eval()
    ours = _pretrained(path, img_size=512, pyramid=False, out_indices=(0, 1, 2, 3),
                       norm_eps=1e-5)
    antialiased = _pretrained(path, img_size=512, pyramid=False, out_indices=(0, 1, 2, 3),
                              norm_eps=1e-5, pos_antialias=True)
    images = torch.randn(1, 3, 512, 512)
    with torch.no_grad():
        expected = reference(images)
        assert_features_match(ours(images), expected)
        off = max(max_relative_diff(*pair) for pair in zip(antialiased(images), expected))
        print(f'antialiased kernel: {off:.1e}')
        assert off > 10 * FLOOR


def test_timm_train_checkpoint_gives_its_ema_weights_as_timm_reads_them(tmp_path):
    """A checkpoint written by timm's own ``CheckpointSaver`` (train.py: ``args`` as an
    ``argparse.Namespace``, the optimizer, ``state_dict`` and ``state_dict_ema``): the EMA
    weights load, as ``timm.models.load_checkpoint`` reads them, not the raw ones."""
    import argparse

    from timm.models import load_checkpoint
    from timm.utils import CheckpointSaver, ModelEmaV3
    torch.manual_seed(0)
    options = dict(img_size=64, patch_size=16, embed_dim=32, depth=4, num_heads=2,
                   num_classes=10)
    trained = perturb_(VisionTransformer(**options), seed=1)
    ema = ModelEmaV3(perturb_(VisionTransformer(**options), seed=2))
    saver = CheckpointSaver(trained, torch.optim.SGD(trained.parameters(), lr=.1),
                            args=argparse.Namespace(model='vit_tiny_patch16_224', lr=.1),
                            model_ema=ema, checkpoint_dir=str(tmp_path),
                            recovery_dir=str(tmp_path))
    saver.save_checkpoint(0, metric=1.)
    path = tmp_path / 'checkpoint-0.pth.tar'
    reference = VisionTransformer(**options).eval()
    load_checkpoint(reference, str(path))
    ours = _pretrained(path, img_size=64, out_type='cls_token')
    images = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        expected = reference.forward_head(reference.forward_features(images), pre_logits=True)
        assert_features_match(ours(images), [expected])
        raw = trained.forward_head(trained.forward_features(images), pre_logits=True)
        assert max_relative_diff(raw, expected) > 100 * FLOOR


def test_timm_registers_without_class_token_keep_their_registers(tmp_path):
    """timm's ``*_reg4_gap`` ViTs (registers, no class token, average pooling): a dense
    trunk without class token (``dense_class_token=False``) would drop the registers, which
    every block attends to; the load is refused naming ``class_token=False``, which keeps
    them and equals timm's maps at the file's size and a non-square one."""
    torch.manual_seed(0)
    reference = perturb_(VisionTransformer(
        img_size=64, patch_size=16, embed_dim=32, depth=4, num_heads=2, num_classes=10,
        class_token=False, no_embed_class=True, global_pool='avg', reg_tokens=4,
        dynamic_img_size=True)).eval()
    path = tmp_path / 'reg4_gap.pth'
    torch.save(reference.state_dict(), path)
    dense = dict(img_size=64, pyramid=False, out_indices=(0, 1, 2, 3))
    for registers in ({}, dict(reg_tokens=4, no_embed_class=True)):
        with pytest.raises(ValueError, match=r'to load it: .*class_token=False'):
            _pretrained(path, dense_class_token=False, **registers, **dense)
    ours = _pretrained(path, class_token=False, reg_tokens=4, no_embed_class=True, **dense)
    with torch.no_grad():
        for image_hw in ((64, 64), (48, 80)):
            images = torch.randn(2, 3, *image_hw)
            assert_features_match(ours(images), reference.forward_intermediates(
                images, indices=[0, 1, 2, 3], norm=False, intermediates_only=True))


@pytest.mark.parametrize('trained_hw', [(320, 800), (256, 64)])
def test_our_non_square_table_keeps_its_grid(tmp_path, trained_hw):
    """Our checkpoint of a table trained at a non-square size saves its grid
    (``pos_embed.table_grid``): its rows alone show none (16 x 4 has the rows of 8 x 8).
    Into a model of a coarser grid it is refused, naming the file's ``img_size``; into one
    of twice the size it is resampled from its own grid, as timm resamples it."""
    from timm.layers import resample_abs_pos_embed
    torch.manual_seed(0)
    trained = ViT(TINY_ARCH, img_size=trained_hw, out_type='cls_token')
    path = tmp_path / 'ours.pth'
    torch.save(trained.state_dict(), path)
    grid = tuple(side // 16 for side in trained_hw)
    assert trained.state_dict()['pos_embed.table_grid'].tolist() == list(grid)
    with pytest.raises(ValueError, match=rf'to load it: {re.escape(f"img_size={trained_hw}")}'):
        _pretrained(path, img_size=128, out_type='cls_token')
    larger = tuple(2 * side for side in trained_hw)
    ours = _pretrained(path, img_size=larger, out_type='cls_token')
    expected = resample_abs_pos_embed(trained.pos_embed.weight.detach(),
                                      [2 * side for side in grid], grid, num_prefix_tokens=1)
    assert max_relative_diff(ours.pos_embed.weight.detach(), expected) <= FLOOR
    same = _pretrained(path, img_size=trained_hw, out_type='cls_token')
    images = torch.randn(1, 3, 160, 96)
    with torch.no_grad():
        assert torch.equal(same(images)[0], trained.eval()(images)[0])
