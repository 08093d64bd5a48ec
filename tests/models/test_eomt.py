"""EoMT against the official code (github.com/tue-mps/eomt, ``models/eomt.py``,
``models/scale_block.py`` and ``training/lightning_module.py``): its forward and its mask
annealing schedule are written out below from those files, run on timm's ViT with registers
(DINOv2's layout, as the official code builds it from timm), and compared with ours on the
same weights."""
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import LayerNorm2d
from timm.models.vision_transformer import VisionTransformer

from vitdense.engine.hooks import EoMTMaskAnnealingHook, TimeBudgetHook
from vitdense.models import EoMT, ViT
from vitdense.models.backbones.vit import DINOV3, EVA02
from vitdense.models.eomt import annealed_mask_probability

from vitdense.registry import MODELS

from common import TINY_BACKBONES, max_relative_diff, perturb_

WIDTH, DEPTH, HEADS, PATCH, REGISTERS = 64, 6, 4, 14, 4
NUM_CLASSES, NUM_QUERIES, NUM_BLOCKS = 5, 8, 3
#: (rows, cols) of the two input sizes, multiples of the patch size
SIZES = ((56, 56), (42, 70))
#: ADE20k semantic, ViT-L (configs/dinov2/ade20k/semantic/eomt_large_512.yaml), poly 0.9
OFFICIAL_START = (6520, 13040, 19560, 26080)
OFFICIAL_END = (13040, 19560, 26080, 32600)


