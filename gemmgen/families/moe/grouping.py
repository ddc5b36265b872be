"""Group-list handling of the MoE grouped GEMM: which rows of `x` belong to which expert.

The rows of x [M, K] are grouped by expert, contiguous and in expert order. A group list is an
int64 tensor [E] (E >= 1 experts) in one of two forms, chosen by `group_list_type`:

- "count":  group_list[i] = the number of rows of expert i (tokens per expert);
- "cumsum": group_list[i] = the end offset of expert i's rows (the inclusive prefix sum of the
  counts).

Expert i owns rows [starts[i], ends[i]); starts[0] = 0 and starts[i] = ends[i - 1]. Rows
[ends[-1], M) belong to no expert ("rows past the last group"): the op writes q = 0 and
q_scale = 0 there. A valid list has counts >= 0 (cumsum: 0 <= group_list[0] and non-decreasing)
and a total (cumsum: last entry) of at most M; an expert may be empty.

- `group_offsets` turns a list into (starts, ends) with torch ops only: the same arithmetic the
  device kernel will do, with no host synchronization unless asked to check the values.
- `check_group_list` is the one value check (it reads the list back to the host, a sync).
- `stack_weights` turns a stacked [E, ...] tensor or a list of E per-expert tensors into one
  stacked tensor (weights, weight scales, assist matrices).

Argument errors are ValueError "gemmgen.<function>: argument 'x': expected ...; got ...".
"""

from __future__ import annotations

from typing import Sequence, Union

import torch

from ...errors import argument_error, describe_argument

GROUP_LIST_TYPES = ("count", "cumsum")


_describe = describe_argument
_error = argument_error


def _check_metadata(where: str, group_list, group_list_type, m) -> None:
    """What can be checked without reading the list's values (no sync): type, dtype, rank, E,
    group_list_type, m."""
    if group_list_type not in GROUP_LIST_TYPES:
        raise _error(where, "group_list_type", "'count' or 'cumsum'", repr(group_list_type))
    if not isinstance(m, int) or isinstance(m, bool) or m < 0:
        raise _error(where, "m", "a non-negative int (the number of rows M of x)", _describe(m))
    if (not isinstance(group_list, torch.Tensor) or group_list.dtype != torch.int64
            or group_list.dim() != 1 or group_list.shape[0] < 1):
        raise _error(where, "group_list", "a 1-D torch.int64 tensor [E] with E >= 1 (one entry "
                     "per expert)", _describe(group_list))


def _check_values(where: str, group_list: torch.Tensor, group_list_type: str, m: int) -> None:
    values = group_list.tolist()            # the sync; Python ints: no overflow in the totals
    if group_list_type == "count":
        total = 0
        for i, v in enumerate(values):
            if v < 0:
                raise _error(where, "group_list", "non-negative counts (rows per expert, "
                             "group_list_type='count')", f"group_list[{i}] = {v}")
            total += v
            if total > m:
                raise _error(where, "group_list", f"counts summing to at most M={m} (the rows "
                             "of x)", f"a running total of {total} at group_list[{i}] = {v}")
    else:
        previous = 0
        for i, v in enumerate(values):
            if v < 0:
                raise _error(where, "group_list", "non-negative end offsets "
                             "(group_list_type='cumsum')", f"group_list[{i}] = {v}")
            if v < previous:
                raise _error(where, "group_list", "non-decreasing end offsets "
                             "(group_list_type='cumsum')",
                             f"group_list[{i}] = {v} < group_list[{i - 1}] = {previous}")
            if v > m:
                raise _error(where, "group_list", f"end offsets of at most M={m} (the rows of "
                             "x)", f"group_list[{i}] = {v}")
            previous = v


