"""benchmarks/triton_registers.py: talking heads' kernels compiled for sm_90a on this CPU
machine, read back by ptxas."""
import re

from benchmarks import triton_registers as tool

LINE = re.compile(r'^(\w+) +heads=2 width=16 dims=16 bfloat16 +blocks=(\d+)x(\d+) stages=\d+ '
                  r'registers=(\d+) spill_bytes=(\d+) shared_bytes=(\d+) atomics=(\d+)$')


def test_every_kernel_of_a_small_configuration_compiles_without_spills_or_atomics(capsys):
    tool.main(['--heads', '2', '--width', '16', '--dims', '16', '--dtypes', 'bfloat16'])
    lines = capsys.readouterr().out.splitlines()
    rows = [LINE.match(line) for line in lines]
    assert all(rows), lines
    assert {row[1] for row in rows} == {'lse', 'forward', 'delta', 'dk', 'dv', 'dq'}
    for row in rows:
        registers, spills, shared, atomics = map(int, row.groups()[3:])
        assert 0 < registers <= 255 and spills == 0 and shared > 0 and atomics == 0, row[0]


def test_atomic_instructions_are_found_in_ptx():
    ptx = ('\tld.global.b32 \t%r1, [%rd1];\n\t@%p3 red.global.add.f32 \t[%rd2], %r1;\n'
           '\tatom.global.add.f32 \t%r2, [%rd3], %r1;\n\t// red.shared in a comment\n')
    assert [m[1] for m in tool.ATOMICS.finditer(ptx)] == ['red', 'atom']
