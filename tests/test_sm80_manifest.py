"""sm80 (CUTLASS 2.x) manifests: validation with file:line:key errors, expansion, rendering, bindings.

Everything here runs on the CPU in well under a second: manifests are written to tmp_path, loaded,
expanded and rendered through the Jinja templates; nothing is compiled.
"""

from __future__ import annotations

import re

import pytest

from gemmgen import settings
from gemmgen.errors import ManifestError
from gemmgen.families.w8a8 import sm80_rules
from gemmgen.generator.expand import expand
from gemmgen.families.w8a8.configs import SM80_SWIZZLES, Sm80TileConfig
from gemmgen.families.w8a8.schema import CONFIG_KEYS, config_fields
from gemmgen.generator.manifest import load_manifest
from gemmgen.generator.render import render_bindings, render_kernel_sources

# A small valid sm80 manifest in block style: every key on its own line, so a test can assert the
# exact line a ManifestError points at. The `large` config's lines are unique snippets to edit.
SM80_MANIFEST = """\
library: demo80
arch: sm80
kernels_per_file: 4
families:
  - name: int8
    op: scaled_mm
    dtypes:
      - a: int8
        d: [bf16, fp16]
    epilogues: [ScaledEpilogue, ScaledEpilogueBias]
    configs:
      - name: small
        tile: [64, 64, 64]
        warp: [32, 32, 64]
        stages: 4
      - name: large
        tile: [128, 128, 64]
        warp: [64, 64, 64]
        stages: 5
        swizzle: 2
    dispatch:
      - when: "m <= 64"
        use: small
      - when: "true"
        use: large
"""

SM80_KEYS_MESSAGE = r"allowed keys: instruction, name, split_k, stages, swizzle, tile, warp"
TERSE_RE = re.compile(r"^t\d+x\d+x\d+_w\d+x\d+x\d+_s\d+_(sw[1248]|streamk)(_sk(ser|par))?$")


@pytest.fixture
def sm80(case):
    """conftest's ManifestCase (edit by unique replacement, find lines), holding SM80_MANIFEST."""
    case.text = SM80_MANIFEST
    return case


@pytest.fixture(scope="module")
def default_sm80_path():
    paths = [p for p in settings.default_manifests() if p.name == "w8a8_sm80.yaml"]
    assert paths, f"w8a8_sm80.yaml not among {settings.default_manifests()}"
    return paths[0]


def assert_error(case, *, key: str, needle: str | None, match: str,
                 line: int | None = None) -> ManifestError:
    """Load + expand `case`; assert a ManifestError in its file, at the line of `needle`, for `key`."""
    path = case.write()
    with pytest.raises(ManifestError, match=match) as info:
        expand(load_manifest(path))
    err = info.value
    expected_line = line if line is not None else case.line(needle)
    assert err.file == str(path), str(err)
    assert err.key == key, str(err)
    assert err.line == expected_line, str(err)
    assert str(err).startswith(f"{path}:{expected_line}: {key}: "), str(err)
    assert err.detail and err.detail in str(err)
    return err


def _with_instruction(shape: str) -> list[tuple[str, str]]:
    return [("        warp: [64, 64, 64]\n", f"        warp: [64, 64, 64]\n        instruction: {shape}\n")]


def _add_to_large(line: str) -> list[tuple[str, str]]:
    return [("        swizzle: 2\n", f"        swizzle: 2\n        {line}\n")]


