"""The `gemmgen` command: build (validate + render + compile + publish), validate, list."""

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

    for path in _manifests(args.manifests):
        kernels = expand(load_manifest(path))
        print(f"{path}: OK, {len(kernels)} kernels")
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
            for key, rules in sorted(library.dispatch.items()):
                print(f"  dispatch {' '.join(key)}:")
                for condition, name, line in rules:
                    print(f"    {condition.source:<28} -> {name}  (line {line})")
    return 0


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
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except GemmgenError as exc:
        print(f"gemmgen: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
