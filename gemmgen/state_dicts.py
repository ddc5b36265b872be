"""Saving and loading packed weights: the flat state-dict form that every family's packed-weight
class writes (`state_dict(prefix)`) and reads back (`from_state_dict(state, prefix)`).

Tensors sit under their field names, metadata as strings (what safetensors' header holds; torch.save
and `torch.load(weights_only=True)` keep them too), and a `gemmgen_format` entry names the class,
all under an optional prefix, so many layers' weights share one file:

    torch.save(packed.state_dict("layers.0.mlp."), path)
    packed = gemmgen.PackedWeight.from_state_dict(torch.load(path, weights_only=True), "layers.0.mlp.")

    state = packed.state_dict()                                   # with safetensors:
    tensors = {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}
    safetensors.torch.save_file(tensors, path, metadata={k: v for k, v in state.items() if isinstance(v, str)})

Reading names the missing or malformed entry, and refuses tensors that disagree with the
metadata and a layout this gemmgen does not read (PackedWeight through its constructor's checks).
Give each packed weight a prefix of its own: the field names (`qweight`, `scales`, `weight`,
`scale`) are common ones, and entries of the same name in a dict the state is merged into would
be overwritten.
"""

from __future__ import annotations

import re
from typing import Mapping, Optional

from .errors import argument_error, describe_argument

FORMAT_KEY = "gemmgen_format"
_INTEGER = re.compile(r"\s*[+-]?[0-9]+\s*")  # ASCII digits only (str.isdigit takes '²')


def entries(prefix: str, format_name: str, tensors: Mapping, **fields) -> dict:
    """A packed weight's state dict: its tensors (None ones left out) under `prefix` + their
    names, then the format entry and every metadata field as a string."""
    state = {prefix + key: t for key, t in tensors.items() if t is not None}
    state[prefix + FORMAT_KEY] = format_name
    state.update({prefix + key: str(value) for key, value in fields.items()})
    return state


class StateReader:
    """Reads one packed weight's entries from `state` under `prefix`; errors name the entry and
    come from `gemmgen.<where>` (argument 'state')."""

    def __init__(self, state, prefix: str, format_name: str, where: str):
        self.where = where
        if not isinstance(prefix, str):
            raise argument_error(where, "prefix", "a str", describe_argument(prefix))
        if not isinstance(state, Mapping):
            raise argument_error(where, "state", "a mapping of names to tensors and strings "
                                 "(from state_dict(), torch.load or safetensors)",
                                 describe_argument(state))
        self.state, self.prefix = state, prefix
        found = self._entry(FORMAT_KEY, f"the string {format_name!r}")
        if found != format_name:
            raise self.error(FORMAT_KEY, f"the string {format_name!r} (a state dict of "
                              f"gemmgen.{format_name}.state_dict)", describe_argument(found))

    def error(self, key: str, expected: str, got: str) -> ValueError:
        """The ValueError for entry `key` not being what was expected."""
        return argument_error(self.where, "state", f"entry '{self.prefix}{key}' to be {expected}",
                              got)

    def _entry(self, key: str, expected: str):
        name = self.prefix + key
        if name not in self.state:
            raise self.error(key, expected, "no such entry")
        return self.state[name]

    def tensor(self, key: str, optional: bool = False):
        """The tensor entry `key` (None when `optional` and absent)."""
        if optional and self.prefix + key not in self.state:
            return None
        value = self._entry(key, "a tensor")
        if not (hasattr(value, "dtype") and hasattr(value, "shape")):
            raise self.error(key, "a tensor", describe_argument(value))
        return value

    def integer(self, key: str) -> int:
        """The int entry `key`, written as a string (an int is taken as it is)."""
        value = self._entry(key, "an integer")
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str) and _INTEGER.fullmatch(value):
            return int(value)
        raise self.error(key, "an integer (as a string)", describe_argument(value))

    def string(self, key: str, choices: Optional[tuple[str, ...]] = None) -> str:
        value = self._entry(key, "a string")
        if not isinstance(value, str) or (choices is not None and value not in choices):
            expected = f"one of {', '.join(choices)}" if choices else "a string"
            raise self.error(key, expected, describe_argument(value))
        return value
