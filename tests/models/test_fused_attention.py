"""Talking heads (the CPU operator, the fold into fused attention) and GPSA's separable term:
the written-out maps' outputs and gradients, op by op no token-by-token tensor, and as many
ops at any token count."""
from typing import Optional

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from common import TINY_ARCH, reference_bias
from vitdense.analysis.saved_tensors import fused_attention_on_meta
from vitdense.models import CaiT, ConViT, ViT, XCiT
from vitdense.models.layers import (GatedPositionalSelfAttention, MultiheadSelfAttention,
                                    talking_heads)
from vitdense.models.layers import talking_heads_cpu
from vitdense.models.layers.talking_heads import (available_paths, choose_path, forced_path,
                                                  talking_heads_attention, with_logit_terms)
from vitdense.models.layers.window_attention import DecomposedRelativePosition, window_attention

GRIDS = [(4, 4), (3, 5), (5, 7)]  # square, rectangular, odd
#: the talking-heads paths that run here (the Triton kernel's interpreter is checked in
#: test_talking_heads_triton.py)
PATHS = tuple(path for path in available_paths(torch.device('cpu')) if path != 'triton')
#: float32: every output and gradient within this fraction of its largest entry
TOLERANCE = 1e-5
#: under autocast, against float32 (8 bits of mantissa in bfloat16, 11 in float16; measured
#: up to 1.3e-2 and 1.7e-3)
HALF_TOLERANCE = {torch.bfloat16: 2e-2, torch.float16: 4e-3}
#: GPSA's gate gradient is the difference of the two terms' outputs, which cancel: 7.6e-2
#: measured in bfloat16
GATE_HALF_TOLERANCE = {torch.bfloat16: 1e-1, torch.float16: 4e-3}


def worst_error(ours: dict, reference: dict) -> tuple[str, float]:
    """The tensor whose largest difference is the largest fraction of its own scale."""
    errors = {name: float((ours[name].float() - expected).abs().max() / expected.abs().max())
              for name, expected in reference.items()}
    name = max(errors, key=errors.get)
    return name, errors[name]


def assert_matches(ours: dict, reference: dict, tolerance: float = TOLERANCE) -> None:
    name, error = worst_error(ours, reference)
    assert error <= tolerance, f'{name} differs by {error:.2e} of its scale'


def grads(out: torch.Tensor, inputs: dict, seed: int = 1) -> dict:
    """The output and the gradients of a fixed random projection of it."""
    probe = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed))
    values = torch.autograd.grad((out.float() * probe).sum(), list(inputs.values()),
                                 allow_unused=True)
    return dict(out=out.detach().float(),
                **{f'd{name}': g for name, g in zip(inputs, values) if g is not None})


# ---------------------------------------------------------------------- talking heads
def mixes(heads: int) -> tuple[torch.nn.Linear, torch.nn.Linear]:
    """Head mixes with values everywhere (biases included, zero in no model)."""
    mix_logits, mix_weights = torch.nn.Linear(heads, heads), torch.nn.Linear(heads, heads)
    for param in (*mix_logits.parameters(), *mix_weights.parameters()):
        torch.nn.init.normal_(param)
    return mix_logits, mix_weights


def written_out_talking_heads(q, k, v, scale, mix_logits, mix_weights, bias=None):
    """CaiT §2 as written: logits (+ an (N, N) bias), mixed across heads, softmax, mixed."""
    logits = scale * q @ k.transpose(-2, -1)
    if bias is not None:
        logits = logits + bias
    logits = torch.einsum('hg,bgnm->bhnm', mix_logits.weight, logits) + \
        mix_logits.bias.view(-1, 1, 1)
    weights = torch.einsum('hg,bgnm->bhnm', mix_weights.weight, logits.softmax(-1)) + \
        mix_weights.bias.view(-1, 1, 1)
    return weights @ v


