"""The `gemmgen` command: build (validate + render + compile + publish), validate, list, tune."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from . import settings
from .errors import GemmgenError


def _manifests(given: list[str]) -> list[Path]:
    paths = [Path(p) for p in given] or settings.default_manifests()
    if not paths:
        raise GemmgenError(f"no manifests given and none found in {settings.DEFAULT_MANIFEST_DIR}")
    return paths


def _cmd_build(args: argparse.Namespace) -> int:
    from .build.builder import build_manifest
    from .generator.expand import expand
    from .generator.manifest import load_manifest

    paths = _manifests(args.manifests)
    for path in paths:  # NOTES: validate every manifest before compiling any of them
        expand(load_manifest(path))
    root = settings.build_dir(args.build_dir)
    for path in paths:
        build_manifest(path, root, jobs=args.jobs,
                       allow_wgmma_serialization=args.allow_wgmma_serialization)
    if args.build_dir and not os.environ.get(settings.BUILD_DIR_VARIABLE):
        print(f"gemmgen: to use it from Python: export {settings.BUILD_DIR_VARIABLE}={root}")
    return 0


def _cmd_validate(args: argparse.Namespace) -> int:
    from .generator.expand import expand
    from .generator.manifest import load_manifest

    from .build.builder import tuned_table_text
    from .tuning.table import table_path_for

    for path in _manifests(args.manifests):
        kernels = expand(load_manifest(path))
        table = table_path_for(path)
        note = ""
        if table.exists():  # validated like `gemmgen build` does: file:line errors, staleness
            note = f"; tuned table {table.name}: " + ("OK" if tuned_table_text(path, kernels, print)
                                                       else "stale, not used")
        print(f"{path}: OK, {len(kernels)} kernels{note}")
        if args.verbose:
            for spec in kernels:
                print(f"  {spec.name}")
    return 0


def _cmd_list(args: argparse.Namespace) -> int:
    from .bindings.library import libraries

    for library in libraries():
        print(f"{library.name} ({library.arch}, {len(library.kernels)} kernels) at {library.directory}")
        for name in sorted(library.kernels):
            print(f"  {name}")
        if args.dispatch:
            table = library.tuned
            if table is not None:
                shapes = sum(len(c.shapes) for c in table.classes.values())
                print(f"  tuned table: {table.path} ({table.metadata['gpu']}, "
                      f"{table.metadata['sm_count']} SMs; {shapes} (class, N, K) entries)")
            for key, rules in sorted(library.dispatch.items()):
                print(f"  dispatch {' '.join(key)}:")
                for condition, name, line in rules:
                    print(f"    {condition.source:<28} -> {name}  (line {line})")
    return 0


def _cmd_tune(args: argparse.Namespace) -> int:
    from .tuning.shapes import DEFAULT_M_GRID, load_many, parse_m_grid, resolve_shapes_arg
    from .tuning.tune import TuneOptions, tune

    shapes = load_many(args.shapes)
    try:
        m_grid = parse_m_grid(args.m) if args.m else DEFAULT_M_GRID
    except ValueError as exc:
        raise GemmgenError(f"--m: {exc}") from None
    options = TuneOptions(
        shapes=shapes, m_grid=m_grid,
        library=args.library, dtypes=tuple(args.dtypes or ()), out_dtype=args.out_dtype,
        epilogue=args.epilogue, knob_top=args.knob_top, tolerance=args.tolerance, fresh=args.fresh,
        out=args.out, select=args.select, select_dir=args.select_dir, gpus=args.gpus,
        command="gemmgen " + " ".join(args.argv),
        shape_sources=[resolve_shapes_arg(s).name for s in args.shapes])
    tune(options)
    return 0


def _non_negative(kind):
    def parse(text: str):
        value = kind(text)
        if value < 0:
            raise argparse.ArgumentTypeError(f"expected a non-negative {kind.__name__}, got {text}")
        return value
    parse.__name__ = kind.__name__
    return parse


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gemmgen", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="validate, generate, compile and publish manifests "
                                         "(default: the shipped manifests)")
    build.add_argument("manifests", nargs="*", help="manifest YAML files")
    build.add_argument("--build-dir", help=f"output directory (default: ${settings.BUILD_DIR_VARIABLE} "
                                           f"or ~/.cache/gemmgen)")
    build.add_argument("-j", "--jobs", type=int, help="parallel nvcc jobs (default: cores, capped "
                                                      "at available memory / 4 GiB)")
    build.add_argument("--allow-wgmma-serialization", action="store_true",
                       help="downgrade ptxas warning C7510 (wgmma serialized) from error to warning")
    build.set_defaults(func=_cmd_build)
    validate = sub.add_parser("validate", help="validate and expand manifests; compile nothing")
    validate.add_argument("manifests", nargs="*")
    validate.add_argument("-v", "--verbose", action="store_true", help="list kernel names")
    validate.set_defaults(func=_cmd_validate)
    listing = sub.add_parser("list", help="list the built kernels")
    listing.add_argument("--dispatch", action="store_true", help="also print the dispatch rules")
    listing.set_defaults(func=_cmd_list)
    tuning = sub.add_parser("tune", help="measure every candidate kernel over weight shapes x an M "
                                         "grid on the GPU and write the tuned dispatch table")
    tuning.add_argument("--shapes", nargs="+", required=True,
                        help="shape files (paths, or names in gemmgen/manifests/shapes/, e.g. llama3_8b)")
    tuning.add_argument("--m", help="comma-separated M grid (default: 1..16384, powers of two and between)")
    tuning.add_argument("--library", help="library to tune (default: the one this GPU dispatches to)")
    tuning.add_argument("--dtypes", nargs="+", help="input dtypes, e.g. int8 e4m3 (default: all built)")
    tuning.add_argument("--out-dtype", default="bf16", choices=["bf16", "fp16"],
                        help="output dtype measured (the table serves the other through the same configs)")
    tuning.add_argument("--epilogue", default="ScaledEpilogueBias",
                        help="epilogue measured (others use the same configs' kernels)")
    tuning.add_argument("--knob-top", type=_non_negative(int), default=3,
                        help="try every run-time knob on this many fastest kernels per point")
    tuning.add_argument("--tolerance", type=_non_negative(float), default=0.02,
                        help="times within this fraction of the best are ties (stable tie-break)")
    tuning.add_argument("--out", help="table path (default: <manifest>.tuned.yaml next to the manifest)")
    tuning.add_argument("--select", action="store_true",
                        help="also prune the manifest to the smallest config set within 97%% of the "
                             "oracle everywhere (99%% geomean) and write it with its table")
    tuning.add_argument("--select-dir", help="where --select writes (default: <build dir>/tune/pruned)")
    tuning.add_argument("--gpus", type=int, help="GPUs to use (default: all visible; shapes are split)")
    tuning.add_argument("--fresh", action="store_true", help="discard stored measurements (no resume)")
    tuning.set_defaults(func=_cmd_tune)
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return args.func(args)
    except GemmgenError as exc:
        print(f"gemmgen: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
