"""Dense features as RGB: the first colour channel of a map that varies along one direction
is that variation, rescaled."""
import pytest
import torch

from vitdense.analysis import pca_rgb


def test_a_rank_one_map_is_its_pattern_in_the_first_channel():
    torch.manual_seed(0)
    pattern = torch.rand(5, 7)
    direction = torch.tensor([0.2, -0.9, 0.4, 0.1])
    feature_map = direction[:, None, None] * pattern + torch.randn(4, 1, 1)
    colours, explained = pca_rgb(feature_map)
    assert colours.shape == (5, 7, 3)
    # the largest loading (-0.9) is made positive: the channel is the negated pattern
    expected = (pattern.max() - pattern) / (pattern.max() - pattern.min())
    torch.testing.assert_close(colours[..., 0], expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(explained[0], torch.tensor(1.))
    assert explained[1:].sum() < 1e-6


def test_colours_span_zero_to_one_and_bad_shapes_are_named():
    colours, explained = pca_rgb(torch.randn(16, 6, 6))
    assert colours.amin().item() == 0 and colours.amax().item() == 1
    assert torch.all(explained[:-1] >= explained[1:])
    with pytest.raises(ValueError, match=r'expects a \(C, H, W\) map'):
        pca_rgb(torch.randn(16, 36))
    with pytest.raises(ValueError, match='at least 3 channels'):
        pca_rgb(torch.randn(2, 4, 4))


def test_a_map_of_fewer_than_three_pixels_has_black_channels():
    colours, explained = pca_rgb(torch.randn(8, 1, 2))
    assert colours.shape == (1, 2, 3)
    torch.testing.assert_close(colours[..., 1:], torch.zeros(1, 2, 2))
    torch.testing.assert_close(explained, torch.tensor([1., 0., 0.]))
