"""The ``peft`` backbone option (vitdense.models.backbones.peft_tuning): every family in every
dense layout trains its adapters, necks and heads and nothing else; the optimizer's lr decay
and weight decay see the adapters; plain checkpoints load into a LoRA model; merging gives
a plain model that computes the same; bad options fail naming the problem."""
import pytest
import torch
import torch._dynamo
from mmengine.registry import OPTIM_WRAPPER_CONSTRUCTORS
from torch import nn
from torch._dynamo.utils import counters

from vitdense.engine.compile import compile_model
from vitdense.models import ColumnarAdapter
from vitdense.models.backbones.peft_tuning import merge_adapters
from vitdense.models.layers import SimpleFeaturePyramid
from vitdense.registry import MODELS

from common import TINY_BACKBONES, groups_by_parameter_name, max_relative_diff, perturb_

LORA = dict(type='LoRA', r=4, alpha=8)
LAYOUTS = ('pyramid', 'vitdet', 'adapter')
#: ViTDet's window attention and relative positions on the 4×4 grid of 32 px images
WINDOWS = dict(window_size=2, window_block_indexes=(0, 2), use_rel_pos=True, rel_pos_img_size=32)


class DenseModel(nn.Module):
    """A dense backbone, a neck where the layout has one, and a 1×1 conv head per level: the
    shape of mmdet / mmseg models (``backbone`` is what the optimizer constructor reads)."""

    def __init__(self, backbone: nn.Module, neck: nn.Module, levels: int, dims: int) -> None:
        super().__init__()
        self.backbone, self.neck = backbone, neck
        self.head = nn.ModuleList(nn.Conv2d(dims, 2, 1) for _ in range(levels))

    def forward(self, image: torch.Tensor) -> list[torch.Tensor]:
        return [head(level) for head, level in zip(self.head, self.neck(self.backbone(image)))]


def tiny_model(family: str, layout: str, peft: dict | None = LORA) -> DenseModel:
    trunk = dict(TINY_BACKBONES[family], img_size=32, patch_size=8, peft=peft,
                 norm_cfg=dict(type='BN'))
    dims = trunk['arch']['embed_dims']
    if layout == 'pyramid':
        return DenseModel(MODELS.build(dict(trunk, pyramid_norm_cfg=dict(type='BN'))),
                          nn.Identity(), 4, dims)
    if layout == 'adapter':
        # injectors that start open (the paper's 0 leaves their query norms without a
        # gradient until their zero-initialised sampling layers have moved: three steps)
        adapter = ColumnarAdapter(dict(trunk, dense_class_token=False), conv_inplane=8,
                                  deform_num_heads=2, interaction_indexes=[(0, 1), (2, 3)],
                                  norm_cfg=dict(type='BN'), init_values=0.1)
        return DenseModel(adapter, nn.Identity(), 4, dims)
    vitdet = dict(trunk, pyramid=False, out_indices=(-1,), dense_class_token=False)
    if MODELS.get(trunk['type']).token_attention:
        vitdet.update(WINDOWS)
    neck = SimpleFeaturePyramid(dims, dims, scale_factors=(2.0, 1.0, 0.5), num_outs=3)
    return DenseModel(MODELS.build(vitdet), neck, 3, dims)


def backbone_of(model: DenseModel) -> nn.Module:
    return model.backbone.trunk if isinstance(model.backbone, ColumnarAdapter) \
        else model.backbone


def optim_wrapper(model: nn.Module, **paramwise):
    return OPTIM_WRAPPER_CONSTRUCTORS.build(dict(
        type='vitdense.LayerDecayOptimWrapperConstructor',
        optim_wrapper_cfg=dict(type='OptimWrapper',
                               optimizer=dict(type='AdamW', lr=1e-2, weight_decay=0.05)),
        paramwise_cfg=paramwise))(model)


