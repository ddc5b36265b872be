"""GPU tests of the mixed-input family (`gemmgen.mixed_mm`): every built kernel, the dispatch
path over M, every weight type and group size, bias on/off, GPTQ/AWQ-imported weights, CUDA
graphs and torch.compile — each against `gemmgen.reference.mixed_mm` in float32 on fresh random
data, with the output poisoned (NaN) first so an unwritten element fails."""

from __future__ import annotations

import pytest
import torch

import gemmgen
import gemmgen.families.mixed.ops  # noqa: F401  (registers torch.ops.gemmgen.mixed_mm_out)
from gemmgen import reference
from gemmgen.bindings import launch
from gemmgen.families.mixed.configs import WEIGHT_TYPES_FOR_KERNEL as WEIGHT_TYPES_FOR
from gemmgen.families.mixed.packing import q_range

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def group_for(spec, group: int) -> int:
    """A test case's group size for a kernel: as written, or 32 for a kernel of the `_g32`
    schemes (group 32 is all they serve)."""
    return 32 if spec.group_k == 32 else group


def act_order_g_idx(k: int, group_size: int) -> torch.Tensor:
    """GPTQ desc_act's g_idx (int32 [K] on the GPU): groups numbered along a random
    quantization order of K, group_size features each."""
    g_idx = torch.empty(k, dtype=torch.int32, device="cuda")
    g_idx[torch.randperm(k, device="cuda")] = torch.arange(k, dtype=torch.int32, device="cuda") // group_size
    return g_idx


def random_packed(n: int, k: int, weight_type: str, group_size: int, dtype: torch.dtype,
                  scale_size: float | None = None, act_order: bool = False):
    """Full-range random logical weights, scales ~ 1/sqrt(K)-sized (or in [0.5, 1.5) ·
    `scale_size`), zeros for uint4; with `act_order`, groups from a random desc_act g_idx."""
    low, high = q_range(weight_type)
    q = torch.randint(low, high + 1, (n, k), dtype=torch.int32, device="cuda")
    groups = k // group_size
    scales = (torch.rand(n, groups, device="cuda") * 0.02 + 0.005 if scale_size is None
              else (torch.rand(n, groups, device="cuda") + 0.5) * scale_size).to(dtype)
    zeros = (torch.randint(0, 16, (n, groups), dtype=torch.int32, device="cuda")
             if weight_type == "uint4" else None)
    g_idx = act_order_g_idx(k, group_size) if act_order else None
    return gemmgen.pack_weights(q, scales, zeros, weight_type=weight_type, group_size=group_size,
                                g_idx=g_idx, arch="sm90a")


def check(out: torch.Tensor, a: torch.Tensor, packed, bias=None) -> None:
    """Every element written (no NaN left from the poison) and close to the float32 reference."""
    assert not out.isnan().any(), "unwritten output elements (NaN poison left)"
    ref = reference.mixed_mm(a, packed, bias)
    err = (out.float() - ref).norm() / ref.norm().clamp_min(1e-6)
    # bf16 output rounding is ~2^-9 relative; zero points are stored as -scale*(zero-8) in the
    # activation dtype (one more rounding); allow 1e-2 in the norm and 3e-2 per element.
    assert err < 1e-2, f"relative error {err:.2e}"
    torch.testing.assert_close(out.float(), ref, rtol=3e-2, atol=3e-2 * ref.abs().max().item())


def run(m: int, n: int, k: int, weight_type: str, group_size: int, dtype, *, bias: bool,
        kernel: str | None = None, act_order: bool = False):
    """One call against the reference; with `act_order`, a desc_act weight and activations
    that are a strided view (row stride K + 64), which the entry point's gather reads."""
    packed = random_packed(n, k, weight_type, group_size, dtype, act_order=act_order)
    a = torch.randn(m, k + 64 * act_order, device="cuda").to(dtype)[:, :k]
    b = torch.randn(n, device="cuda").to(dtype) if bias else None
    out = torch.full((m, n), float("nan"), dtype=dtype, device="cuda")
    gemmgen.mixed_mm(a, packed, b, out=out, kernel=kernel)
    check(out, a, packed, b)