def _group_offsets(where: str, group_list, group_list_type, m, check: bool
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    _check_metadata(where, group_list, group_list_type, m)
    if check:
        _check_values(where, group_list, group_list_type, m)
    if group_list_type == "count":
        ends = torch.cumsum(group_list.clamp(0, m), dim=0).clamp_max(m)
    else:
        ends = torch.cummax(group_list.clamp(0, m), dim=0).values
    starts = torch.cat((ends.new_zeros(1), ends[:-1]))
    return starts, ends


def group_offsets(group_list: torch.Tensor, group_list_type: str, m: int, *,
                  check: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(starts, ends): int64 tensors [E] on group_list's device; expert i owns rows
    [starts[i], ends[i]) of x, and rows [ends[-1], m) belong to no expert.

    group_list: int64 [E] (E >= 1), counts or end offsets as `group_list_type` ("count" |
    "cumsum") says; m: the number of rows M of x.

    Computed with torch ops only (clamp, cumsum / cummax, cat): no .item(), no loop over the
    values, so with check=False there is no host synchronization (it works on meta tensors too)
    and the device kernel can do the same math. The type, dtype, rank and E of group_list, and
    group_list_type and m, are always checked (metadata only, no sync).

    check=True first calls `check_group_list` (a sync): a bad list raises ValueError naming its
    first bad entry. check=False does not look at the values; a bad list is then clamped so that
    nothing can index out of bounds, always giving 0 = starts[0] <= ends[0] = starts[1] <= ...
    <= ends[E-1] <= m:

        count:   ends = min(cumsum(clamp(group_list, 0, m)), m)
        cumsum:  ends = running max of clamp(group_list, 0, m)
        starts = [0, ends[0], ..., ends[E-2]]

    i.e. a negative count counts 0 rows, rows past M are cut off (the experts past M get none),
    and a decreasing end offset gives an empty expert. For a valid list this is the exact
    definition above, clamps or not.
    """
    return _group_offsets("group_offsets", group_list, group_list_type, m, check)


def check_group_list(group_list: torch.Tensor, group_list_type: str, m: int, *,
                     where: str = "check_group_list") -> None:
    """Raise ValueError unless `group_list` is a valid group list for x with m rows: a 1-D int64
    tensor [E], E >= 1, of counts >= 0 summing to at most m ("count"), or of end offsets
    0 <= group_list[0] <= group_list[1] <= ... <= m ("cumsum"). The message names the first bad
    entry (group_list[i] = v), prefixed "gemmgen.<where>". The only function here that reads the
    values back to the host (a device sync)."""
    _check_metadata(where, group_list, group_list_type, m)
    _check_values(where, group_list, group_list_type, m)


def _stack_weights(where: str, weight, argument: str) -> torch.Tensor:
    if isinstance(weight, torch.Tensor):
        if weight.dim() < 1:
            raise _error(where, argument, "a stacked tensor [E, ...] or a list of E tensors",
                         _describe(weight))
        return weight
    if not isinstance(weight, (list, tuple)) or not weight:
        raise _error(where, argument, "a stacked tensor [E, ...] or a non-empty list of E "
                     "tensors (one per expert)", _describe(weight))
    first = weight[0]
    if not isinstance(first, torch.Tensor):
        raise _error(where, f"{argument}[0]", "a torch.Tensor (one per expert)", _describe(first))
    for i, t in enumerate(weight[1:], start=1):
        if (not isinstance(t, torch.Tensor) or t.dtype != first.dtype or t.shape != first.shape
                or t.device != first.device):
            raise _error(where, f"{argument}[{i}]", f"a {first.dtype} tensor of shape "
                         f"{tuple(first.shape)} on {first.device} like {argument}[0]",
                         _describe(t))
    return torch.stack(list(weight))


def stack_weights(weight: Union[torch.Tensor, Sequence[torch.Tensor]], *,
                  argument: str = "weight") -> torch.Tensor:
    """One stacked tensor [E, ...] from a stacked tensor (returned as is, no copy) or from a
    non-empty list / tuple of E per-expert tensors of one dtype, shape and device (stacked:
    a new tensor). For weights ([K, N] each -> [E, K, N]) and, alike, for per-expert weight
    scales ([N] -> [E, N], [K/group, N] -> [E, K/group, N]) and assist matrices. Shapes are
    the caller's to check. `argument` is the name errors use; a bad list element is named by
    its index (e.g. argument 'weight[2]')."""
    return _stack_weights("stack_weights", weight, argument)