class OfficialScaleBlock(nn.Module):
    """``models/scale_block.py``: transposed conv, GELU, depth-wise conv, LayerNorm2d."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.conv1 = nn.ConvTranspose2d(dim, dim, kernel_size=2, stride=2)
        self.act = nn.GELU()
        self.conv2 = nn.Conv2d(dim, dim, 3, padding=1, groups=dim, bias=False)
        self.norm = LayerNorm2d(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.conv2(self.act(self.conv1(x))))


class OfficialEoMT(nn.Module):
    """The official ``EoMT`` forward on a timm ViT (``encoder.backbone`` there), images
    already normalised; ``attn_mask_probs`` as its buffer."""

    def __init__(self, backbone: VisionTransformer, num_classes: int, num_q: int,
                 num_blocks: int) -> None:
        super().__init__()
        dim = backbone.embed_dim
        self.backbone, self.num_q, self.num_blocks = backbone, num_q, num_blocks
        self.register_buffer('attn_mask_probs', torch.ones(num_blocks))
        self.q = nn.Embedding(num_q, dim)
        self.class_head = nn.Linear(dim, num_classes + 1)
        self.mask_head = nn.Sequential(nn.Linear(dim, dim), nn.GELU(), nn.Linear(dim, dim),
                                       nn.GELU(), nn.Linear(dim, dim))
        patch = max(backbone.patch_embed.patch_size)
        self.upscale = nn.Sequential(*[OfficialScaleBlock(dim)
                                       for _ in range(max(1, int(math.log2(patch)) - 2))])

    def _predict(self, x):
        q = x[:, :self.num_q, :]
        class_logits = self.class_head(q)
        x = x[:, self.num_q + self.backbone.num_prefix_tokens:, :]
        x = x.transpose(1, 2).reshape(x.shape[0], -1, *self.backbone.patch_embed.grid_size)
        return torch.einsum('bqc, bchw -> bqhw', self.mask_head(q), self.upscale(x)), class_logits

    def _attn(self, module, x, mask):
        B, N, C = x.shape
        qkv = module.qkv(x).reshape(B, N, 3, module.num_heads, module.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        q, k = module.q_norm(q), module.k_norm(k)
        if mask is not None:
            mask = mask[:, None, ...].expand(-1, module.num_heads, -1, -1)
        x = F.scaled_dot_product_attention(q, k, v, mask, 0.0)
        return module.proj_drop(module.proj(x.transpose(1, 2).reshape(B, N, C)))

    def _attn_mask(self, x, mask_logits, i):
        attn_mask = torch.ones(x.shape[0], x.shape[1], x.shape[1], dtype=torch.bool)
        interpolated = F.interpolate(mask_logits, self.backbone.patch_embed.grid_size,
                                     mode='bilinear')
        interpolated = interpolated.view(interpolated.size(0), interpolated.size(1), -1)
        attn_mask[:, :self.num_q, self.num_q + self.backbone.num_prefix_tokens:] = \
            interpolated > 0
        prob = self.attn_mask_probs[i - len(self.backbone.blocks) + self.num_blocks]
        if prob < 1:
            random_queries = torch.rand(attn_mask.shape[0], self.num_q) > prob
            attn_mask[:, :self.num_q,
                      self.num_q + self.backbone.num_prefix_tokens:][random_queries] = True
        return attn_mask

    def forward(self, x):
        x = self.backbone._pos_embed(self.backbone.patch_embed(x))
        attn_mask = None
        mask_logits_per_layer, class_logits_per_layer = [], []
        for i, block in enumerate(self.backbone.blocks):
            if i == len(self.backbone.blocks) - self.num_blocks:
                x = torch.cat((self.q.weight[None, :, :].expand(x.shape[0], -1, -1), x), dim=1)
            if i >= len(self.backbone.blocks) - self.num_blocks:
                mask_logits, class_logits = self._predict(self.backbone.norm(x))
                mask_logits_per_layer.append(mask_logits)
                class_logits_per_layer.append(class_logits)
                attn_mask = self._attn_mask(x, mask_logits, i)
            x = x + block.ls1(self._attn(block.attn, block.norm1(x), attn_mask))
            x = x + block.ls2(block.mlp(block.norm2(x)))
        mask_logits, class_logits = self._predict(self.backbone.norm(x))
        return mask_logits_per_layer + [mask_logits], class_logits_per_layer + [class_logits]


def official_mask_annealing(start_iter: int, current_iter: int, final_iter: int,
                            poly_power: float = 0.9) -> torch.Tensor:
    """``LightningModule.mask_annealing`` of the official training code (float32 buffer)."""
    if current_iter < start_iter:
        return torch.ones(1)
    elif current_iter >= final_iter:
        return torch.zeros(1)
    progress = torch.tensor((current_iter - start_iter) / (final_iter - start_iter))
    return (1.0 - progress).pow(poly_power)


def dinov2_style(img_size: tuple[int, int], seed: int) -> tuple[VisionTransformer, ViT]:
    """timm's ViT with registers and LayerScale (DINOv2's layout) at random weights, and ours
    loaded from its state dict; both take ``img_size`` (the official code builds timm's ViT
    at its input size)."""
    reference = VisionTransformer(img_size=img_size, patch_size=PATCH, embed_dim=WIDTH,
                                  depth=DEPTH, num_heads=HEADS, reg_tokens=REGISTERS,
                                  no_embed_class=True, init_values=1e-5, num_classes=0)
    perturb_(reference, seed)
    ours = ViT(dict(embed_dims=WIDTH, num_layers=DEPTH, num_heads=HEADS), patch_size=PATCH,
               img_size=img_size, reg_tokens=REGISTERS, no_embed_class=True, layer_scale=1e-5,
               out_type='cls_token', init_cfg=None)
    # timm's keys are ours but for the position table's (a module of ours); strict
    ours.load_state_dict({'pos_embed.weight' if key == 'pos_embed' else key: value
                          for key, value in reference.state_dict().items()})
    return reference, ours.eval()


def eomt_pair(img_size: tuple[int, int], seed: int) -> tuple[OfficialEoMT, EoMT]:
    """The official EoMT and ours with the same backbone and head weights, in eval mode."""
    reference_vit, our_vit = dinov2_style(img_size, seed)
    official = OfficialEoMT(reference_vit, NUM_CLASSES, NUM_QUERIES, NUM_BLOCKS).eval()
    ours = EoMT(our_vit, NUM_CLASSES, NUM_QUERIES, NUM_BLOCKS).eval()
    for mine, theirs in ((ours.queries, official.q), (ours.class_head, official.class_head),
                         (ours.mask_head, official.mask_head), (ours.upscale, official.upscale)):
        values = list(perturb_(theirs, seed + 1).state_dict().values())
        assert len(values) == len(mine.state_dict())
        mine.load_state_dict(dict(zip(mine.state_dict(), values)))
    return official, ours


@pytest.mark.parametrize('img_size', SIZES)
@pytest.mark.parametrize('probability', (1.0, 0.0))
def test_eval_logits_match_official(img_size, probability):
    """Eval mode, masks kept (every block masked as at the start of training) or annealed
    away (inference): every prediction's class and mask logits within 1e-5 of the official
    forward's, relative, in float32."""
    official, ours = eomt_pair(img_size, seed=sum(img_size))
    official.attn_mask_probs.fill_(probability)
    ours.set_mask_probabilities([probability] * NUM_BLOCKS)
    images = torch.randn(2, 3, *img_size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        official_masks, official_classes = official(images)
        our_classes, our_masks = ours(images)
    # annealed away, the official code still predicts before each block; we predict last only
    expected = NUM_BLOCKS + 1 if probability else 1
    assert len(our_classes) == len(our_masks) == expected
    official_masks, official_classes = official_masks[-expected:], official_classes[-expected:]
    assert our_masks[-1].shape == (2, NUM_QUERIES, img_size[0] // 7, img_size[1] // 7)
    for theirs, mine in zip(official_classes + official_masks, our_classes + our_masks):
        assert mine.shape == theirs.shape
        assert max_relative_diff(mine, theirs) <= 1e-5
    if probability:  # the masks changed what the queries saw
        unmasked = EoMT(ours.backbone, NUM_CLASSES, NUM_QUERIES, NUM_BLOCKS, masked_attn=False)
        unmasked.load_state_dict(ours.state_dict())
        with torch.no_grad():
            assert max_relative_diff(unmasked.eval()(images)[0][-1], our_classes[-1]) > 1e-3


def test_annealing_schedule_matches_official():
    """The probability of keeping the mask equals the official schedule's at every iteration
    of the official ADE20k schedule, for each of its four blocks."""
    for iteration in range(OFFICIAL_END[-1] + 2):
        for start, end in zip(OFFICIAL_START, OFFICIAL_END):
            ours = annealed_mask_probability(iteration, start, end)
            theirs = official_mask_annealing(start, iteration, end)
            assert torch.equal(ours.reshape(1), theirs.reshape(1))


class _Runner:
    """What the hook reads of mmengine's Runner: the iteration, the model and the hooks."""

    def __init__(self, model: nn.Module) -> None:
        self.model, self.iter, self.hooks = model, 0, []


def test_annealing_hook_sets_the_schedule_before_each_iteration():
    """The hook writes the schedule at the runner's iteration into the model's buffer: one
    before a block's start, zero from its end, the polynomial in between."""
    _, ours = eomt_pair(SIZES[0], seed=0)
    starts, ends = (2, 4, 6), (4, 6, 10)
    hook = EoMTMaskAnnealingHook(starts, ends, power=0.9)
    runner = _Runner(nn.ModuleDict(dict(backbone=ours)))
    for iteration in range(12):
        runner.iter = iteration
        hook.before_train_iter(runner, batch_idx=iteration)
        expected = [official_mask_annealing(s, iteration, e).item() for s, e in zip(starts, ends)]
        assert ours.mask_probabilities.tolist() == expected
    assert ours.mask_probabilities.tolist() == [0.0] * 3


def test_annealing_hook_refuses_a_schedule_of_another_length():
    _, ours = eomt_pair(SIZES[0], seed=0)
    with pytest.raises(ValueError, match='schedule for 2 blocks, the model masks 3'):
        EoMTMaskAnnealingHook((1, 2), (2, 3)).before_train_iter(_Runner(ours), 0)
    with pytest.raises(ValueError, match='>= its start'):
        EoMTMaskAnnealingHook((5,), (2,))


def test_training_predicts_before_every_masked_block_and_anneals_to_the_plain_vit():
    """In training a prediction comes from before each of the last blocks (each trained by
    the loss) whatever the probabilities; with every mask annealed away the final one is the
    unmasked model's."""
    _, ours = eomt_pair(SIZES[0], seed=3)
    images = torch.randn(2, 3, *SIZES[0])
    ours.train().set_mask_probabilities([0.0] * NUM_BLOCKS)
    classes, masks = ours(images)
    assert len(classes) == len(masks) == NUM_BLOCKS + 1
    (classes[-1].sum() + masks[0].sum()).backward()
    assert ours.queries.weight.grad.abs().sum() > 0
    unmasked = EoMT(ours.backbone, NUM_CLASSES, NUM_QUERIES, NUM_BLOCKS, masked_attn=False)
    unmasked.load_state_dict(ours.state_dict())
    plain_classes, plain_masks = unmasked.train()(images)
    assert len(plain_classes) == 1
    torch.testing.assert_close(classes[-1], plain_classes[0])
    torch.testing.assert_close(masks[-1], plain_masks[0])


def test_layer_decay_ids_follow_the_official_groups():
    """Block i of L decays by rate ** (L - 1 - i), the embeddings as block 0, the final
    norm, queries and mask module not at all (the official ``configure_optimizers``)."""
    _, ours = eomt_pair(SIZES[0], seed=0)
    depth = {name: ours.get_layer_depth(f'backbone.{name}', 'backbone.')
             for name, _ in ours.named_parameters()}
    assert depth['backbone.blocks.2.attn.qkv.weight'] == (2, DEPTH)
    assert depth['backbone.patch_embed.proj.weight'] == (0, DEPTH)
    assert depth['backbone.cls_token'] == (0, DEPTH)
    for name in ('backbone.norm.weight', 'queries.weight', 'class_head.bias',
                 'upscale.0.0.weight'):
        assert depth[name] == (DEPTH - 1, DEPTH)
    # the official llrd_l2_enabled=False (its DINOv3 recipes): the query blocks at the full rate
    full = EoMT(ours.backbone, NUM_CLASSES, NUM_QUERIES, NUM_BLOCKS, decay_query_blocks=False)
    for block in range(DEPTH):
        expected = DEPTH - 1 if block >= DEPTH - NUM_BLOCKS else block
        name = f'backbone.blocks.{block}.mlp.fc1.weight'
        assert full.get_layer_depth(name, '') == (expected, DEPTH)
    assert full.get_layer_depth('backbone.patch_embed.proj.weight', '') == (0, DEPTH)


@pytest.mark.parametrize('options, message', [
    (dict(out_type='featmap', pyramid=False), "out_type='cls_token'"),
    (dict(out_type='avg_featmap', class_token=False, window_size=2), 'in windows'),
    (dict(out_type='cls_token', pos_embed='none', use_rel_pos_bias=True),
     'relative position biases'),
])
def test_refuses_backbones_it_cannot_drive(options, message):
    backbone = ViT(dict(embed_dims=WIDTH, num_layers=DEPTH, num_heads=HEADS), patch_size=PATCH,
                   init_cfg=None, **options)
    with pytest.raises(ValueError, match=message):
        EoMT(backbone, NUM_CLASSES, NUM_QUERIES, NUM_BLOCKS)


@pytest.mark.parametrize('family, out_type, patch, size', [
    ('cait', 'cls_token', PATCH, SIZES[1]), ('xcit', 'avg_featmap', 8, (48, 64)),
    ('convit', 'cls_token', PATCH, SIZES[1])])
def test_every_family_takes_the_masks(family, out_type, patch, size):
    """On CaiT (talking heads), XCiT (cross-covariance attention, each query's over the
    patches it sees) and ConViT (plain attention after the GPSA blocks, its class token in
    place) the masks change what the queries see, and once annealed away the model is the
    unmasked one."""
    torch.manual_seed(0)
    # XCiT's convolutional stem takes 8- or 16-px patches
    backbone = MODELS.build(dict(TINY_BACKBONES[family], patch_size=patch,
                                 out_type=out_type, init_cfg=None))
    masked = perturb_(EoMT(backbone, NUM_CLASSES, NUM_QUERIES, num_blocks=2))
    masked.set_mask_probabilities([1.0, 1.0])
    unmasked = EoMT(backbone, NUM_CLASSES, NUM_QUERIES, num_blocks=2, masked_attn=False)
    unmasked.load_state_dict(masked.state_dict())
    unmasked.eval()
    images = torch.randn(2, 3, *size)
    with torch.no_grad():
        plain = unmasked(images)[0][-1]
        assert max_relative_diff(masked(images)[0][-1], plain) > 1e-3
        masked.set_mask_probabilities([0.0, 0.0])
        torch.testing.assert_close(masked(images)[0][-1], plain)


def test_convit_queries_join_after_its_gated_blocks():
    """docs/eomt.md: ConViT's queries join with its class token, in the plain blocks after
    the GPSA ones, in front of it; asking for a GPSA block is refused, naming the fix."""
    backbone = MODELS.build(dict(TINY_BACKBONES['convit'], patch_size=PATCH,
                                 out_type='cls_token', init_cfg=None))
    message = (r'block 0 of ConViT has gated positional self-attention.*3 plain .*'
               r'num_blocks <= 3 or fewer GPSA blocks \(num_local_layers\)')
    with pytest.raises(ValueError, match=message):
        EoMT(backbone, NUM_CLASSES, NUM_QUERIES, num_blocks=4)
    eomt = EoMT(backbone, NUM_CLASSES, NUM_QUERIES, num_blocks=3).eval()
    seen = []
    backbone.blocks[1].register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    with torch.no_grad():
        eomt(torch.randn(1, 3, *SIZES[0]))
    grid = (SIZES[0][0] // PATCH) * (SIZES[0][1] // PATCH)
    assert seen[0].shape[1] == NUM_QUERIES + 1 + grid
    torch.testing.assert_close(seen[0][0, :NUM_QUERIES], eomt.queries.weight)


@pytest.mark.parametrize('options', [DINOV3, dict(EVA02, patch_size=PATCH)],
                         ids=['dinov3', 'eva02'])
def test_rotary_vits_take_the_queries_unrotated(options):
    """DINOv3's and EVA-02's rotary positions turn the patches only: the queries, like the
    class token and registers, are prefix tokens without a position. A query moved to
    another slot gives the same logits for it."""
    torch.manual_seed(0)
    options = {key: value for key, value in options.items() if key != 'patch_size'}
    backbone = ViT(dict(embed_dims=WIDTH, num_layers=DEPTH, num_heads=HEADS), patch_size=PATCH,
                   img_size=SIZES[0], out_type='cls_token', init_cfg=None, **options)
    ours = perturb_(EoMT(backbone, NUM_CLASSES, NUM_QUERIES, NUM_BLOCKS))
    ours.set_mask_probabilities([0.0] * NUM_BLOCKS)
    images = torch.randn(1, 3, *SIZES[0])
    with torch.no_grad():
        classes = ours(images)[0][-1]
        ours.queries.weight.copy_(ours.queries.weight.roll(1, dims=0))
        rolled = ours(images)[0][-1]
    torch.testing.assert_close(rolled, classes.roll(1, dims=1), rtol=1e-5, atol=1e-5)


def test_refuses_images_not_a_multiple_of_the_patch():
    _, ours = eomt_pair(SIZES[0], seed=0)
    with pytest.raises(ValueError, match='multiples of the patch size 14'):
        ours(torch.randn(1, 3, 56, 50))


def test_annealed_masks_are_saved_with_the_weights():
    """A model loaded from a trained one's state dict runs as it does: masks annealed away,
    the plain backbone and one prediction in eval mode."""
    _, trained = eomt_pair(SIZES[0], seed=0)
    trained.set_mask_probabilities([0.0] * NUM_BLOCKS)
    _, fresh = eomt_pair(SIZES[0], seed=1)
    assert fresh.mask_probabilities.tolist() == [1.0] * NUM_BLOCKS
    fresh.load_state_dict(trained.state_dict())
    images = torch.randn(1, 3, *SIZES[0])
    with torch.no_grad():
        classes, _ = fresh(images)
        assert len(classes) == 1
        torch.testing.assert_close(classes[-1], trained(images)[0][-1], rtol=0, atol=0)
    with pytest.raises(ValueError, match='masks 3 blocks: give one probability each, got 2'):
        fresh.set_mask_probabilities([1.0, 1.0])


def test_annealing_hook_follows_a_time_budget():
    """With start and end fractions the schedule runs over the share of the runner's time
    budget spent; without a TimeBudgetHook that schedule is refused, naming it."""
    _, ours = eomt_pair(SIZES[0], seed=0)
    budget = TimeBudgetHook(minutes=1.0)
    hook = EoMTMaskAnnealingHook(start_fractions=(0.2, 0.4, 0.6), end_fractions=(0.4, 0.6, 0.8))
    runner = _Runner(nn.ModuleDict(dict(backbone=ours)))
    runner.hooks = [budget, hook]
    for spent in (0.0, 0.3, 0.5, 0.9):
        budget.spent = lambda spent=spent: spent
        hook.before_train_iter(runner, batch_idx=0)
        expected = [annealed_mask_probability(spent, s, e).item()
                    for s, e in zip((0.2, 0.4, 0.6), (0.4, 0.6, 0.8))]
        assert ours.mask_probabilities.tolist() == expected
    assert ours.mask_probabilities.tolist() == [0.0] * 3
    runner.hooks = [hook]
    with pytest.raises(ValueError, match='add a vitdense.TimeBudgetHook'):
        hook.before_train_iter(runner, batch_idx=0)
    with pytest.raises(ValueError, match='either in iterations'):
        EoMTMaskAnnealingHook((1,), (2,), start_fractions=(0.1,), end_fractions=(0.2,))