def talking_heads_case(hw, rel_pos: bool, class_token: bool, heads: int = 3,
                       batch: int = 2, width: int = 8) -> dict:
    """Inputs of one talking-heads call: ``heads`` of ``width``, the grid's tokens (and a
    class token in front), relative positions or none."""
    torch.manual_seed(0)
    tokens = hw[0] * hw[1] + class_token
    q, k, v = (torch.randn(batch, heads, tokens, width, requires_grad=True)
               for _ in range(3))
    case = dict(q=q, k=k, v=v, mixes=mixes(heads), table=None)
    if rel_pos:
        case['table'] = DecomposedRelativePosition(width, hw, zero_init=False)
    return case


def run_talking_heads(case: dict, hw, path: Optional[str], dtype=None) -> dict:
    """Output and gradients by the library's ``path`` (None: the test's written-out maps)."""
    q, k, v, (mix_logits, mix_weights), table = (case[n] for n in ('q', 'k', 'v', 'mixes',
                                                                  'table'))
    scale = q.shape[-1] ** -0.5
    inputs = dict(q=q, k=k, v=v, mix_logits=mix_logits.weight, bias_logits=mix_logits.bias,
                  mix_weights=mix_weights.weight, bias_weights=mix_weights.bias)
    if table is not None:
        inputs.update(height=table.height, width=table.width)
    with torch.autocast('cpu', dtype=dtype or torch.bfloat16, enabled=dtype is not None):
        if path is None:
            bias = None if table is None else reference_bias(table, q, hw)
            out = written_out_talking_heads(q, k, v, scale, mix_logits, mix_weights, bias)
        else:
            terms = None if table is None else table(q, hw)
            out = talking_heads_attention(q, k, v, scale, mix_logits, mix_weights, terms,
                                          path=path)
    result = grads(out, inputs)
    # softmax is shift-invariant: the logit mix's bias gets no gradient on either path, only
    # rounding noise of the logit mix's own gradient's scale (the written-out maps in float32,
    # 16 heads: 8.6e-8 of it natively, 1.4e-7 with ATEN_CPU_CAPABILITY=default)
    bound = (TOLERANCE if dtype is None else HALF_TOLERANCE[dtype]) * \
        result['dmix_logits'].abs().max()
    assert result.pop('dbias_logits').abs().max() <= bound
    return result


@pytest.mark.parametrize('rel_pos, class_token', [(False, False), (True, False),
                                                  (False, True)])
@pytest.mark.parametrize('hw', GRIDS)
@pytest.mark.parametrize('path', PATHS)
def test_talking_heads_paths_equal_the_written_out_maps(path, hw, rel_pos, class_token):
    case = talking_heads_case(hw, rel_pos, class_token)
    assert_matches(run_talking_heads(case, hw, path), run_talking_heads(case, hw, None))


@pytest.mark.parametrize('block_elements, blocks', [(1, 3 * 2), (3 * 36 * 36, 2)])
def test_cpu_operator_in_blocks_of_rows_and_of_images_equals_the_maps(
        block_elements, blocks, monkeypatch):
    """Row blocks of 16 (the last one short) and one image per block, against the maps."""
    monkeypatch.setattr(talking_heads_cpu, 'BLOCK_ELEMENTS', block_elements)
    monkeypatch.setattr(talking_heads_cpu, 'BLOCK_ROWS', 16)
    hw = (4, 9)
    case = talking_heads_case(hw, rel_pos=True, class_token=False)  # 36 tokens, batch 2
    assert len(list(talking_heads_cpu._blocks(2, 3, 36, 36))) == blocks
    assert_matches(run_talking_heads(case, hw, 'blocks'), run_talking_heads(case, hw, None))


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
@pytest.mark.parametrize('path', ['blocks', 'fold'])
def test_talking_heads_under_autocast_are_close_to_float32(path, dtype):
    hw = (5, 7)
    case = talking_heads_case(hw, rel_pos=True, class_token=False)
    assert_matches(run_talking_heads(case, hw, path, dtype=dtype),
                   run_talking_heads(case, hw, None), HALF_TOLERANCE[dtype])