# ------------------------------------------------------------------------- 1. every kernel

def test_every_built_kernel(built_mixed_kernel):
    """Each kernel, forced by name: every weight type it serves, group 64/128/per-channel (group
    32 for the `_g32` kernels), several M (incl. non-multiples of the tile), bias on and off."""
    spec = built_mixed_kernel.spec
    dtype = DTYPES[spec.a]
    for weight_type in WEIGHT_TYPES_FOR[(spec.w, spec.scheme)]:
        # (9, 264, 192, 64): N not a multiple of 16, three groups of one 64-K step each (a
        # direct kernel's K-splitting warps start mid-group or have no chunk at all; a 128-K
        # chunk ends past K). (5, 128, 576, 576): per channel over nine steps, an odd count.
        for m, n, k, group in ((1, 256, 512, 128), (37, 384, 1024, 64), (200, 512, 768, 768),
                               (9, 264, 192, 64), (5, 128, 576, 576)):
            group = group_for(spec, group)
            run(m, n, k, weight_type, group, dtype, bias=m % 2 == 0, kernel=built_mixed_kernel.name)
            run(m, n, k, weight_type, group, dtype, bias=m % 2 == 1, kernel=built_mixed_kernel.name)
        # act-order (the entry point gathers a's columns into its workspace first, a CUTLASS
        # stream-K kernel's own workspace after the copy): groups of 64 and 128; K 4096-8192
        # gives a direct kernel's warps ranges longer than its ring, 13 tokens two token tiles
        # and rows past M, N = 264 rows past N; 64 tokens x K 8192 and 256 x 4096 the staged
        # gather (gather_k.cuh's stages_rows)
        for m, n, k, group in ((1, 256, 512, 128), (37, 384, 1024, 64), (200, 512, 768, 128),
                               (13, 264, 4096, 128), (64, 136, 8192, 64), (256, 128, 4096, 128)):
            run(m, n, k, weight_type, group_for(spec, group), dtype, bias=m % 2 == 1,
                kernel=built_mixed_kernel.name, act_order=True)


def test_own_kernels_are_deterministic_and_stay_in_bounds(built_mixed_kernel):
    """The family's own kernels add their K split's partial sums in a fixed order (the direct
    kernel its warps', the wgmma kernel its cluster's CTAs'): two runs are bit-identical. K = 64
    (fewer chunks than warps; no split), M past several token blocks (the wgmma kernel splits K
    over an 8-CTA cluster there), and an output view inside a NaN-filled buffer: nothing outside
    the view is written."""
    spec = built_mixed_kernel.spec
    if not spec.config.is_own:
        pytest.skip("a CUTLASS kernel")
    dtype = DTYPES[spec.a]
    weight_type = WEIGHT_TYPES_FOR[(spec.w, spec.scheme)][0]
    for m, n, k, group in ((3, 136, 64, 64), (70, 1040, 2048, 128)):
        packed = random_packed(n, k, weight_type, group_for(spec, group), dtype)
        a = torch.randn(m, k, device="cuda").to(dtype)
        big = torch.full((m + 2, n + 8), float("nan"), dtype=dtype, device="cuda")
        out = big[1:m + 1, :n]
        gemmgen.mixed_mm(a, packed, out=out, kernel=built_mixed_kernel.name)
        check(out, a, packed)
        again = gemmgen.mixed_mm(a, packed, kernel=built_mixed_kernel.name)
        assert torch.equal(out, again), "two runs differ"
        outside = big.clone()
        outside[1:m + 1, :n] = 0
        assert outside.isnan().sum() == big.numel() - m * n, "wrote outside the output view"