# (id, [(old, new), ...], key, needle of the offending line, message regex)
CASES = [
    # ---- warp must divide the threadblock tile, in each of M, N, K
    ("warp-m-not-dividing-tile", [("warp: [64, 64, 64]", "warp: [48, 64, 64]")],
     "warp", "warp: [48, 64, 64]", r"warp M \(48\) must divide the threadblock tile M \(128\)"),
    ("warp-n-not-dividing-tile", [("warp: [64, 64, 64]", "warp: [64, 48, 64]")],
     "warp", "warp: [64, 48, 64]", r"warp N \(48\) must divide the threadblock tile N \(128\)"),
    ("warp-k-not-dividing-tile", [("warp: [64, 64, 64]", "warp: [64, 64, 128]")],
     "warp", "warp: [64, 64, 128]", r"warp K \(128\) must divide the threadblock tile K \(64\)"),
    ("warp-zero", [("warp: [64, 64, 64]", "warp: [0, 64, 64]")],
     "warp", "warp: [0, 64, 64]", r"warp M \(0\) must divide the threadblock tile M \(128\)"),
    ("warp-not-a-triple", [("warp: [64, 64, 64]", "warp: [64, 64]")],
     "warp", "warp: [64, 64]", r"expected three integers \[M, N, K\], got \[64, 64\]"),
    # ---- warp must be a multiple of the MMA instruction (16x8x32 for int8)
    ("warp-m-not-multiple-of-instruction", [("warp: [64, 64, 64]", "warp: [8, 64, 64]")],
     "warp", "warp: [8, 64, 64]", r"warp tile 8x64x64 must be a multiple of the instruction 16x8x32"),
    ("warp-k-not-multiple-of-instruction", [("warp: [64, 64, 64]", "warp: [64, 64, 16]")],
     "warp", "warp: [64, 64, 16]", r"warp tile 64x64x16 must be a multiple of the instruction 16x8x32"),
    # ---- instruction shape
    ("instruction-16x8x16", _with_instruction("[16, 8, 16]"),
     "instruction", "instruction: [16, 8, 16]", r"int8 tensor-core MMA on sm80 is 16x8x32; got 16x8x16"),
    ("instruction-8x8x32", _with_instruction("[8, 8, 32]"),
     "instruction", "instruction: [8, 8, 32]", r"int8 tensor-core MMA on sm80 is 16x8x32; got 8x8x32"),
    # a zero in the instruction shape (found by the manifest fuzz: it was a ZeroDivisionError)
    ("instruction-0x8x32", _with_instruction("[0, 8, 32]"),
     "instruction", "instruction: [0, 8, 32]", r"int8 tensor-core MMA on sm80 is 16x8x32; got 0x8x32"),
    ("instruction-not-a-triple", _with_instruction("[16, 8]"),
     "instruction", "instruction: [16, 8]", r"expected three integers \[M, N, K\], got \[16, 8\]"),
    # ---- tile legality. A warp that divides the tile and is a multiple of the 16x8x32 instruction
    # makes tile M and K multiples of 16 and 32, so from a manifest a tile M of 24 or a tile K of 48
    # is reported at `warp` (the first problem found); the tile's own message shows for sizes that
    # are multiples but out of range (see also test_tile_rules_list_every_problem).
    ("tile-k-48", [("tile: [128, 128, 64]", "tile: [128, 128, 48]"),
                   ("warp: [64, 64, 64]", "warp: [64, 64, 48]")],
     "warp", "warp: [64, 64, 48]", r"warp tile 64x64x48 must be a multiple of the instruction 16x8x32"),
    ("tile-k-over-256", [("tile: [128, 128, 64]", "tile: [64, 64, 288]"),
                         ("warp: [64, 64, 64]", "warp: [32, 32, 96]")],
     "tile", "tile: [64, 64, 288]", r"tile K must be a multiple of 32 in \[32, 256\] for int8; got 288"),
    ("tile-m-24", [("tile: [128, 128, 64]", "tile: [24, 128, 64]"),
                   ("warp: [64, 64, 64]", "warp: [24, 64, 64]")],
     "warp", "warp: [24, 64, 64]", r"warp tile 24x64x64 must be a multiple of the instruction 16x8x32"),
    ("tile-m-over-256", [("tile: [128, 128, 64]", "tile: [272, 128, 64]"),
                         ("warp: [64, 64, 64]", "warp: [16, 64, 64]")],
     "tile", "tile: [272, 128, 64]", r"tile M and N must be multiples of 16 in \[16, 256\]; got 272x128"),
    ("tile-not-a-triple", [("tile: [128, 128, 64]", "tile: [128, 128]")],
     "tile", "tile: [128, 128]", r"expected three integers \[M, N, K\], got \[128, 128\]"),
    # ---- warps per threadblock
    ("too-many-warps", [("tile: [128, 128, 64]", "tile: [256, 256, 64]"),
                        ("warp: [64, 64, 64]", "warp: [16, 16, 64]")],
     "warp", "warp: [16, 16, 64]", r"256x256x64 / 16x16x64 gives 256 warps \(8192 threads\); at most 16"),
    ("32-warps", [("warp: [64, 64, 64]", "warp: [32, 16, 64]")],
     "warp", "warp: [32, 16, 64]", r"128x128x64 / 32x16x64 gives 32 warps \(1024 threads\); at most 16"),
    # ---- stages
    ("stages-over-smem-limit", [("tile: [128, 128, 64]", "tile: [128, 128, 128]"),
                                ("stages: 5", "stages: 10")],
     "stages", "stages: 10", r"10 stages of tile 128x128x128 need 10 x 32768 = 327680 bytes of shared "
                             r"memory, over the sm80 limit of 166912; use fewer stages or a smaller tile"),
    ("stages-one-over-smem-limit", [("tile: [128, 128, 64]", "tile: [128, 128, 128]"),
                                    ("stages: 5", "stages: 6")],
     "stages", "stages: 6", r"6 stages of tile 128x128x128 need 6 x 32768 = 196608 bytes"),
    ("stages-auto", [("stages: 5", "stages: auto")],
     "stages", "stages: auto", r"expected an integer in \[2, 10\] \(CUTLASS 2.x has no automatic "
                               r"stage count\), got 'auto'"),
    ("stages-1", [("stages: 5", "stages: 1")],
     "stages", "stages: 1", r"expected an integer in \[2, 10\] .*got 1$"),
    ("stages-11", [("stages: 5", "stages: 11")],
     "stages", "stages: 11", r"expected an integer in \[2, 10\] .*got 11$"),
    ("stages-bool", [("stages: 5", "stages: true")],
     "stages", "stages: true", r"expected an integer in \[2, 10\] .*got True$"),
    ("stages-missing", [("        stages: 5\n", "")],
     "stages", "- name: large", r"missing required key in configs\[1\]"),
    # ---- swizzle (compile time on sm80)
    ("swizzle-3", [("swizzle: 2", "swizzle: 3")],
     "swizzle", "swizzle: 3", r"unknown value 3; expected one of 1, 2, 4, 8, streamk"),
    ("swizzle-string-2", [("swizzle: 2", 'swizzle: "2"')],
     "swizzle", 'swizzle: "2"', r"unknown value '2'; expected one of 1, 2, 4, 8, streamk"),
    ("swizzle-stream-k-misspelt", [("swizzle: 2", "swizzle: stream_k")],
     "swizzle", "swizzle: stream_k", r"unknown value 'stream_k'"),
    # ---- sm90-only keys are unknown in an sm80 config
    ("sm90-key-cluster", _add_to_large("cluster: [1, 1, 1]"),
     "cluster", "cluster: [1, 1, 1]", r"unknown key in configs\[1\]; " + SM80_KEYS_MESSAGE),
    ("sm90-key-schedule", _add_to_large("schedule: pingpong"),
     "schedule", "schedule: pingpong", r"unknown key in configs\[1\]; " + SM80_KEYS_MESSAGE),
    ("sm90-key-tile-scheduler", _add_to_large("tile_scheduler: streamk"),
     "tile_scheduler", "tile_scheduler: streamk", r"unknown key in configs\[1\]"),
    ("sm90-key-raster", _add_to_large("raster: along_m"),
     "raster", "raster: along_m", r"unknown key in configs\[1\]"),
    ("sm90-key-swap-ab", _add_to_large("swap_ab: true"),
     "swap_ab", "swap_ab: true", r"unknown key in configs\[1\]"),
    ("sm90-key-epilogue-schedule", _add_to_large("epilogue_schedule: tma_warpspecialized"),
     "epilogue_schedule", "epilogue_schedule:", r"unknown key in configs\[1\]"),
    # ---- dtypes: sm80 builds int8 only
    ("e4m3-rejected", [("      - a: int8\n", "      - a: e4m3\n")],
     "dtypes", "    dtypes:", r"sm80 \(CUTLASS 2.x\) kernels take int8 operands; fp8 tensor cores "
                              r"need sm89 or sm90a"),
    ("e4m3-beside-int8-rejected", [("        d: [bf16, fp16]\n", "        d: [bf16, fp16]\n"
                                                                "      - {a: e4m3, d: bf16}\n")],
     "dtypes", "    dtypes:", r"sm80 \(CUTLASS 2.x\) kernels take int8 operands"),
    # ---- dispatch `use` by keys
    ("use-sm90-key-cluster", [("use: large", "use: {tile: [128, 128, 64], cluster: [1, 1, 1]}")],
     "cluster", "cluster: [1, 1, 1]}", r"unknown config key in dispatch `use`; allowed: instruction, "
                                       r"split_k, stages, swizzle, tile, warp"),
    ("use-sm90-key-schedule", [("use: large", "use: {schedule: pingpong}")],
     "schedule", "use: {schedule", r"unknown config key in dispatch `use`"),
    ("use-name-key", [("use: large", "use: {name: large}")],
     "name", "use: {name", r"unknown config key in dispatch `use`"),
    ("use-not-built", [("use: large", "use: {tile: [256, 128, 64]}")],
     "use", "use: {tile: [256", r"names a config that is not built in this family: "
                                r"\{'tile': \[256, 128, 64\]\}"),
    ("use-swizzle-not-built", [("use: large", "use: {tile: [128, 128, 64], swizzle: 4}")],
     "use", "swizzle: 4}", r"names a config that is not built in this family"),
    ("use-ambiguous", [("use: large", "use: {instruction: [16, 8, 32]}")],
     "use", "use: {instruction", r"matches 2 configs \(lines 12, 16\); add keys or use a config name"),
    ("use-missing-name", [("use: large", "use: huge")],
     "use", "use: huge", r"no config named 'huge' in this family; names: small, large"),
    # ---- duplicates: same compile-time config twice
    ("duplicate-config", [("        swizzle: 2\n", "        swizzle: 2\n"
                                                  "      - name: again\n"
                                                  "        tile: [128, 128, 64]\n"
                                                  "        warp: [64, 64, 64]\n"
                                                  "        instruction: [16, 8, 32]\n"
                                                  "        stages: 5\n"
                                                  "        swizzle: 2\n")],
     "configs", "- name: again", r"duplicate kernel: same compile-time config as line 16"),
]


