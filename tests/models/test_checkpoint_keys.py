"""A family's key table is read both ways: forward on load (timm's and other layouts' keys to
ours), backward on export (ours to timm's), from one declaration of each rename."""
import pytest
import torch

from vitdense.models import CaiT, ConViT, ViT, XCiT
from vitdense.models.backbones.checkpoint_keys import Alias, KeyTable, Rename, TensorRule

from common import TINY_ARCH, TINY_CONVIT_ARCH


def test_a_rename_is_read_forward_and_backward_with_its_placeholders():
    gamma = Rename('.gamma_{n:1|2}$', '.ls{n}.gamma$')
    assert gamma.to_ours('blocks.11.gamma_2') == 'blocks.11.ls2.gamma'
    assert gamma.to_timm('blocks.11.ls2.gamma') == 'blocks.11.gamma_2'
    assert gamma.to_ours('blocks.0.gamma_3') == 'blocks.0.gamma_3'  # not one of its words
    norm = Alias('^blocks.{i}.ln{n:1|2}.', '^blocks.{i}.norm{n}.')
    assert norm.to_ours('blocks.10.ln2.bias') == 'blocks.10.norm2.bias'
    assert norm.to_ours('blocksX10.ln2.bias') == 'blocksX10.ln2.bias'  # a dot is a dot
    assert norm.to_ours('layers.blocks.1.ln1.weight') == 'layers.blocks.1.ln1.weight'  # ^


def test_an_alias_may_drop_a_placeholder_a_rename_must_read_back():
    """Many keys to one is a load-only alias; a rename's ours must tell its keys apart."""
    merged = Alias('.attn.{kind:q|v}_bias$', '.attn.qkv.bias$')
    assert merged.to_ours('blocks.0.attn.v_bias') == 'blocks.0.attn.qkv.bias'
    with pytest.raises(ValueError, match='cannot be read backward'):
        Rename('.attn.{kind:q|v}_bias$', '.attn.qkv.bias$')


@pytest.mark.parametrize('theirs, ours, error', [
    ('^blocks.{i}.', '^layers.{j}.', "a placeholder of '\\^layers.{j}.' is not in"),
    ('.lin{n:1|2}.', '.fc{n:1|3}.', "placeholder 'n' is declared with other words"),
])
def test_templates_whose_placeholders_do_not_correspond_are_refused(theirs, ours, error):
    with pytest.raises(ValueError, match=error):
        Alias(theirs, ours)


def test_the_export_reads_the_renames_backward_and_skips_aliases():
    table = CaiT.checkpoint_layout.table()
    assert table.key_to_timm('cls_blocks.1.ls2.gamma') == 'blocks_token_only.1.gamma_2'
    assert table.key_to_timm('blocks.0.attn.mix_logits.weight') == 'blocks.0.attn.proj_l.weight'
    assert table.key_to_timm('pos_embed.weight') == 'pos_embed'
    xcit = XCiT.checkpoint_layout.table()  # pos_embeder is the official release's alone: an alias
    assert xcit.key_to_ours('pos_embeder.token_projection.weight') == \
        'pos_embed.token_projection.weight'
    assert xcit.key_to_timm('pos_embed.token_projection.weight') == \
        'pos_embed.token_projection.weight'
    assert xcit.key_to_timm('blocks.2.ls_lpi.gamma') == 'blocks.2.gamma3'


@pytest.mark.parametrize('family, arch', [(ViT, TINY_ARCH), (CaiT, TINY_ARCH),
                                          (XCiT, TINY_ARCH), (ConViT, TINY_CONVIT_ARCH)])
def test_every_key_of_a_family_comes_back_from_timms_name(family, arch):
    with torch.device('meta'):
        keys = family(arch, out_type='cls_token').state_dict().keys()
    table = family.checkpoint_layout.table()
    assert [table.key_to_ours(table.key_to_timm(key)) for key in keys] == list(keys)


def test_tensor_rules_split_in_reverse_order_and_load_only_ones_are_passed_over():
    calls = []

    def rule(name: str):
        return lambda state_dict: calls.append(name) or state_dict

    table = KeyTable(tensors=(TensorRule(rule('merge a'), rule('split a')),
                              TensorRule(rule('merge b'), None),
                              TensorRule(rule('merge c'), rule('split c'))))
    table.to_ours({})
    table.to_timm({})
    assert calls == ['merge a', 'merge b', 'merge c', 'split c', 'split a']
