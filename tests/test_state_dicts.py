"""Saving and loading packed weights (gemmgen/state_dicts.py): `PackedWeight` and `MoeWeight`
through torch.save / torch.load(weights_only=True) and through a real safetensors file, under
prefixes beside other layers' entries; every malformed entry refused by name."""

from __future__ import annotations

import pytest
import torch

import gemmgen
from gemmgen import reference
from gemmgen.families.mixed.packing import WEIGHT_TYPES, q_range
from gemmgen.families.moe.packing import LAYOUT_VERSION as MOE_LAYOUT_VERSION

BF16 = torch.bfloat16


def packed_weight(weight_type: str, act_order: bool, seed: int = 0) -> gemmgen.PackedWeight:
    """A random [N=48, K=256] weight, group 128 (uint4 with zero points)."""
    gen = torch.Generator().manual_seed(seed)
    n, k, group = 48, 256, 128
    low, high = q_range(weight_type)
    q = torch.randint(low, high + 1, (n, k), generator=gen)
    scales = (torch.rand(n, k // group, generator=gen) + 0.5).to(BF16)
    zeros = torch.randint(0, 16, (n, k // group), generator=gen) if weight_type == "uint4" else None
    g_idx = None
    if act_order:
        g_idx = torch.empty(k, dtype=torch.int64)
        g_idx[torch.randperm(k, generator=gen)] = torch.arange(k) // group
    return gemmgen.pack_weights(q, scales, zeros, weight_type=weight_type, group_size=group,
                                g_idx=g_idx)


def same_packed(a: gemmgen.PackedWeight, b: gemmgen.PackedWeight) -> None:
    for name in ("qweight", "scales", "zeros", "k_perm"):
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None), name
        if x is not None:
            assert x.dtype == y.dtype and torch.equal(x, y), name
    for name in ("weight_type", "group_size", "k", "n", "layout_version", "arch"):
        assert getattr(a, name) == getattr(b, name), name


@pytest.mark.parametrize("act_order", [False, True], ids=["", "act_order"])
@pytest.mark.parametrize("weight_type", WEIGHT_TYPES)
def test_packed_weight_through_torch_save(tmp_path, weight_type, act_order):
    """Two layers in one file under their prefixes (and an unrelated entry): each comes back
    equal, and computes what it computed (the reference reads it through unpack_weights)."""
    first, second = packed_weight(weight_type, act_order, 1), packed_weight(weight_type, act_order, 2)
    state = {**first.state_dict("layers.0.mlp."), **second.state_dict("layers.1.mlp."),
             "lm_head.weight": torch.randn(4, 4)}
    path = tmp_path / "model.pt"
    torch.save(state, path)
    loaded = torch.load(path, weights_only=True)
    again = gemmgen.PackedWeight.from_state_dict(loaded, "layers.1.mlp.")
    same_packed(second, again)
    same_packed(first, gemmgen.PackedWeight.from_state_dict(loaded, "layers.0.mlp."))
    assert again.act_order == act_order
    a = torch.randn(3, 256).to(BF16)
    assert torch.equal(reference.mixed_mm(a, again), reference.mixed_mm(a, second))


def test_packed_weight_through_safetensors(tmp_path):
    """The tensors in a safetensors file, the metadata in its header (strings)."""
    safetensors = pytest.importorskip("safetensors.torch")
    packed = packed_weight("uint4", act_order=True)
    state = packed.state_dict("model.layers.3.self_attn.o_proj.")
    tensors = {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}
    header = {k: v for k, v in state.items() if isinstance(v, str)}
    assert len(tensors) + len(header) == len(state)
    path = tmp_path / "model.safetensors"
    safetensors.save_file(tensors, str(path), metadata=header)
    with safetensors.safe_open(str(path), framework="pt") as f:
        loaded = {key: f.get_tensor(key) for key in f.keys()}
        loaded.update(f.metadata())
    same_packed(packed, gemmgen.PackedWeight.from_state_dict(loaded, "model.layers.3.self_attn.o_proj."))


def test_integers_may_be_ints():
    """A state dict whose metadata a user wrote as ints (not strings) reads the same."""
    packed = packed_weight("int8", act_order=False)
    state = {k: (int(v) if isinstance(v, str) and v.isdigit() else v)
             for k, v in packed.state_dict().items()}
    assert isinstance(state["group_size"], int)
    same_packed(packed, gemmgen.PackedWeight.from_state_dict(state))


def _broken(change) -> str:
    state = packed_weight("uint4", act_order=True).state_dict("p.")
    change(state)
    with pytest.raises(ValueError) as info:
        gemmgen.PackedWeight.from_state_dict(state, "p.")
    return str(info.value)


def test_malformed_entries_are_named():
    where = "gemmgen.PackedWeight.from_state_dict: argument 'state': expected entry "
    message = _broken(lambda s: s.pop("p.scales"))
    assert message.startswith(where + "'p.scales' to be a tensor; got no such entry")
    message = _broken(lambda s: s.update({"p.k": "two hundred"}))
    assert message.startswith(where + "'p.k' to be an integer (as a string); got a string 'two hundred'")
    message = _broken(lambda s: s.update({"p.weight_type": "int3"}))
    assert message.startswith(where + "'p.weight_type' to be one of int4, uint4b8")
    message = _broken(lambda s: s.update({"p.zeros": "none"}))
    assert message.startswith(where + "'p.zeros' to be a tensor; got a string 'none'")
    message = _broken(lambda s: s.update({"p.gemmgen_format": "MoeWeight"}))
    assert message.startswith(where + "'p.gemmgen_format' to be the string 'PackedWeight'")
    message = _broken(lambda s: s.pop("p.gemmgen_format"))
    assert "'p.gemmgen_format' to be the string 'PackedWeight'; got no such entry" in message


def test_entries_that_disagree_are_refused_by_the_weights_own_checks():
    """Metadata that does not match the tensors, or another layout version: the PackedWeight
    constructor's errors, naming the field."""
    assert "argument 'qweight'" in _broken(lambda s: s.update({"p.n": "64"}))
    assert "argument 'zeros'" in _broken(lambda s: s.update({"p.weight_type": "uint4b8"}))
    assert "argument 'k_perm'" in _broken(lambda s: s.update({"p.k_perm": s["p.k_perm"].long()}))
    assert "argument 'layout_version'" in _broken(lambda s: s.update({"p.layout_version": "1"}))
    # a missing optional entry: uint4 without zeros
    assert "argument 'zeros'" in _broken(lambda s: s.pop("p.zeros"))


def test_not_a_mapping_or_prefix():
    with pytest.raises(ValueError, match=r"argument 'state': expected a mapping of names"):
        gemmgen.PackedWeight.from_state_dict([1, 2])
    with pytest.raises(ValueError, match=r"argument 'prefix': expected a str; got an int 3"):
        gemmgen.PackedWeight.from_state_dict({}, 3)


# ------------------------------------------------------------------------------- MoeWeight

def moe_weight(bits: int, group: int = 0) -> gemmgen.MoeWeight:
    e, k, n = 3, 256, 64
    low, high = (-8, 7) if bits == 4 else (-128, 127)
    weight = torch.randint(low, high + 1, (e, k, n), dtype=torch.int8)
    scale_shape = (e, k // group, n) if group else (e, n)
    return gemmgen.pack_moe_weights(weight, torch.rand(scale_shape) + 0.5, weight_bits=bits)


@pytest.mark.parametrize("bits,group", [(8, 0), (4, 0), (4, 128)], ids=["a8w8", "a8w4", "a8w4_group"])
def test_moe_weight_through_torch_save(tmp_path, bits, group):
    packed = moe_weight(bits, group)
    path = tmp_path / "experts.pt"
    torch.save(packed.state_dict("layers.0.experts.w13."), path)
    again = gemmgen.MoeWeight.from_state_dict(torch.load(path, weights_only=True),
                                              "layers.0.experts.w13.")
    assert (again.bits, again.arch, again.layout_version) == (packed.bits, packed.arch,
                                                              packed.layout_version)
    assert torch.equal(again.weight, packed.weight) and torch.equal(again.scale, packed.scale)
    assert torch.equal(again.logical_weight(), packed.logical_weight())
    assert again.group_size == packed.group_size


def test_moe_weight_refuses_another_layout_and_bits():
    state = moe_weight(8).state_dict()
    state["layout_version"] = str(MOE_LAYOUT_VERSION - 1)
    with pytest.raises(ValueError, match=rf"entry 'layout_version' to be {MOE_LAYOUT_VERSION} "
                                         r"\(the layout this gemmgen reads: re-pack"):
        gemmgen.MoeWeight.from_state_dict(state)
    state = moe_weight(8).state_dict()
    state["bits"] = "2"
    with pytest.raises(ValueError, match=r"entry 'bits' to be 4 or 8; got 2"):
        gemmgen.MoeWeight.from_state_dict(state)
    with pytest.raises(ValueError, match=r"entry 'gemmgen_format' to be the string 'MoeWeight'"):
        gemmgen.MoeWeight.from_state_dict(packed_weight("int8", False).state_dict())


@pytest.mark.parametrize("change,entry", [
    (dict(bits="8"), "weight"),                                   # a uint8 int4 weight as 8-bit
    (dict(weight=lambda w: w[:, :, :64]), "weight"),              # not contiguous
    (dict(weight=lambda w: w[0]), "weight"),                      # 2-D
    (dict(scale=lambda s: s.double()), "scale"),
    (dict(scale=lambda s: s[:2]), "scale"),                       # E differs
    (dict(scale=lambda s: s[:, :, :32]), "scale"),                # N differs
    (dict(scale=lambda s: torch.cat([s, s[:, :1]], 1)), "scale"),  # 3 groups do not divide K=256
    (dict(scale=lambda s: s.to("meta")), "scale"),                # another device
    (dict(arch="sm80"), "arch"),
])
def test_moe_weight_entries_that_disagree_are_named(change, entry):
    """MoeWeight has no constructor checks: from_state_dict checks the tensors against bits and
    each other, naming the entry."""
    state = moe_weight(4, 128).state_dict("w.")
    for key, value in change.items():
        state["w." + key] = value(state["w." + key]) if callable(value) else value
    with pytest.raises(ValueError, match=rf"^gemmgen\.MoeWeight\.from_state_dict: argument 'state': "
                                         rf"expected entry 'w\.{entry}' to be "):
        gemmgen.MoeWeight.from_state_dict(state, "w.")


@pytest.mark.parametrize("text,expected", [(" 128 ", 128), ("+3", 3), ("-1", -1)])
def test_integer_entries(text, expected):
    from gemmgen.state_dicts import StateReader
    read = StateReader({"gemmgen_format": "X", "v": text}, "", "X", "test")
    assert read.integer("v") == expected


@pytest.mark.parametrize("text", ["--5", "\u00b2", "1.5", "", "12a"])
def test_malformed_integer_entries_are_named(text):
    from gemmgen.state_dicts import StateReader
    read = StateReader({"gemmgen_format": "X", "v": text}, "", "X", "test")
    with pytest.raises(ValueError, match=r"^gemmgen\.test: argument 'state': expected entry 'v' "
                                         r"to be an integer \(as a string\)"):
        read.integer("v")