@pytest.mark.parametrize("name, edits, key, needle, match", CASES, ids=[c[0] for c in CASES])
def test_sm80_manifest_error(sm80, name, edits, key, needle, match):
    for old, new in edits:
        sm80.replace(old, new)
    assert_error(sm80, key=key, needle=needle, match=match)


def test_base_manifest_is_valid(sm80):
    manifest = sm80.load()
    assert (manifest.library, manifest.arch, manifest.kernels_per_file) == ("demo80", "sm80", 4)
    (family,) = manifest.families
    small, large = family.configs
    assert small.config == Sm80TileConfig(tile=(64, 64, 64), warp=(32, 32, 64),
                                          instruction=(16, 8, 32), stages=4, swizzle=1)
    assert large.config == Sm80TileConfig(tile=(128, 128, 64), warp=(64, 64, 64),
                                          instruction=(16, 8, 32), stages=5, swizzle=2)
    assert all(type(v) is int for c in (small, large) for v in c.config.tile + c.config.warp
               + c.config.instruction)
    assert [c.line for c in family.configs] == [sm80.line("- name: small"), sm80.line("- name: large")]
    assert [r.config_index for r in family.dispatch] == [0, 1]
    assert config_fields(large) == {"tile": [128, 128, 64], "warp": [64, 64, 64],
                                    "instruction": [16, 8, 32], "stages": 5, "swizzle": 2}
    kernels = expand(manifest)
    assert len(kernels) == 2 * 2 * 2  # configs x out dtypes x epilogues
    assert {k.config.terse for k in kernels} == {"t64x64x64_w32x32x64_s4_sw1",
                                                 "t128x128x64_w64x64x64_s5_sw2"}