@pytest.mark.parametrize('path', ['blocks', 'fold'])
def test_a_thousandth_off_in_any_single_gradient_fails_the_parity_check(path):
    hw = (3, 5)
    case = talking_heads_case(hw, rel_pos=True, class_token=False)
    ours, reference = (run_talking_heads(case, hw, p) for p in (path, None))
    assert {'dq', 'dk', 'dv', 'dmix_logits', 'dmix_weights', 'dbias_weights',
            'dheight', 'dwidth'} <= ours.keys()
    for name in ours:
        wrong = dict(ours, **{name: ours[name] * 1.001})
        assert worst_error(wrong, reference)[1] > TOLERANCE, name


@pytest.mark.parametrize('path', ['blocks', 'fold'])
def test_talking_heads_keep_no_map_for_backward(path):
    """The fold runs again in backward rather than keeping its heads-times-larger operands;
    the CPU operator keeps its queries and keys (with the relative positions' columns),
    values and a log-sum-exp per row."""
    hw = (5, 7)
    case = talking_heads_case(hw, rel_pos=True, class_token=False)
    q, k, v, (mix_logits, mix_weights), table = (case[n] for n in ('q', 'k', 'v', 'mixes',
                                                                  'table'))
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        talking_heads_attention(q, k, v, 8 ** -0.5, mix_logits, mix_weights, table(q, hw),
                                path=path)
    queries, _ = with_logit_terms(q, k, table(q, hw))
    assert max(t.numel() for t in saved) <= (q if path == 'fold' else queries).numel()