@pytest.mark.parametrize('layout', LAYOUTS)
@pytest.mark.parametrize('family', sorted(TINY_BACKBONES))
def test_two_iterations_change_adapters_necks_and_heads_only(family, layout):
    torch.manual_seed(0)
    model = tiny_model(family, layout)
    trunk = 'backbone.trunk.' if layout == 'adapter' else 'backbone.'
    trainable = {name for name, param in model.named_parameters() if param.requires_grad}
    # in the trunk: the adapters and what is new in fine-tuning (pyramid, relative
    # positions); outside it (ViT-Adapter's modules, neck, head): everything
    assert {name for name in trainable if name.startswith(trunk)} == {
        name for name, _ in model.named_parameters() if name.startswith(trunk) and (
            '.lora_' in name or name.startswith(trunk + 'pyramid.') or '.rel_pos.' in name)}
    assert {name for name, _ in model.named_parameters()
            if not name.startswith(trunk)} <= trainable
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    frozen = {name for name in before if name.startswith(trunk) and name not in trainable
              and not name.startswith(trunk + 'pyramid.')}
    wrapper = optim_wrapper(model, layer_decay_rate=0.75)
    model.train()
    image = torch.randn(2, 3, 32, 32)
    for _ in range(2):
        wrapper.update_params(sum((level - 1).square().mean() for level in model(image)))
    after = model.state_dict()
    changed = {name for name in before if not torch.equal(before[name], after[name])}
    assert trainable <= changed
    # not a bit of the frozen trunk moved: weights, and BatchNorm statistics (XCiT's stem)
    assert frozen and not frozen & changed


def test_frozen_trunk_keeps_batchnorm_statistics_in_training():
    """XCiT's stem and LPI BatchNorms are frozen weights: their running statistics too."""
    model = tiny_model('xcit', 'pyramid').train()
    backbone = model.backbone
    assert not backbone.patch_embed.training or not any(
        module.training for module in backbone.patch_embed.modules()
        if isinstance(module, nn.BatchNorm2d))
    assert all(not module.training for module in backbone.blocks.modules()
               if isinstance(module, nn.BatchNorm2d))
    assert all(module.training for module in backbone.pyramid.modules())


def test_layer_decay_and_weight_decay_groups_see_the_adapters():
    model = tiny_model('vit', 'pyramid')
    wrapper = optim_wrapper(model, layer_decay_rate=0.5)
    groups = groups_by_parameter_name(model, wrapper.optimizer)
    layers = model.backbone.num_layers + 2
    for block in range(model.backbone.num_layers):
        for kind in ('A', 'B'):
            group = groups[f'backbone.blocks.{block}.attn.qkv.lora_{kind}.default.weight']
            assert group['lr'] == pytest.approx(1e-2 * 0.5 ** (layers - 2 - block))
            assert group.get('weight_decay', 0.05) == 0.05
    assert groups['backbone.pyramid.fpn1.0.weight']['lr'] == pytest.approx(1e-2)


@pytest.mark.parametrize('method', ['LoRA', 'DoRA', 'LoHa', 'LoKr'])
def test_merged_model_computes_what_the_adapters_do(method):
    """Merging (peft's, into the base layers) gives plain layers whose state dict the model
    without ``peft`` loads strictly, with the same output (float32)."""
    torch.manual_seed(0)
    model = tiny_model('cait', 'vitdet', dict(type=method, r=4, alpha=8))
    perturb_(model)
    image = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        unmerged = model(image)
        assert merge_adapters(model) == 4 * 4
        merged = model(image)
    plain = tiny_model('cait', 'vitdet', None).eval()
    plain.load_state_dict(model.state_dict(), strict=True)
    with torch.no_grad():
        for ours, reference in zip(plain(image), unmerged):
            assert max_relative_diff(ours, reference) <= 1e-5
    for ours, reference in zip(merged, unmerged):
        assert max_relative_diff(ours, reference) <= 1e-5