def chain_weights(weight_type: str, width: int, dtype, act_order: bool = False,
                  group: int = 128) -> list:
    """Two [width, width] weights of `group` whose scales keep the activations' size step after
    step (1 / (std(q - zero) sqrt(K))), so a chain of calls stays finite in fp16."""
    low, high = q_range(weight_type)
    spread = (high - low + 1) / 12 ** 0.5 * (2 ** 0.5 if weight_type == "uint4" else 1.0)
    return [random_packed(width, width, weight_type, group, dtype, act_order=act_order,
                          scale_size=1.0 / (spread * width ** 0.5)) for _ in range(2)]


def test_own_kernels_chained_under_pdl(built_mixed_kernel):
    """Back-to-back calls as a model's layers make them, with programmatic dependent launch on
    and nothing else on the stream between them: each call reads the activations the call before
    wrote and writes over the activations the call before read (the family's kernels queue their
    weight copies before the PDL wait, their activation copies and stores after it). The same
    chain run call by call (PDL off, a sync and a fresh output each step, every step checked
    against the reference) must give the bit-identical result (the kernels are deterministic).
    Also with act-order weights: a gather kernel before each GEMM, in the same PDL chain."""
    spec = built_mixed_kernel.spec
    if not spec.config.is_own:
        pytest.skip("a CUTLASS kernel")
    dtype = DTYPES[spec.a]
    width, steps = 1024, 6
    before = launch.programmatic_dependent_launch()
    try:
        for weight_type, act_order in [(t, False) for t in WEIGHT_TYPES_FOR[(spec.w, spec.scheme)]] + \
                [(WEIGHT_TYPES_FOR[(spec.w, spec.scheme)][0], True)]:
            weights = chain_weights(weight_type, width, dtype, act_order, group_for(spec, 128))
            for m in (1, 37):
                x0 = torch.randn(m, width, device="cuda").to(dtype)
                # call by call: every step against the reference of its input
                launch.set_programmatic_dependent_launch(False)
                x = x0
                for i in range(steps):
                    out = torch.full((m, width), float("nan"), dtype=dtype, device="cuda")
                    gemmgen.mixed_mm(x, weights[i % 2], out=out, kernel=built_mixed_kernel.name)
                    torch.cuda.synchronize()
                    check(out, x, weights[i % 2])
                    x = out
                # back to back under PDL: buffer i % 2 -> buffer (i + 1) % 2
                launch.set_programmatic_dependent_launch(True)
                buffers = [x0.clone(), torch.full_like(x0, float("nan"))]
                torch.cuda.synchronize()
                for i in range(steps):
                    gemmgen.mixed_mm(buffers[i % 2], weights[i % 2], out=buffers[(i + 1) % 2],
                                     kernel=built_mixed_kernel.name)
                assert torch.equal(buffers[steps % 2], x), \
                    f"{weight_type} m={m} act_order={act_order}: the chain under PDL differs from " \
                    "the call-by-call chain"
    finally:
        launch.set_programmatic_dependent_launch(before)


# ------------------------------------------------------------------------- 2. dispatch path

@pytest.mark.parametrize("group", [128, 32])
@pytest.mark.parametrize("weight_type", ["uint4b8", "uint4", "int8"])
@pytest.mark.parametrize("dtype_name", list(DTYPES))
def test_dispatch_over_m(weight_type, dtype_name, group):
    """The kernel dispatch picks, M from 1 to 4096 including non-powers of two; group 128 and
    group 32 (the `_g32` kernels' own dispatch class)."""
    dtype = DTYPES[dtype_name]
    packed = random_packed(1024, 2048, weight_type, group, dtype)
    for m in (1, 2, 5, 16, 17, 31, 64, 100, 255, 512, 1000, 4096):
        a = torch.randn(m, 2048, device="cuda").to(dtype)
        out = torch.full((m, 1024), float("nan"), dtype=dtype, device="cuda")
        gemmgen.mixed_mm(a, packed, out=out)
        check(out, a, packed)


