"""Merge the peft adapters (LoRA, DoRA, LoHa, LoKr) of a checkpoint trained with a backbone's
``peft`` option into the weights they adapt, for deployment.

OUT is a plain checkpoint that CONFIG without ``peft`` loads strictly (``tools/test.py``,
``tools/infer.py``, the exporters of ``tools/deployment/`` take it with that config). Before
writing, the merged model's backbone outputs are checked against the adapted model's (float32,
relative difference at most 1e-5). OUT is written atomically and never replaces a file::

    python tools/model_converters/merge_peft.py \\
        configs/vit/upernet_vit-d6-p8_lora_demo-ade.py work_dirs/lora/iter_700.pth merged.pth
"""
from __future__ import annotations

import argparse

from vitdense.analysis.complexity import load_config
from vitdense.deploy.merge import merge_peft_checkpoint


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('config', help='the config the checkpoint was trained with (with peft)')
    parser.add_argument('checkpoint', help='the checkpoint to merge')
    parser.add_argument('out', help='where to write the plain checkpoint (must not exist)')
    args = parser.parse_args()
    try:
        report = merge_peft_checkpoint(load_config(args.config), args.checkpoint, args.out)
    except (FileExistsError, ValueError) as err:
        raise SystemExit(str(err)) from None
    print(f'merged {report.merged_layers} adapted layers; wrote {report.tensors} tensors to '
          f'{args.out} (backbone outputs within {report.max_relative_difference:.1e} of the '
          f'adapted model\'s)')


if __name__ == '__main__':
    main()