def test_plain_checkpoint_loads_into_a_lora_backbone(tmp_path):
    """A plain backbone checkpoint (``Pretrained``) fills the wrapped layers' base weights;
    the adapters keep their initialisation (LoRA's B = 0: the model computes the
    checkpoint's function). A LoRA model's own checkpoint loads back with its adapters."""
    plain = perturb_(MODELS.build(dict(TINY_BACKBONES['vit'], patch_size=8, img_size=32)))
    path = tmp_path / 'plain.pth'
    torch.save(plain.state_dict(), path)
    lora = MODELS.build(dict(TINY_BACKBONES['vit'], patch_size=8, img_size=32, peft=LORA,
                             init_cfg=dict(type='Pretrained', checkpoint=str(path))))
    lora.init_weights()
    lora.eval()
    image = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        for ours, reference in zip(lora(image), plain(image)):
            torch.testing.assert_close(ours, reference, rtol=0, atol=0)
    assert torch.equal(lora.blocks[1].attn.qkv.base_layer.weight, plain.blocks[1].attn.qkv.weight)
    perturb_(lora)
    path_lora = tmp_path / 'lora.pth'
    torch.save(lora.state_dict(), path_lora)
    again = MODELS.build(dict(TINY_BACKBONES['vit'], patch_size=8, img_size=32, peft=LORA,
                              init_cfg=dict(type='Pretrained', checkpoint=str(path_lora))))
    again.init_weights()
    for name, tensor in lora.state_dict().items():
        assert torch.equal(again.state_dict()[name], tensor), name
    other = MODELS.build(dict(TINY_BACKBONES['vit'], patch_size=8, img_size=32,
                              peft=dict(LORA, blocks=(0,)),
                              init_cfg=dict(type='Pretrained', checkpoint=str(path_lora))))
    with pytest.raises(ValueError, match=r'adapter tensors .* blocks\.1\.attn\.qkv\.lora_A'):
        other.init_weights()


def test_blocks_norms_and_biases_choose_what_trains():
    backbone = MODELS.build(dict(TINY_BACKBONES['vit'], patch_size=8, img_size=32,
                                 pyramid=False, out_indices=(-1,),
                                 peft=dict(LORA, blocks=(-1,), targets=('qkv',),
                                           train=('norms', 'biases'))))
    trainable = {name for name, param in backbone.named_parameters() if param.requires_grad}
    assert {name for name in trainable if '.lora_' in name} == {
        'blocks.3.attn.qkv.lora_A.default.weight', 'blocks.3.attn.qkv.lora_B.default.weight'}
    assert 'blocks.0.norm1.weight' in trainable and 'blocks.0.mlp.fc1.bias' in trainable
    assert 'blocks.3.attn.qkv.base_layer.bias' in trainable
    assert 'blocks.0.mlp.fc1.weight' not in trainable
    assert 'blocks.3.attn.qkv.base_layer.weight' not in trainable


@pytest.mark.parametrize('peft, error, message', [
    (dict(type='IA3'), ValueError, r"'IA3' is not one of \['LoRA', 'DoRA', 'LoHa', 'LoKr'\]"),
    (dict(targets='qkv'), ValueError, 'non-empty sequence'),
    (dict(targets=('qkv', 'q_proj')), ValueError,
     r"\['q_proj'\] name no linear layer .* \['fc1', 'fc2', 'proj', 'qkv'\]"),
    (dict(targets=('mix_logits',)), ValueError, 'reads its weight directly'),
    (dict(blocks=(4,)), IndexError, 'block 4 out of range for 4 blocks'),
    (dict(train=('gammas',)), ValueError, r"train takes a sequence of \('norms', 'biases'\)"),
    (dict(lora_rank=3), ValueError, 'peft.LoraConfig'),
])
def test_bad_options_name_the_problem(peft, error, message):
    arch = dict(TINY_BACKBONES['cait']['arch'])
    with pytest.raises(error, match=message):
        MODELS.build(dict(TINY_BACKBONES['cait'], arch=arch, patch_size=8, img_size=32,
                          peft=dict(LORA, **peft)))


def test_parallel_blocks_are_refused():
    with pytest.raises(ValueError, match='BranchedLinear; adapters wrap nn.Linear'):
        MODELS.build(dict(TINY_BACKBONES['vit'], patch_size=8, img_size=32, num_parallel=2,
                          peft=LORA))


def _train_step(model: nn.Module, image: torch.Tensor) -> tuple[list, dict]:
    model.zero_grad(set_to_none=True)
    outputs = model(image)
    sum(out.square().mean() for out in outputs).backward()
    return [out.detach() for out in outputs], {
        name: param.grad for name, param in model.named_parameters() if param.requires_grad}


