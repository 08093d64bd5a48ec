"""The tiny architecture the tests build every family at: 32 channels, 4 blocks, 2 heads
(ConViT with one gated block), small enough for a CPU test yet with every layer kind.
Importable as ``tiny_models``: pytest puts ``tests/``, the folder of ``conftest.py``, on the
module path."""
TINY_ARCH = dict(embed_dims=32, num_layers=4, num_heads=2)
TINY_BACKBONES = {
    'vit': dict(type='vitdense.ViT', arch=TINY_ARCH),
    'cait': dict(type='vitdense.CaiT', arch=TINY_ARCH),
    'xcit': dict(type='vitdense.XCiT', arch=TINY_ARCH),
    'convit': dict(type='vitdense.ConViT', arch=dict(TINY_ARCH, num_local_layers=1)),
}