def test_line_numbers_are_literal(sm80):
    """The helper's line arithmetic, pinned once against hand-counted lines of SM80_MANIFEST."""
    sm80.replace("warp: [64, 64, 64]", "warp: [48, 64, 64]")
    err = assert_error(sm80, key="warp", needle="warp: [48", match="warp M")
    assert err.line == 18
    assert str(err) == f"{sm80.path}:18: warp: warp M (48) must divide the threadblock tile M (128)"


def test_tile_rules_list_every_problem():
    """check_config reports the tile problems too, after the warp ones the manifest shows first."""
    def problems(tile, warp):
        return sm80_rules.check_config(Sm80TileConfig(tile, warp, (16, 8, 32), 3, 1), "int8")

    assert ("tile", "tile K must be a multiple of 32 in [32, 256] for int8; got 48") in \
        problems((128, 128, 48), (64, 64, 48))
    assert ("tile", "tile M and N must be multiples of 16 in [16, 256]; got 24x128") in \
        problems((24, 128, 64), (24, 64, 64))
    assert ("tile", "tile M and N must be multiples of 16 in [16, 256]; got 128x40") in \
        problems((128, 40, 64), (64, 40, 64))
    assert problems((128, 128, 64), (64, 64, 64)) == []
    assert problems((16, 64, 128), (16, 64, 64)) == []  # vLLM's sliced-K M16 config