@pytest.mark.parametrize('family', sorted(TINY_BACKBONES))
def test_activation_checkpointing_gives_the_same_gradients(family):
    """``with_cp`` recomputes the blocks in backward, adapters included: the adapters'
    gradients are those of the plain run (dropout off)."""
    options = dict(TINY_BACKBONES[family], img_size=32, patch_size=8, peft=LORA)
    torch.manual_seed(0)
    plain = MODELS.build(options).train()
    torch.manual_seed(0)
    checkpointed = MODELS.build(dict(options, with_cp=True)).train()
    image = torch.randn(2, 3, 32, 32)
    (outputs, grads), (cp_outputs, cp_grads) = (_train_step(plain, image),
                                                _train_step(checkpointed, image))
    assert grads.keys() == cp_grads.keys() and any('.lora_' in name for name in grads)
    for got, want in zip(cp_outputs + list(cp_grads.values()), outputs + list(grads.values())):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_lora_backbone_compiles_in_one_graph():
    """peft's layers trace with the blocks (dynamo, ``aot_eager``: no C++ compiler; CaiT:
    talking heads, a windowed and a global block; tracing costs by block, so two): one
    graph, no break, the eager step's outputs and adapter gradients."""
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    model = MODELS.build(dict(
        TINY_BACKBONES['cait'], arch=dict(TINY_BACKBONES['cait']['arch'], num_layers=2),
        img_size=32, patch_size=8, pyramid=False, out_indices=(-1,), dense_class_token=False,
        peft=LORA, **dict(WINDOWS, window_block_indexes=(0,)))).train()
    image = torch.randn(2, 3, 32, 32)
    eager_outputs, eager_grads = _train_step(model, image)
    assert compile_model(nn.ModuleDict(dict(backbone=model)), backend='aot_eager') == \
        ['backbone']
    outputs, grads = _train_step(model, image)
    assert dict(counters['graph_break']) == {} and counters['stats']['unique_graphs'] == 1
    assert any('.lora_' in name for name in grads)
    for got, want in zip(outputs + list(grads.values()),
                         eager_outputs + list(eager_grads.values())):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_adapters_train_under_autocast():
    """Mixed precision (CPU autocast, bfloat16): peft's layers cast their input to the
    adapters' float32 weights; the adapters get finite gradients, nothing frozen gets any."""
    model = tiny_model('cait', 'vitdet').train()
    with torch.autocast('cpu', dtype=torch.bfloat16):
        loss = sum(level.float().square().mean() for level in model(torch.randn(2, 3, 32, 32)))
    loss.backward()
    grads = {name: param.grad for name, param in model.named_parameters()}
    assert all(grad is not None and torch.isfinite(grad).all()
               for name, grad in grads.items() if '.lora_' in name)
    assert all(grads[name] is None for name, param in model.named_parameters()
               if not param.requires_grad)
    assert any(grad.abs().sum() > 0 for name, grad in grads.items() if '.lora_B.' in name)


def _saved_bytes(model: nn.Module, image: torch.Tensor) -> int:
    """Bytes of the tensors that the forward keeps for backward (outside recomputed blocks)."""
    saved = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        saved.append(tensor.numel() * tensor.element_size())
        return tensor
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        model(image)
    return sum(saved)


def test_activation_checkpointing_keeps_no_activations_of_the_first_block():
    """The frozen embedding hands the first block tokens that need no gradient, but its
    adapters do: with ``with_cp`` it is recomputed too, and the forward keeps about the
    blocks' inputs only (not a block's worth of activations)."""
    options = dict(TINY_BACKBONES['vit'], img_size=32, patch_size=8, pyramid=False,
                   out_indices=(-1,), peft=LORA)
    image = torch.randn(2, 3, 32, 32)
    kept = _saved_bytes(MODELS.build(dict(options, with_cp=True)).train(), image)
    tokens = image.shape[0] * 17 * TINY_BACKBONES['vit']['arch']['embed_dims'] * 4
    assert kept <= 2 * 4 * tokens  # four blocks' inputs, with room for the output's norm
    assert _saved_bytes(MODELS.build(options).train(), image) > 4 * kept
