"""Short names of the element types gemmgen's manifests and dispatch speak of, from torch dtypes
or from those names themselves (no torch import needed)."""

from __future__ import annotations

_NAMES = {"int8": "int8", "float8_e4m3fn": "e4m3", "e4m3": "e4m3", "bfloat16": "bf16",
          "bf16": "bf16", "float16": "fp16", "fp16": "fp16", "half": "fp16"}


_seen: dict = {}  # dtype object -> name: the ops ask on every call (a dict hit, no str())


def dtype_name(dtype) -> str:
    """'int8' / 'e4m3' / 'bf16' / 'fp16' for a torch dtype or one of those strings."""
    name = _seen.get(dtype)
    if name is None:
        text = str(dtype).removeprefix("torch.")
        if text not in _NAMES:
            raise ValueError(f"unsupported dtype {dtype!r}; expected one of torch.int8, "
                             "torch.float8_e4m3fn, torch.bfloat16, torch.float16")
        name = _seen[dtype] = _NAMES[text]
    return name
