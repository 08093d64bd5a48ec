"""Checkpoint key tables: how the checkpoints of other layouts map onto a family's own keys,
as data that is read in both directions.

A family's :class:`~.checkpoint_layout.CheckpointLayout` holds one :class:`KeyTable`
(its ``keys``), read after :data:`SHARED_KEYS`:

- ``keys``, in order: a :class:`Rename` is a key of timm's layout and ours, read forward on
  load and backward on the export to timm; an :class:`Alias` is another layout's key
  (official releases, OpenMMLab), read on load only;
- ``tensors``: :class:`TensorRule` s for tensors split or stacked otherwise than ours, each
  declaring beside its merge the split that writes timm's layout back, or None where timm's
  model stores them as we do;
- keys left out on load: ``skipped`` (as saved: classifier heads) and ``left_out`` (after
  conversion: tensors of a source's pretraining or other tasks, logged).

Loading renames, then merges; the export splits, then renames back, each list in reverse:
the inverse of a load is derived, never written a second time.
"""
import re
from dataclasses import dataclass
from typing import Callable, Optional

import torch

#: a placeholder of a key template: ``{name}`` (an index: digits) or ``{name:a|b}`` (one of the
#: words given)
PLACEHOLDER = re.compile(r'\{(\w+)(?::([\w|]+))?\}')
#: what an index placeholder matches
INDEX = r'\d+'


def _placeholders(template: str) -> dict[str, str]:
    """A template's placeholders -> their words ('' for an index)."""
    return dict(PLACEHOLDER.findall(template))


def _compile(template: str, words: dict[str, str]) -> re.Pattern:
    """The regex matching ``template``: literal text, its anchors and named groups."""
    start, end = template.startswith('^'), template.endswith('$')
    body = template[int(start):len(template) - int(end)]
    pattern, position = [], 0
    for match in PLACEHOLDER.finditer(body):
        name = match.group(1)
        pattern += [re.escape(body[position:match.start()]),
                    f'(?P<{name}>{words.get(name) or INDEX})']
        position = match.end()
    pattern.append(re.escape(body[position:]))
    return re.compile(('^' if start else '') + ''.join(pattern) + ('$' if end else ''))


def _replacement(template: str) -> str:
    """``template`` as the replacement of ``re.sub``: anchors dropped, placeholders filled."""
    body = template.removeprefix('^').removesuffix('$').replace('\\', '\\\\')
    return PLACEHOLDER.sub(lambda match: rf'\g<{match.group(1)}>', body)


class Alias:
    """Another layout's key (``theirs``) for ours, read on load only: two templates of
    literal text (a ``.`` is a dot), ``^`` / ``$`` anchoring them at the key's start / end,
    and placeholders carried from ``theirs`` to ``ours``: ``{name}``, an index (digits), or
    ``{name:a|b}``, one of the words given, declared on either side."""

    def __init__(self, theirs: str, ours: str) -> None:
        self.theirs, self.ours = theirs, ours
        if not _placeholders(ours).keys() <= _placeholders(theirs).keys():
            raise ValueError(f'{self!r}: a placeholder of {ours!r} is not in {theirs!r}')
        #: each placeholder's words, from the side that declares them ('' for an index)
        self.words: dict[str, str] = {}
        for name, words in PLACEHOLDER.findall(theirs) + PLACEHOLDER.findall(ours):
            if words and self.words.get(name, words) not in (words, ''):
                raise ValueError(f'{self!r}: placeholder {name!r} is declared with other '
                                 f'words on each side')
            self.words[name] = words or self.words.get(name, '')
        self._forward = _compile(theirs, self.words), _replacement(ours)

    def __repr__(self) -> str:
        return f'{type(self).__name__}({self.theirs!r}, {self.ours!r})'

    def to_ours(self, key: str) -> str:
        pattern, replacement = self._forward
        return pattern.sub(replacement, key)


class Rename(Alias):
    """A key of timm's layout (``theirs``) and ours: the same templates as :class:`Alias`,
    read forward on load and backward on the export to timm, so both hold the same
    placeholders."""

    def __init__(self, theirs: str, ours: str) -> None:
        super().__init__(theirs, ours)
        if _placeholders(ours).keys() != _placeholders(theirs).keys():
            raise ValueError(f'{self!r}: the placeholders of the two templates differ, so it '
                             f'cannot be read backward')
        self._backward = _compile(ours, self.words), _replacement(theirs)

    def to_timm(self, key: str) -> str:
        pattern, replacement = self._backward
        return pattern.sub(replacement, key)


@dataclass(frozen=True)
class TensorRule:
    """Tensors a layout splits or stacks otherwise than ours: ``to_ours`` merges them on
    load (after the renames, in our key names); ``to_timm`` writes them as the family's timm
    model stores them, or is None where that model stores them as we do (the source's layout
    alone differs). Both take and return a state dict, which they may change in place."""
    to_ours: Callable[[dict], dict]
    to_timm: Optional[Callable[[dict], dict]]


