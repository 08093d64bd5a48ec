"""benchmarks/benchmark_segmentor_inference.py: an EoMT segmentor runs as trained (its masks
annealed away: one prediction, from the plain ViT) and the other config as built."""
from benchmarks import benchmark_segmentor_inference as tool
from vitdense.models.eomt import EoMT

EOMT = 'configs/vit/eomt_vit-d6-p8_demo-ade.py'
UPERNET = 'configs/vit/upernet_vit-d6-p8_demo-ade.py'


def test_the_table_compares_eomt_as_trained_with_another_segmentor(monkeypatch, capsys):
    annealed = []
    set_probabilities = EoMT.set_mask_probabilities

    def record(module, probabilities):
        annealed.append(list(probabilities))
        set_probabilities(module, probabilities)

    monkeypatch.setattr(EoMT, 'set_mask_probabilities', record)
    monkeypatch.setattr('sys.argv', ['tool', EOMT, UPERNET, '--img-size', '64',
                                     '--repeats', '1', '--threads', '1'])
    tool.main()
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith('| `')]
    assert [row.split('`')[1] for row in rows] == [EOMT, UPERNET]
    assert rows[0].endswith('| 1.00 |')
    assert annealed == [[0.0, 0.0]]


def test_no_weight_file_is_read():
    model = dict(backbone=dict(init_cfg=dict(type='Pretrained', checkpoint='x.pth'),
                               layers=[dict(init_cfg=dict(type='Kaiming'))]))
    assert tool.without_pretrained(model) == dict(
        backbone=dict(layers=[dict(init_cfg=dict(type='Kaiming'))]))