def test_every_tuned_table_choice():
    """Every distinct (kernel, knobs) the GPU's own tuned table picks (wgmma K splits and CUTLASS
    raster/swizzle settings among them), run through dispatch in its bucket (at its largest M, the
    last bucket just above the one before) on the smallest listed shape that picks it, in bf16
    (measured) and fp16 (the same config's fp16 kernel and knobs, the family's stand-in class),
    against the reference; dispatch must say the table chose."""
    from gemmgen import dispatch
    from gemmgen.bindings.library import libraries
    from gemmgen.families.mixed.configs import G32_GROUP, scheme_group_k
    library = next((lib for lib in libraries() if lib.name == "mixed"), None)
    gpu = dispatch.gpu_identity()
    table = library.table_for(gpu)[0] if library is not None else None
    if table is None or tuple(table.gpu) != tuple(gpu) or (table.fit is not None and table.fit.dropped):
        pytest.skip("no mixed library with this GPU's own tuned table whose buckets all fit its kernels")
    ran = 0
    for key, ctable in sorted(table.classes.items()):
        _, measured_a, w, scheme = key
        plain = WEIGHT_TYPES_FOR[(w, scheme)][0]  # int4, uint4 or int8; GPTQ's uint4b8 for int4
        weight_type = "uint4b8" if plain == "int4" else plain
        g32 = scheme_group_k(scheme) == G32_GROUP
        seen = set()
        for shape in sorted(ctable.shapes, key=lambda s: s.n * s.k):
            group = G32_GROUP if g32 else 128 if weight_type != "int8" else shape.k
            packed = {}  # per activation dtype, packed once a shape
            m_low = 1
            for bucket in shape.buckets:
                m = bucket.m_max if bucket.m_max <= 1024 else m_low  # the 4096 bucket at its bottom
                m_low = bucket.m_max + 1
                pick = (bucket.kernel, bucket.knobs)
                if pick in seen or bucket.dropped:
                    continue
                seen.add(pick)
                measured = library.kernels[bucket.kernel]
                for name, dtype in DTYPES.items():
                    choice = dispatch.choose("mixed_mm", a_dtype=dtype, weight_type=weight_type,
                                             m=m, n=shape.n, k=shape.k, group_size=group)
                    assert choice.source == "table" and choice.knobs == bucket.knobs, choice.reason
                    assert choice.kernel.spec.origin == measured.spec.origin, choice.reason
                    assert choice.kernel.spec.a == name and (name != measured_a or choice.kernel is measured)
                    if name not in packed:
                        packed[name] = random_packed(shape.n, shape.k, weight_type, group, dtype)
                    x = torch.randn(m, shape.k, device="cuda").to(dtype)
                    out = torch.full((m, shape.n), float("nan"), dtype=dtype, device="cuda")
                    gemmgen.mixed_mm(x, packed[name], out=out)
                    check(out, x, packed[name])
                    ran += 1
    assert ran > 0


@pytest.mark.parametrize("n,k", [(4096, 4096), (6144, 4096), (4096, 14336), (14336, 4096)])
def test_llama_shapes(n, k):
    for m in (1, 16, 128):
        run(m, n, k, "uint4b8", 128, torch.bfloat16, bias=False)
    run(33, n, k, "uint4", 128, torch.float16, bias=True)
    run(8, n, k, "int8", k, torch.bfloat16, bias=False)  # per-channel int8


@pytest.mark.parametrize("group", [32, 64, 128, 256, "K"])
@pytest.mark.parametrize("weight_type", ["int4", "uint4b8", "uint4", "int8", "uint8b128"])
def test_every_scheme_and_group(weight_type, group):
    k = 1024
    run(24, 768, k, weight_type, k if group == "K" else group, torch.bfloat16, bias=True)