@pytest.mark.parametrize('path', PATHS)
def test_windowed_talking_heads_block_equals_its_windows_written_out(path):
    """Windows of 3 on a 5 × 7 grid (padded to 6 × 9), relative positions, batch 2."""
    torch.manual_seed(0)
    model = CaiT(TINY_ARCH, pyramid=False, out_indices=(0,), dense_class_token=False,
                 window_size=3, use_rel_pos=True)
    attn = model.blocks[0].attn
    for param in (*attn.rel_pos.parameters(), *attn.mix_logits.parameters(),
                  *attn.mix_weights.parameters()):
        torch.nn.init.normal_(param)
    x = torch.randn(2, 35, TINY_ARCH['embed_dims'], requires_grad=True)
    heads, dims = attn.num_heads, TINY_ARCH['embed_dims'] // attn.num_heads

    def reference(windows: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
        q, k, v = attn.qkv(windows).view(*windows.shape[:2], 3, heads, dims).permute(
            2, 0, 3, 1, 4)
        out = written_out_talking_heads(q, k, v, attn.scale, attn.mix_logits,
                                        attn.mix_weights, reference_bias(attn.rel_pos, q, grid))
        return attn.proj(out.transpose(1, 2).flatten(-2))

    inputs = dict(x=x, **dict(attn.named_parameters()))
    with forced_path(attn, path):
        ours = grads(window_attention(attn, x, (5, 7), 3), inputs)
    theirs = grads(window_attention(reference, x, (5, 7), 3), inputs)
    ours.pop('dmix_logits.bias'), theirs.pop('dmix_logits.bias')  # zero: shift-invariance
    assert_matches(ours, theirs)


def test_the_path_is_chosen_by_device_token_count_dropout_and_export(monkeypatch):
    cpu, gpu = torch.device('cpu'), torch.device('cuda')
    for device, (path, threshold) in ((cpu, talking_heads.FUSED_PATHS['cpu']),
                                      (gpu, talking_heads.DEFAULT_FUSED_PATH)):
        assert choose_path(device, threshold, 0.) == path
        assert choose_path(device, threshold - 1, 0.) == 'maps'
    assert (talking_heads.FUSED_PATHS['cpu'][0], talking_heads.DEFAULT_FUSED_PATH[0]) == \
        ('blocks', 'fold')
    for device in (cpu, gpu):  # dropout on mixed weights: neither fused path has it
        assert choose_path(device, 10 ** 6, 0.1) == 'maps'
    assert choose_path(cpu, 10 ** 6, 0., forced='fold') == 'fold'
    assert choose_path(cpu, 10 ** 6, 0.1, forced='fold') == 'maps'

    class Symbolic(int):
        def __ge__(self, other):
            raise AssertionError('the token count was compared')

    # torch.compile: one path at every size, so multi-scale inputs share one graph
    monkeypatch.setattr(torch.compiler, 'is_compiling', lambda: True)
    assert choose_path(gpu, Symbolic(10), 0.) == 'fold'
    assert choose_path(cpu, Symbolic(10), 0.) == 'blocks'
    monkeypatch.setattr(torch.compiler, 'is_exporting', lambda: True)
    assert choose_path(gpu, Symbolic(10 ** 6), 0.) == 'maps'


def test_a_path_is_forced_per_layer_or_for_a_model_for_a_while(monkeypatch):
    model = CaiT(TINY_ARCH, pyramid=False, out_indices=(0,))
    layers = [m for m in model.modules() if getattr(m, 'talking_heads', False)]
    assert layers and all(layer.talking_heads_path is None for layer in layers)
    with forced_path(model, 'fold'):
        assert all(layer.talking_heads_path == 'fold' for layer in layers)
    assert all(layer.talking_heads_path is None for layer in layers)  # restored
    with pytest.raises(ValueError, match="unknown talking-heads path 'fused'"):
        with forced_path(model, 'fused'):
            pass
    with pytest.raises(ValueError, match="unknown talking-heads path 'fused'"):
        MultiheadSelfAttention(48, 4, talking_heads=True, talking_heads_path='fused')
    layer = MultiheadSelfAttention(48, 4, talking_heads=True, talking_heads_path='fold')
    with torch.device('meta'):
        x = torch.empty(2, 10, 48)
    assert layer.to('meta')(x).shape == (2, 10, 48)
    with pytest.raises(ValueError, match="fused talking heads have no attention dropout"):
        talking_heads.KERNELS['fold'](*torch.randn(3, 1, 4, 10, 12).unbind(0), 1.,
                                      layer.mix_logits, layer.mix_weights, None, 0.1)
    # the CPU operator on CPU tensors only; the Triton kernel on CPU tensors under the
    # interpreter only; a path that cannot run names those that can
    assert not talking_heads.runs_on('blocks', torch.device('cuda'))
    assert available_paths(torch.device('cuda')) == ('fold', 'triton', 'maps')
    monkeypatch.delenv('TRITON_INTERPRET', raising=False)
    assert available_paths(torch.device('cpu')) == ('blocks', 'fold', 'maps')
    q = torch.randn(1, 4, 10, 12)
    with pytest.raises(ValueError, match=r"path 'triton' does not run on cpu tensors; paths "
                       r"that do: \('blocks', 'fold', 'maps'\)"):
        talking_heads_attention(q, q, q, 1., layer.mix_logits, layer.mix_weights,
                                path='triton')
    monkeypatch.setenv('TRITON_INTERPRET', '1')
    assert 'triton' in available_paths(torch.device('cpu'))


# ---------------------------------------------------------------------- GPSA
def written_out_positional(pos_proj: torch.nn.Linear, hw: tuple[int, int]) -> torch.Tensor:
    """(heads, N, N) positional attention from offsets (key − query) written pair by pair."""
    rows, cols = hw
    offsets = torch.zeros(rows * cols, rows * cols, 3)
    for query in range(rows * cols):
        for key in range(rows * cols):
            (qy, qx), (ky, kx) = divmod(query, cols), divmod(key, cols)
            dx, dy = kx - qx, ky - qy
            offsets[query, key] = torch.tensor([dx, dy, dx * dx + dy * dy])
    return pos_proj(offsets).permute(2, 0, 1).softmax(-1)


def gpsa_case(rel_pos_grid=None) -> GatedPositionalSelfAttention:
    torch.manual_seed(0)
    mixer = GatedPositionalSelfAttention(24, 3, rel_pos_grid=rel_pos_grid)
    mixer.convolutional_init()
    with torch.no_grad():
        for param in (mixer.gating, mixer.pos_proj.bias,
                      *(mixer.rel_pos.parameters() if rel_pos_grid else ())):
            param.normal_()
        mixer.pos_proj.weight.add_(torch.randn(3, 3) * 0.3)  # trained-like, off the init
        mixer.v.weight.normal_(std=0.2)
    return mixer


@pytest.mark.parametrize('hw', GRIDS)
def test_separable_positional_attention_equals_the_written_out_map(hw):
    mixer = gpsa_case()
    v = torch.randn(2, 3, hw[0] * hw[1], 8, requires_grad=True)
    inputs = dict(v=v, weight=mixer.pos_proj.weight, bias=mixer.pos_proj.bias)
    ours = grads(mixer.positional_values(v, hw), inputs)
    theirs = grads(written_out_positional(mixer.pos_proj, hw) @ v, inputs)
    for result in (ours, theirs):  # constant along a row: no gradient on either path
        assert result.pop('dbias').abs().max() <= TOLERANCE
    assert_matches(ours, theirs)
    for name in ours:
        assert worst_error(dict(ours, **{name: ours[name] * 1.001}), theirs)[1] > TOLERANCE


@pytest.mark.parametrize('dtype', [None, torch.bfloat16, torch.float16])
@pytest.mark.parametrize('rel_pos', [False, True])
def test_gpsa_equals_its_written_out_weights(rel_pos, dtype):
    """The whole mixer: content (with relative positions) and positional terms, gated."""
    hw = (5, 7)
    mixer = gpsa_case(hw if rel_pos else None)
    x = torch.randn(2, 35, 24, requires_grad=True)
    inputs = dict(x=x, **dict(mixer.named_parameters()))
    with torch.autocast('cpu', dtype=dtype or torch.bfloat16, enabled=dtype is not None):
        ours = grads(mixer(x, hw), inputs)
    (values,) = mixer.v(x).view(2, 35, 1, 3, 8).permute(2, 0, 3, 1, 4)
    weights = mixer.attention_weights(x, hw)
    theirs = grads(mixer.proj((weights @ values).transpose(1, 2).flatten(-2)), inputs)
    tolerance = HALF_TOLERANCE.get(dtype, TOLERANCE)
    for result in (ours, theirs):  # rounding noise only: no gradient through a softmax
        assert result.pop('dpos_proj.bias').abs().max() <= \
            tolerance * result['dpos_proj.weight'].abs().max()
    assert_matches({'dgating': ours.pop('dgating')}, {'dgating': theirs.pop('dgating')},
                   GATE_HALF_TOLERANCE.get(dtype, TOLERANCE))
    assert_matches(ours, theirs, tolerance)


def test_attention_weights_positional_term_is_written_out_from_offsets():
    mixer, hw = gpsa_case(), (3, 4)
    torch.testing.assert_close(mixer.positional_attention(hw),
                               written_out_positional(mixer.pos_proj, hw))


def test_convolutional_init_places_each_head_as_timm_does():
    """Head by head: the same positional projection as timm's ``local_init``."""
    convit = pytest.importorskip('timm.models.convit')
    for heads in (4, 9, 16, 25):
        theirs = convit.GPSA(48 * heads, num_heads=heads, locality_strength=1.)
        theirs.local_init()
        ours = GatedPositionalSelfAttention(48 * heads, heads)
        ours.convolutional_init()
        torch.testing.assert_close(ours.pos_proj.weight, theirs.pos_proj.weight)
        kernel, hw = int(heads ** 0.5), (5, 5)
        if kernel % 2 == 0:
            continue  # an even kernel's centre falls between tokens: no single peak
        # head h peaks at the offset (h // k − c, h % k − c) of its k × k kernel
        centre = 12  # the middle token of the 5 × 5 grid
        peaks = ours.positional_attention(hw)[:, centre].argmax(-1)
        offset = (kernel - 1) // 2
        expected = [centre + (h % kernel - offset) * 5 + (h // kernel - offset)
                    for h in range(heads)]
        assert peaks.tolist() == expected


# ---------------------------------------------------------------------- structure
class OpRecord(TorchDispatchMode):
    """Every aten op of a step, and the largest tensor any of them creates."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops += 1
        for tensor in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(tensor, torch.Tensor):
                self.largest = max(self.largest, tensor.numel())
        return out


STRUCTURE_MODELS = {
    'vit': (ViT, dict(embed_dims=192, num_layers=2, num_heads=4), {}),
    'cait': (CaiT, dict(embed_dims=192, num_layers=2, num_heads=4), {}),
    'cait-vitdet': (CaiT, dict(embed_dims=192, num_layers=2, num_heads=4),
                    dict(window_size=14, window_block_indexes=(0,), use_rel_pos=True,
                         dense_class_token=False, rel_pos_img_size=1024)),
    'xcit': (XCiT, dict(embed_dims=192, num_layers=2, num_heads=4), {}),
    'convit': (ConViT, dict(embed_dims=192, num_layers=3, num_heads=4, num_local_layers=2),
               {}),
}


def record_training_step(family: str, shape: tuple[int, int]) -> OpRecord:
    cls, arch, options = STRUCTURE_MODELS[family]
    with torch.device('meta'):
        model = cls(arch, out_indices=(0, 1) if family != 'convit' else (1, 2),
                    pyramid=False, **options).train()
        images = torch.empty(2, 3, *shape)
    record = OpRecord()
    with fused_attention_on_meta(), record:
        sum(out.sum() for out in model(images)).backward()
    return record


@pytest.mark.parametrize('family', list(STRUCTURE_MODELS))
def test_ops_do_not_grow_with_tokens_and_no_token_by_token_tensor(family):
    """2 × 800 × 1344 (4,200 patch tokens) against 2 × 640 × 832 (2,080): no more ops (no
    loop over query blocks; windows crop one side less where it needs no padding), and no
    tensor beyond the folded queries, batch × heads × tokens × their width (talking heads:
    every head's width and, in the ViTDet layout's global blocks, rows + columns of relative
    positions, padded to a multiple of 8), the FFN's hidden
    tokens or XCiT's conv stem's first map, whichever is larger."""
    small, large = (record_training_step(family, shape) for shape in ((640, 832), (800, 1344)))
    assert large.ops <= small.ops
    if 'vitdet' not in family:
        assert large.ops == small.ops
    batch, heads, dims = 2, 4, 192
    tokens = 50 * 84 + (family in ('vit', 'convit'))  # a class token in the trunk
    terms = 50 + 84 if 'vitdet' in family else 0
    width = -(-(dims + terms) // 8) * 8 if family.startswith('cait') else dims // heads
    bound = max(batch * heads * tokens * width, batch * tokens * 4 * dims,
                batch * 400 * 672 * dims // 8 if family == 'xcit' else 0)
    assert large.largest <= bound
    assert large.largest < batch * tokens * tokens  # far from any N × N map


def test_cpu_operator_walks_its_blocks_in_one_op_at_any_token_count(monkeypatch):
    """A talking-heads layer's training step on CPU: 4 and 16 row blocks per image take as
    many ops, and no op creates more than the qkv projection's output."""
    monkeypatch.setattr(talking_heads_cpu, 'BLOCK_ELEMENTS', 1)
    monkeypatch.setattr(talking_heads_cpu, 'BLOCK_ROWS', 16)
    torch.manual_seed(0)
    layer = MultiheadSelfAttention(48, 4, talking_heads=True)
    records = {}
    for tokens in (64, 256):
        x = torch.randn(2, tokens, 48, requires_grad=True)
        layer.zero_grad(set_to_none=True)
        records[tokens] = record = OpRecord()
        with forced_path(layer, 'blocks'), record:
            layer(x).square().sum().backward()
        assert record.largest <= 2 * tokens * 3 * 48
    assert len(list(talking_heads_cpu._blocks(2, 4, 256, 256))) == 4 * \
        len(list(talking_heads_cpu._blocks(2, 4, 64, 64))) == 32
    assert records[64].ops == records[256].ops