@pytest.mark.parametrize("tile, stages, ok", [
    ("[128, 128, 128]", 5, True),    # 5 x 32768 = 163840 <= 166912
    ("[128, 128, 128]", 6, False),   # 196608
    ("[128, 128, 64]", 10, True),    # 10 x 16384 = 163840
    ("[64, 64, 64]", 2, True),
])
def test_stages_shared_memory_boundary(sm80, tile, stages, ok):
    sm80.replace("tile: [128, 128, 64]", f"tile: {tile}").replace("stages: 5", f"stages: {stages}")
    if ok:
        config = sm80.load().families[0].configs[1].config
        assert config.stages == stages
        assert sm80_rules.shared_memory_bytes(config) <= sm80_rules.SMEM_LIMIT_BYTES
    else:
        assert_error(sm80, key="stages", needle=f"stages: {stages}", match=r"bytes of shared memory")


def test_sixteen_warps_accepted(sm80):
    sm80.replace("warp: [64, 64, 64]", "warp: [32, 32, 64]")
    config = sm80.load().families[0].configs[1].config
    assert (config.tile[0] // config.warp[0]) * (config.tile[1] // config.warp[1]) == 16


def test_warp_count_includes_sliced_k(sm80):
    sm80.replace("tile: [128, 128, 64]", "tile: [128, 128, 128]")
    sm80.replace("warp: [64, 64, 64]", "warp: [32, 32, 32]").replace("stages: 5", "stages: 3")
    assert_error(sm80, key="warp", needle="warp: [32, 32, 32]", match=r"gives 64 warps \(2048 threads\); at most 16")


@pytest.mark.parametrize("swizzle", [1, 2, 4, 8, "streamk"])
def test_every_swizzle_accepted(sm80, swizzle):
    sm80.replace("swizzle: 2", f"swizzle: {swizzle}")
    config = sm80.load().families[0].configs[1].config
    assert config.swizzle == swizzle and type(config.swizzle) is type(swizzle)
    assert swizzle in SM80_SWIZZLES


def test_streamk_swizzle_names_the_kernel(sm80):
    sm80.replace("swizzle: 2", "swizzle: streamk")
    kernels = sm80.expand()
    large = [k for k in kernels if k.config.tile == (128, 128, 64)]
    assert len(large) == 4
    for kernel in large:
        assert kernel.config.terse == "t128x128x64_w64x64x64_s5_streamk"
        assert kernel.name.endswith("_t128x128x64_w64x64x64_s5_streamk")


def test_swizzle_is_compile_time(sm80):
    """Two configs that differ only in swizzle are two kernels (CUTLASS 2.x: a template argument)."""
    sm80.replace("        swizzle: 2\n", "        swizzle: 2\n"
                                          "      - name: large_sk\n"
                                          "        tile: [128, 128, 64]\n"
                                          "        warp: [64, 64, 64]\n"
                                          "        stages: 5\n"
                                          "        swizzle: streamk\n")
    kernels = sm80.expand()
    assert len(kernels) == len({k.name for k in kernels}) == 3 * 2 * 2
    assert {k.config.terse for k in kernels if k.config.tile == (128, 128, 64)} == {
        "t128x128x64_w64x64x64_s5_sw2", "t128x128x64_w64x64x64_s5_streamk"}


def test_sm80_duplicate_message_does_not_call_swizzle_runtime(sm80):
    sm80.replace("        swizzle: 2\n", "        swizzle: 2\n      - name: again\n"
                                          "        tile: [128, 128, 64]\n"
                                          "        warp: [64, 64, 64]\n"
                                          "        stages: 5\n        swizzle: 2\n")
    err = assert_error(sm80, key="configs", needle="- name: again", match="duplicate kernel")
    assert "run-time" not in err.detail


def test_explicit_default_instruction_accepted(sm80):
    sm80.replace("        warp: [64, 64, 64]\n", "        warp: [64, 64, 64]\n        instruction: [16, 8, 32]\n")
    config = sm80.load().families[0].configs[1].config
    assert config.instruction == (16, 8, 32) == sm80_rules.INSTRUCTION_FOR["int8"]


def test_use_by_keys_resolves(sm80):
    sm80.replace("use: small", "use: {tile: [64, 64, 64], warp: [32, 32, 64]}")
    sm80.replace("use: large", "use: {swizzle: 2, stages: 5}")
    assert [r.config_index for r in sm80.load().families[0].dispatch] == [0, 1]


def test_use_by_every_sm80_key(sm80):
    sm80.replace("use: large", "use: {tile: [128, 128, 64], warp: [64, 64, 64], "
                               "instruction: [16, 8, 32], stages: 5, swizzle: 2}")
    assert [r.config_index for r in sm80.load().families[0].dispatch] == [0, 1]
    assert CONFIG_KEYS["sm80"] - {"name"} == {"tile", "warp", "instruction", "stages", "swizzle", "split_k"}


def test_use_by_streamk_swizzle(sm80):
    sm80.replace("swizzle: 2", "swizzle: streamk").replace("use: large", "use: {swizzle: streamk}")
    assert [r.config_index for r in sm80.load().families[0].dispatch] == [0, 1]


def test_sm80_key_rejected_in_sm90_config(case):
    """The other direction: `warp` is unknown in an sm90a config."""
    case.replace("        stages: auto\n", "        stages: auto\n        warp: [64, 64, 64]\n")
    assert_error(case, key="warp", needle="warp: [64, 64, 64]",
                 match=r"unknown key in configs\[1\]; allowed keys: .*swap_ab")


def test_flow_style_errors_point_at_the_config_line(write_manifest):
    text = ("library: flow\narch: sm80\nfamilies:\n  - op: scaled_mm\n"
            "    dtypes: [{a: int8, d: bf16}]\n    epilogues: [ScaledEpilogue]\n    configs:\n"
            "      - {tile: [128, 128, 64], warp: [64, 64, 64], stages: auto}\n")
    path = write_manifest(text)
    with pytest.raises(ManifestError, match=r"no automatic stage count") as info:
        load_manifest(path)
    assert (info.value.file, info.value.line, info.value.key) == (str(path), 8, "stages")


# ---- the shipped sm80 manifest, rendering and bindings

def test_default_sm80_manifest_validates_and_expands(default_sm80_path):
    manifest = load_manifest(default_sm80_path)
    assert (manifest.library, manifest.arch) == ("w8a8_sm80", "sm80")
    (family,) = manifest.families
    assert family.name == "int8" and len(family.configs) == 6
    kernels = expand(manifest)
    assert len(kernels) == len({k.name for k in kernels}) == 6 * 2 * 4  # configs x d x epilogues
    for kernel in kernels:
        assert kernel.arch == "sm80" and kernel.a == "int8"
        assert kernel.name.startswith("sm80_scaled_mm_i8_")
        assert kernel.name.endswith("_" + kernel.config.terse)
        assert TERSE_RE.match(kernel.config.terse), kernel.config.terse
        assert isinstance(kernel.config, Sm80TileConfig)
        assert kernel.config.instruction == (16, 8, 32)
        assert kernel.origin is not None and kernel.origin.file == manifest.path
    assert {k.config.terse for k in kernels} == {
        "t16x64x128_w16x64x64_s5_sw1", "t32x64x128_w32x64x64_s5_sw1",
        "t64x128x128_w64x64x64_s5_sw1", "t128x128x64_w64x64x64_s5_sw2",
        "t64x128x128_w64x64x64_s5_sw1_skser", "t64x128x128_w64x64x64_s5_sw1_skpar"}
    assert [r.config_index for r in family.dispatch] == [0, 1, 2, 2, 3]


def _units(manifest, kernels):
    return [(u.name, u.source, tuple(k.name for k in u.kernels))
            for u in render_kernel_sources(manifest, kernels)]


def test_render_default_sm80_sources(default_sm80_path):
    manifest = load_manifest(default_sm80_path)
    kernels = expand(manifest)
    units = render_kernel_sources(manifest, kernels)
    assert _units(manifest, kernels) == _units(load_manifest(default_sm80_path), expand(manifest))
    assert sorted(k.name for u in units for k in u.kernels) == sorted(k.name for k in kernels)
    assert len({u.name for u in units}) == len(units) == 12  # 6 configs x 8 kernels / 4 per file
    for unit in units:
        assert unit.name.startswith("sm80_scaled_mm_int8_") and unit.name.endswith(".cu")
        src = unit.source
        assert '#include "gemmgen/w8a8/sm80_scaled_mm.hpp"' in src
        assert "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800" in src
        assert "sm90" not in src and "KernelTmaWarpSpecialized" not in src
        for kernel in unit.kernels:
            assert f"gemmgen_run_{kernel.name}(" in src
            assert f"gemmgen_workspace_{kernel.name}(" in src
            cfg = kernel.config
            shapes = ", ".join(f"cutlass::gemm::GemmShape<{', '.join(map(str, s))}>"
                               for s in (cfg.tile, cfg.warp))
            assert shapes in src
            assert "cutlass::gemm::GemmShape<16, 8, 32>, /*stages=*/5" in src
            assert f"GemmIdentityThreadblockSwizzle<{cfg.swizzle}>" in src
        assert src.count("gemmgen_run_") == len(unit.kernels)
    swizzle2 = [u for u in units if "_sw2" in u.name]
    assert len(swizzle2) == 2 and all("GemmIdentityThreadblockSwizzle<1>" not in u.source
                                      for u in swizzle2)


def test_render_streamk_source(sm80):
    sm80.replace("swizzle: 2", "swizzle: streamk")
    manifest = sm80.load()
    kernels = expand(manifest)
    units = render_kernel_sources(manifest, kernels)
    streamk = [u for u in units if "streamk" in u.name]
    assert len(streamk) == 1 and len(streamk[0].kernels) == 4
    src = streamk[0].source
    assert src.count("cutlass::gemm::threadblock::ThreadblockSwizzleStreamK,") == 4
    assert "GemmIdentityThreadblockSwizzle" not in src
    others = [u for u in units if u is not streamk[0]]
    assert others and all("ThreadblockSwizzleStreamK" not in u.source
                          and "GemmIdentityThreadblockSwizzle<1>" in u.source for u in others)
    assert _units(manifest, kernels) == _units(manifest, expand(sm80.load()))


@pytest.mark.parametrize("source", ["default", "streamk"])
def test_bindings_reconstruct_sm80_configs(sm80, default_sm80_path, source):
    if source == "default":
        manifest = load_manifest(default_sm80_path)
    else:
        manifest = sm80.replace("swizzle: 2", "swizzle: streamk").load()
    kernels = expand(manifest)
    text = render_bindings(manifest, kernels, "0" * 16, "lib.so")
    assert text == render_bindings(manifest, kernels, "0" * 16, "lib.so")
    namespace: dict = {}
    exec(text, namespace)
    assert (namespace["ARCH"], namespace["LIBRARY"]) == ("sm80", manifest.library)
    assert (namespace["FINGERPRINT"], namespace["SHARED_OBJECT"]) == ("0" * 16, "lib.so")
    rebuilt = namespace["KERNELS"]
    assert tuple(rebuilt) == tuple(kernels)
    for got, want in zip(rebuilt, kernels):
        assert type(got.config) is Sm80TileConfig and got.config == want.config
        assert type(got.config.swizzle) is type(want.config.swizzle)
        assert got.name == want.name and got.origin == want.origin
    names = {k.name for k in kernels}
    dispatch = namespace["DISPATCH"]
    assert len(dispatch) == len(manifest.families[0].combos)
    for rules in dispatch.values():
        assert [line for _, _, line in rules] == [r.line for r in manifest.families[0].dispatch]
        assert all(name in names for _, name, _ in rules)
        assert rules[-1][0] == "true"


def test_sm80_arch_flags():
    from gemmgen.build.toolchain import ARCH_FLAGS
    assert "-gencode=arch=compute_80,code=[sm_80,compute_80]" in ARCH_FLAGS["sm80"]
    assert not any("90a" in flag for flag in ARCH_FLAGS["sm80"])


SPLIT_K_MANIFEST = """\
library: split
arch: sm80
families:
  - name: int8
    op: scaled_mm
    dtypes: [{a: int8, d: bf16}]
    epilogues: [ScaledEpilogueBias]
    configs:
      - name: only
        tile: [64, 128, 128]
        warp: [64, 64, 64]
        stages: 4
        swizzle: SWIZZLE
        split_k: SPLIT
    dispatch:
      - {when: "true", use: only}
"""


@pytest.mark.parametrize("swizzle, split, key, message", [
    ("streamk", "{mode: parallel, slices: 4}", "split_k", "split-K and the stream-K swizzle"),
    ("1", "{mode: atomic, slices: 4}", "mode", "unknown value 'atomic'; expected one of serial, parallel"),
    ("1", "{mode: serial, slices: 1}", "slices", "expected an integer in [2, 64], got 1"),
    ("1", "{mode: serial, slices: 65}", "slices", "expected an integer in [2, 64], got 65"),
    ("1", "{mode: serial}", "slices", "missing required key"),
    ("1", "{mode: serial, slices: 2, order: 1}", "order", "unknown key in split_k"),
])
def test_split_k_validation(write_manifest, swizzle, split, key, message):
    text = SPLIT_K_MANIFEST.replace("SWIZZLE", swizzle).replace("SPLIT", split)
    path = write_manifest(text)
    with pytest.raises(ManifestError, match=re.escape(message)) as info:
        load_manifest(path)
    assert info.value.key == key
    assert info.value.file == str(path)
    assert info.value.line == 14  # the split_k line


@pytest.mark.parametrize("mode, fragment", [("serial", "_skser"), ("parallel", "_skpar")])
def test_split_k_config_is_named_and_rendered(write_manifest, mode, fragment):
    text = SPLIT_K_MANIFEST.replace("SWIZZLE", "2").replace("SPLIT", f"{{mode: {mode}, slices: 3}}")
    manifest = load_manifest(write_manifest(text))
    (kernel,) = expand(manifest)
    assert kernel.config.split_k == mode and kernel.knobs.split_k_slices == 3
    assert kernel.name.endswith("_sw2" + fragment)
    (unit,) = render_kernel_sources(manifest, [kernel])
    assert f"gemmgen::sm80::SplitK::k{mode.capitalize()}>" in unit.source