def test_strided_activations_and_output():
    """Row strides beyond K / N are honoured (16-byte aligned)."""
    packed = random_packed(512, 1024, "uint4", 128, torch.bfloat16)
    big = torch.randn(40, 1024 + 64, device="cuda").to(torch.bfloat16)
    a = big[:, :1024]
    out_big = torch.full((40, 512 + 16), float("nan"), dtype=torch.bfloat16, device="cuda")
    out = out_big[:, :512]
    gemmgen.mixed_mm(a, packed, out=out)
    check(out, a, packed)
    assert out_big[:, 512:].isnan().all(), "wrote outside the output view"


# ------------------------------------------------------------------------- 3. checkpoints

def _gptq_pack(values: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """Pack values in [0, 2**bits) along `dim` (0: rows, as GPTQ's qweight; 1: columns, as its
    qzeros) into int32 words, low bits first (an independent writer of the checkpoint format)."""
    per = 32 // bits
    v = values.to(torch.int64).cpu()
    if dim == 0:
        v = v.reshape(v.shape[0] // per, per, v.shape[1]).permute(0, 2, 1)
    else:
        v = v.reshape(v.shape[0], v.shape[1] // per, per)
    word = torch.zeros(v.shape[:2], dtype=torch.int64)
    for i in range(per):
        word |= v[..., i] << (bits * i)
    word = torch.where(word >= 2**31, word - 2**32, word)
    return word.to(torch.int32).cuda()


@pytest.mark.parametrize("group", [128, 32])
def test_gptq_import_runs_through_the_op(group):
    k, n = 1024, 512
    q = torch.randint(0, 16, (k, n), device="cuda")                # GPTQ's [K, N] orientation
    zeros = torch.randint(1, 16, (k // group, n), device="cuda")  # v1 stores zero - 1: 0 cannot be
    scales = (torch.rand(k // group, n, device="cuda") * 0.02 + 0.005).half()
    packed = gemmgen.PackedWeight.from_gptq(_gptq_pack(q, 4, 0), _gptq_pack(zeros - 1, 4, 1),
                                            scales, bits=4)
    a = torch.randn(19, k, device="cuda").half()
    out = torch.full((19, n), float("nan"), dtype=torch.float16, device="cuda")
    assert gemmgen.mixed_mm(a, packed, out=out) is out
    # the checkpoint's own math, from the unpacked GPTQ tensors (not through gemmgen's packer)
    ref = a.float() @ ((q - zeros.repeat_interleave(group, 0)).float()
                       * scales.float().repeat_interleave(group, 0))
    assert not out.isnan().any(), "unwritten output elements (NaN poison left)"
    assert ((out.float() - ref).norm() / ref.norm()).item() < 1e-2
    torch.testing.assert_close(out.float(), ref, rtol=3e-2, atol=3e-2 * ref.abs().max().item())
    check(out, a, packed)  # and the reference's reading of the imported weight


@pytest.mark.parametrize("group", [128, 32])
@pytest.mark.parametrize("zero_points", [False, True], ids=["uint4b8", "uint4"])
def test_gptq_act_order_runs_through_the_op(zero_points, group):
    """A desc_act checkpoint (g_idx from a random quantization order): the op gathers the
    activations into the stored K order; dispatch from decode to prefill, against the
    checkpoint's own dequantization in input-feature order (s[g_idx[k]] · (q − z[g_idx[k]]))
    (K 8192 from 64 tokens: the staged gather)."""
    n = 512
    for k, tokens in ((1024, (1, 7, 16, 64, 300)), (8192, (64, 300))):
        q = torch.randint(0, 16, (k, n), device="cuda")
        zeros = (torch.randint(1, 16, (k // group, n), device="cuda") if zero_points
                 else torch.full((k // group, n), 8, device="cuda"))
        scales = (torch.rand(k // group, n, device="cuda") * 0.02 + 0.005).half()
        g_idx = act_order_g_idx(k, group)
        packed = gemmgen.PackedWeight.from_gptq(_gptq_pack(q, 4, 0), _gptq_pack(zeros - 1, 4, 1),
                                                scales, g_idx, bits=4)
        assert packed.act_order and packed.weight_type == ("uint4" if zero_points else "uint4b8")
        g = g_idx.long()
        w = (q - zeros[g]).float() * scales.float()[g]              # [K, N], input-feature order
        for m in tokens:
            a = torch.randn(m, k, device="cuda").half()
            out = torch.full((m, n), float("nan"), dtype=torch.half, device="cuda")
            gemmgen.mixed_mm(a, packed, out=out)
            check(out, a, packed)
            ref = a.float() @ w
            torch.testing.assert_close(out.float(), ref, rtol=3e-2,
                                       atol=3e-2 * ref.abs().max().item())


# ------------------------------------------------------------------------- 4. graphs, compile

@pytest.mark.parametrize("act_order", [False, True], ids=["", "act_order"])
def test_cuda_graph_replay_with_new_inputs(act_order):
    """Captured once, replayed on new activations (an act-order weight's gather too)."""
    packed = random_packed(1024, 1024, "uint4b8", 128, torch.bfloat16, act_order=act_order)
    assert packed.act_order == act_order
    a = torch.randn(8, 1024, device="cuda").to(torch.bfloat16)
    out = torch.empty(8, 1024, dtype=torch.bfloat16, device="cuda")
    gemmgen.mixed_mm(a, packed, out=out)  # warm-up outside capture (dispatch, smem attribute)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gemmgen.mixed_mm(a, packed, out=out)
    for _ in range(3):
        a.copy_(torch.randn(8, 1024, device="cuda").to(torch.bfloat16))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        check(out, a, packed)


@pytest.mark.parametrize("act_order", [False, True], ids=["", "act_order"])
def test_torch_compile_fullgraph(act_order):
    packed = random_packed(512, 1024, "uint4", 128, torch.float16, act_order=act_order)
    bias = torch.randn(512, device="cuda").half()

    @torch.compile(fullgraph=True)
    def layer(x):
        return torch.relu(gemmgen.mixed_mm(x, packed, bias)) * 2

    a = torch.randn(24, 1024, device="cuda").half()
    out = layer(a)
    ref = torch.relu(reference.mixed_mm(a, packed, bias)) * 2
    torch.testing.assert_close(out.float(), ref, rtol=3e-2, atol=3e-2 * ref.abs().max().item())


@pytest.mark.parametrize("act_order", [False, True], ids=["", "act_order"])
def test_opcheck(act_order):
    packed = random_packed(256, 512, "uint4", 128, torch.bfloat16, act_order=act_order)
    a = torch.randn(16, 512, device="cuda").to(torch.bfloat16)
    out = torch.empty(16, 256, dtype=torch.bfloat16, device="cuda")
    torch.library.opcheck(torch.ops.gemmgen.mixed_mm_out,
                          (out, a, packed.qweight, packed.scales, packed.zeros, None,
                           packed.weight_type, packed.group_size, packed.n, packed.k, None,
                           packed.k_perm))


# ------------------------------------------------------------------------- 5. argument errors

def test_argument_errors_name_the_argument():
    packed = random_packed(256, 512, "uint4b8", 128, torch.bfloat16)
    a = torch.randn(4, 512, device="cuda").to(torch.bfloat16)
    with pytest.raises(ValueError, match="packed.scales.*activation dtype"):
        gemmgen.mixed_mm(a.half(), packed)
    with pytest.raises(ValueError, match="argument 'a'.*K = 512"):
        gemmgen.mixed_mm(a[:, :448], packed)
    with pytest.raises(ValueError, match="argument 'bias'"):
        gemmgen.mixed_mm(a, packed, torch.randn(255, device="cuda").to(torch.bfloat16))
    with pytest.raises(ValueError, match="argument 'kernel'"):
        gemmgen.mixed_mm(a, packed, kernel="no_such_kernel")
    with pytest.raises(ValueError, match="argument 'packed'"):
        gemmgen.mixed_mm(a, "not a packed weight")
