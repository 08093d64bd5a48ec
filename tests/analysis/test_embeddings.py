"""Position-encoding similarity and patch-filter components against hand computations."""
import pytest
import torch

from vitdense.analysis import (filter_components, patch_embedding_filters, position_encodings,
                               position_similarity)
from vitdense.models import ViT, XCiT

from common import TINY_ARCH


def test_learned_table_without_the_class_token():
    model = ViT(TINY_ARCH, img_size=64)
    vectors, hw = position_encodings(model)
    assert hw == (4, 4)
    torch.testing.assert_close(vectors, model.pos_embed.weight[0, 1:])
    resampled, hw = position_encodings(model, (2, 6))
    assert hw == (2, 6) and resampled.shape == (12, 32)


def test_fourier_encoding_is_what_the_forward_adds():
    model = XCiT(TINY_ARCH, img_size=48)
    vectors, hw = position_encodings(model)
    added = model.pos_embed(torch.zeros(1, 9, 32), (3, 3))[0]
    assert hw == (3, 3)
    torch.testing.assert_close(vectors, added)


def test_similarity_of_orthogonal_and_repeated_vectors():
    similarity = position_similarity(torch.eye(6), (2, 3))
    torch.testing.assert_close(similarity.reshape(6, 6), torch.eye(6))
    # rows share a vector: every patch is identical to its row and orthogonal to the other
    rows = torch.tensor([[1., 0.]] * 3 + [[0., 2.]] * 3)
    tiles = position_similarity(rows, (2, 3))
    torch.testing.assert_close(tiles[0, 1], torch.tensor([[1., 1., 1.], [0., 0., 0.]]))
    with pytest.raises(ValueError, match='5 position vectors for a 2x3 grid'):
        position_similarity(torch.eye(5), (2, 3))


def test_components_of_filters_spanned_by_two_patterns():
    torch.manual_seed(0)
    patterns = torch.linalg.qr(torch.randn(12, 2)).Q.t()  # two orthonormal 3x2x2 filters
    scores = torch.randn(50, 2) * torch.tensor([3., 1.])
    filters = (scores @ patterns).view(50, 3, 2, 2)
    components, explained = filter_components(filters, 2)
    assert components.shape == (2, 3, 2, 2)
    centred = scores - scores.mean(0)
    variance = (centred ** 2).sum(0)
    # the patterns are uncorrelated only approximately in a sample: compare the subspace
    # and the total, exactly
    torch.testing.assert_close(explained.sum(), torch.tensor(1.))
    basis = components.flatten(1)
    torch.testing.assert_close(basis @ basis.t(), torch.eye(2), atol=1e-5, rtol=0)
    projector = basis.t() @ basis
    torch.testing.assert_close(projector @ patterns.t(), patterns.t(), atol=1e-5, rtol=0)
    assert explained[0] > variance.min() / variance.sum()
    with pytest.raises(ValueError, match=r'num_components must be in \[1, 12\]'):
        filter_components(filters, 13)


def test_filters_are_the_first_convolution_of_the_stem():
    vit = ViT(TINY_ARCH)
    torch.testing.assert_close(patch_embedding_filters(vit), vit.patch_embed.proj.weight)
    xcit = XCiT(TINY_ARCH)
    assert patch_embedding_filters(xcit).shape == (4, 3, 3, 3)  # 32 / 2**3 channels