def _either(first: Optional[str], second: Optional[str]) -> Optional[str]:
    """One regex matching what either matches (None: nothing)."""
    if first is None or second is None:
        return first if second is None else second
    return f'(?:{first})|(?:{second})'


@dataclass(frozen=True)
class KeyTable:
    """A family's checkpoint keys (see the module's docstring); ``+`` appends a table."""
    keys: tuple[Alias, ...] = ()
    tensors: tuple[TensorRule, ...] = ()
    #: keys as saved that no backbone has (classifier heads), skipped silently
    skipped: Optional[str] = None
    #: keys after conversion of a source's pretraining or other tasks, left out (logged)
    left_out: Optional[str] = None

    def __add__(self, other: 'KeyTable') -> 'KeyTable':
        return KeyTable(self.keys + other.keys, self.tensors + other.tensors,
                        _either(self.skipped, other.skipped),
                        _either(self.left_out, other.left_out))

    def key_to_ours(self, key: str) -> str:
        """``key`` after every rename and alias in turn."""
        for rule in self.keys:
            key = rule.to_ours(key)
        return key

    def key_to_timm(self, key: str) -> str:
        """Our ``key`` in timm's layout: the renames read backward, last first."""
        for rule in reversed(self.keys):
            if isinstance(rule, Rename):
                key = rule.to_timm(key)
        return key

    def to_ours(self, state_dict: dict) -> tuple[dict, list[str]]:
        """A state dict of any layout of the table in ours (keys already ours pass
        unchanged), and the sorted keys it left out (``left_out``)."""
        converted = {self.key_to_ours(key): value for key, value in state_dict.items()
                     if not (self.skipped and re.match(self.skipped, key))}
        for rule in self.tensors:
            converted = rule.to_ours(converted)
        left_out = sorted(key for key in converted
                          if self.left_out and re.search(self.left_out, key))
        return {k: v for k, v in converted.items() if k not in left_out}, left_out

    def to_timm(self, state_dict: dict) -> dict:
        """A state dict of ours in timm's layout: the tensor rules' splits, then the renames
        backward, each in reverse order."""
        state_dict = dict(state_dict)
        for rule in reversed(self.tensors):
            if rule.to_timm is not None:
                state_dict = rule.to_timm(state_dict)
        return {self.key_to_timm(key): value for key, value in state_dict.items()}


#: class attention: a query map and one map of keys and values (``kv``) here; timm writes
#: separate key and value maps, official releases one map of q, k and v
CLASS_ATTENTION = re.compile(r'^(cls_blocks\.\d+\.attn)\.(qkv|k|kv)\.(\w+)$')


def merge_class_attention(state_dict: dict) -> dict:
    """Class attention's q, k, v map, or its k and v maps, as our q and kv maps."""
    for key in list(state_dict):
        match = CLASS_ATTENTION.match(key)
        if not match or match.group(2) == 'kv' or key not in state_dict:
            continue
        attn, kind, param = match.groups()
        if kind == 'qkv':
            q, k, v = state_dict.pop(key).chunk(3)
            state_dict[f'{attn}.q.{param}'] = q
        else:
            k, v = state_dict.pop(key), state_dict.pop(f'{attn}.v.{param}')
        state_dict[f'{attn}.kv.{param}'] = torch.cat([k, v])
    return state_dict


def split_class_attention(state_dict: dict) -> dict:
    """Our kv maps of class attention as timm's k and v maps."""
    for key in list(state_dict):
        match = CLASS_ATTENTION.match(key)
        if match and match.group(2) == 'kv':
            attn, _, param = match.groups()
            state_dict[f'{attn}.k.{param}'], state_dict[f'{attn}.v.{param}'] = (
                state_dict.pop(key).chunk(2))
    return state_dict


#: every family's part, before its own: timm's position table, a bare tensor; the LayerScale
#: gammas of the families' official releases (gamma_1 / gamma1; timm's CaiT and XCiT write
#: them so: their tables say it); OpenMMLab's FFN (``ffn.layers``: a linear with its
#: activation, then a linear); class attention's maps; the classifier heads of every source
SHARED_KEYS = KeyTable(
    keys=(
        Rename('^pos_embed$', '^pos_embed.weight$'),
        Alias('.gamma_{n:1|2}$', '.ls{n}.gamma$'),
        Alias('.gamma{n:1|2}$', '.ls{n}.gamma$'),
        Alias('.ffn.layers.0.0.', '.mlp.fc1.'),
        Alias('.ffn.layers.1.', '.mlp.fc2.'),
    ),
    tensors=(TensorRule(merge_class_attention, split_class_attention),),
    skipped=r'^(head|head_dist|pre_logits)\.',
)
