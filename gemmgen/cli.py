"""The `gemmgen` command: build (validate + render + compile + publish), validate, list, clean, tune.

Exit status: 0 on success; 1 on a gemmgen error (`gemmgen: error: ...` on stderr, no traceback;
a manifest with several independent mistakes lists each on its own `file:line: key:` line); 2 on a usage error (argparse); 141 (128 + SIGPIPE, what a C tool killed by SIGPIPE
reports) when the reader of stdout went away, e.g. `gemmgen list | head -5`: quietly, no traceback.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import re
import shutil
import stat
import sys
from pathlib import Path

from . import __version__, families, settings
from .tuning import select as selection
from .errors import GemmgenError, ManifestError

EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE


def _manifests(given: list[str]) -> list[Path]:
    paths = [Path(p) for p in given] or settings.default_manifests()
    if not paths:
        raise GemmgenError(f"no manifests given and none found in {settings.DEFAULT_MANIFEST_DIR}")
    return paths


def _check_across(manifest, kernels, libraries: dict, owners: dict) -> None:
    """Manifests given together must not fight over a library folder, nor over an op: no two
    libraries of one arch may both carry dispatch rules for one dispatch class (otherwise only
    loading both libraries would tell). `libraries` and `owners` collect the manifests seen."""
    path = manifest.path  # NOTES: nothing is recorded before every check passed (validate goes on)
    other = libraries.get(manifest.library)
    if other is not None and other != path:
        raise ManifestError(path, manifest.library_line, "library", f"library {manifest.library!r} is also built by "
                            f"{other}: both would publish into <build dir>/{manifest.library}; "
                            "give one of them another `library` name")
    classes: dict[str, dict[tuple, None]] = {}  # family name -> its dispatch classes, in order
    for spec in kernels:
        if spec.origin is not None:
            classes.setdefault(spec.origin.family, {})[spec.dispatch_class] = None
    claims: dict[tuple, tuple] = {}
    for family, key in ((f, key) for f in manifest.families if f.dispatch  # else: by name only
                        for key in classes.get(f.name, ())):
        owned = (manifest.arch, *key)
        first = owners.get(owned) or claims.setdefault(owned, (path, manifest.library, family))
        if first[0] != path:
            first_path, first_library, first_family = first
            raise ManifestError(
                path, family.line, "dispatch",
                f"library {manifest.library!r} (family {family.name!r}) and library "
                f"{first_library!r} of {first_path}:{first_family.line} (family "
                f"{first_family.name!r}) both carry {manifest.arch} dispatch rules for "
                f"{family.plugin.describe_class(key)}: which one serves it would "
                "be arbitrary. Drop the `dispatch` list from one of the two families (its kernels "
                "stay callable by name)")
    libraries[manifest.library] = path
    for owned, claim in claims.items():
        owners.setdefault(owned, claim)


def _validated(paths: list[Path], keep_going: bool = False):
    """Load and expand each manifest in turn, checked against the ones before it (see
    `_check_across`); yields (path, kernels). The same file given twice counts once. With
    `keep_going`, a manifest's ManifestError is yielded as (path, error) and the next manifest
    is checked too (a broken one takes no part in the checks across manifests)."""
    from .generator.expand import expand
    from .generator.manifest import load_manifest

    libraries: dict[str, str] = {}
    owners: dict[tuple, tuple] = {}
    seen: set[Path] = set()
    for path in paths:
        if path.resolve() in seen:
            continue
        seen.add(path.resolve())
        try:
            manifest = load_manifest(path)
            kernels = expand(manifest)
            _check_across(manifest, kernels, libraries, owners)
        except ManifestError as exc:
            if not keep_going:
                raise
            yield path, exc
            continue
        yield path, kernels


def _cmd_build(args: argparse.Namespace) -> int:
    from .build.builder import build_manifest
    from .build.toolchain import find_toolchain

    paths = _manifests(args.manifests)
    paths = [path for path, _ in _validated(paths)]  # NOTES: validate all before compiling any
    find_toolchain()  # nvcc and CUTLASS problems are reported before anything is written
    root = settings.build_dir(args.build_dir)
    for path in paths:
        build_manifest(path, root, jobs=args.jobs,
                       allow_wgmma_serialization=args.allow_wgmma_serialization)
    if args.build_dir and not os.environ.get(settings.BUILD_DIR_VARIABLE):
        print(f"gemmgen: to use it from Python: export {settings.BUILD_DIR_VARIABLE}={root}")
    return 0


def _cmd_validate(args: argparse.Namespace) -> int:
    from .build.builder import tuned_table_status
    from .tuning.table import table_paths_for

    failed = 0
    for path, kernels in _validated(_manifests(args.manifests), keep_going=True):
        if isinstance(kernels, ManifestError):  # every manifest is checked: all errors at once
            sys.stdout.flush()
            print(f"gemmgen: error: {kernels}", file=sys.stderr)
            failed += 1
            continue
        note = ""
        broken = False
        for table in table_paths_for(path):  # validated like `gemmgen build`: file:line errors, staleness
            try:
                _, status, message = tuned_table_status(path, kernels, table)
            except ManifestError as exc:  # reported, and the next manifest is checked too
                sys.stdout.flush()
                print(f"gemmgen: error: {exc}", file=sys.stderr)
                broken = True
                break
            if message is not None and status == "stale, not used":
                print(message)  # a partial table: its status says all
            note += f"; tuned table {table.name}: {status}"
        if broken:
            failed += 1
            continue
        print(f"{path}: OK, {len(kernels)} kernels{note}")
        if args.verbose:
            for spec in kernels:
                print(f"  {spec.name}")
    return 1 if failed else 0


def _cmd_list(args: argparse.Namespace) -> int:
    from .bindings import library as binding_library
    from .errors import LibraryNotBuiltError

    if args.manifests is not None:  # from the manifests alone: nothing needs to be built
        if args.build_dir:
            raise GemmgenError("--manifests reads the manifests, not a build directory; drop --build-dir")
        _print_libraries(binding_library.manifest_libraries(args.manifests), args.dispatch)
        return 0
    with settings.using_build_dir(args.build_dir):
        if args.build_dir:
            binding_library.reload()  # what this process loaded came from the other directory
        try:
            try:
                loaded = binding_library.libraries()
            except LibraryNotBuiltError as exc:
                if not args.dispatch:
                    raise
                raise LibraryNotBuiltError(f"{exc} To see what dispatch would choose without a "
                                           "build: `gemmgen list --dispatch --manifests`") from None
            _print_libraries(loaded, args.dispatch)
        finally:
            if args.build_dir:
                binding_library.reload()
    return 0


def _print_libraries(libraries, dispatch: bool) -> None:
    from .dispatch import rule_label

    for library in libraries:
        where = (f"from {library.manifest} (not built)" if getattr(library, "manifest", None)
                 else f"at {library.directory}")
        print(f"{library.name} ({library.arch}, {len(library.kernels)} kernels) {where}")
        for name in sorted(library.kernels):
            print(f"  {name}")
        if dispatch:
            for table in library.tables:
                fit = table.fit
                shapes = sum(len(c.shapes) for c in table.classes.values())
                state = (fit.note().removeprefix("tuned table ") if fit is not None
                         else f"{shapes} (class, N, K) entries")
                models = [c.model for c in table.classes.values() if c.model is not None]
                if models:
                    state += f"; a cost model for untuned shapes in {len(models)} of {len(table.classes)} classes"
                    current = {getattr(families.for_op(key[0]), "cost_feature_set", None) for key in table.classes}
                    older = sorted({m.features for m in models} - current)
                    if older:
                        state += (f", of feature set {', '.join(older)}, which this gemmgen refits from the stored "
                                  f"times when it is used (`gemmgen tune --refit {table.path}` rewrites it)")
                print(f"  tuned table: {table.path} ({table.metadata['gpu']}, "
                      f"{table.metadata['sm_count']} SMs; {state})")
                for key, shape, bucket in (fit.dropped if fit is not None else ()):
                    print(f"    dropped: {' '.join(key)} (n={shape.n}, k={shape.k}): {bucket.dropped}; "
                          "the rules serve that M range")
            for key, rules in sorted(library.dispatch.items()):
                print(f"  dispatch {' '.join(key)}:")
                for index, (condition, name, line) in enumerate(rules):
                    label = f"{rule_label(index, len(rules), line)}:"
                    print(f"    {label:<24} {condition.source!r:<30} -> {name}")


# ---------------------------------------------------------------------------------- clean

_LIBRARY_NAME = re.compile(r"^[a-z][a-z0-9_]*$")  # a manifest's `library` (generator/manifest.py)
TUNE_DIR = "tune"


def _is_library_dir(folder: Path) -> bool:
    """Whether `folder` is what `gemmgen build` makes for a library: a real folder named like a
    library that holds a gemmgen build.ninja, a `current` link, or published releases in lib/.
    NOTES: stricter than "has a lib/ folder", so that `clean` in a directory that is no build
    directory (e.g. $HOME, with projects that have lib/ folders) finds nothing to remove."""
    if not _LIBRARY_NAME.match(folder.name) or folder.is_symlink() or not folder.is_dir():
        return False
    ninja = folder / "build.ninja"
    try:
        if ninja.is_file() and ninja.read_text(errors="replace").startswith("# Generated by gemmgen"):
            return True
    except OSError:
        pass
    if (folder / "current").is_symlink():
        return True
    releases = folder / "lib"
    if releases.is_dir() and not releases.is_symlink():
        for release in releases.iterdir():
            if (release / "bindings.py").is_file() or (release / f"libgemmgen_{folder.name}.so").is_file():
                return True
    return False


def _is_tune_dir(folder: Path) -> bool:
    """`gemmgen tune`'s store: <build dir>/tune with *.jsonl measurements and/or pruned/."""
    if folder.is_symlink() or not folder.is_dir():
        return False
    return any(p.suffix == ".jsonl" or p.name == "pruned" for p in folder.iterdir())


def _disk_usage(folder: Path) -> int:
    """Bytes on disk under `folder` (like `du`: allocated blocks, hard links once, links not
    followed)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for directory, dirs, files in os.walk(folder, followlinks=False):
        for name in (*dirs, *files, "."):
            try:
                info = os.lstat(os.path.join(directory, name))
            except OSError:
                continue
            if stat.S_ISDIR(info.st_mode) and name != ".":
                continue  # counted as "." of its own walk step (links to folders: as files)
            if (info.st_dev, info.st_ino) in seen:
                continue
            seen.add((info.st_dev, info.st_ino))
            total += getattr(info, "st_blocks", 0) * 512 or info.st_size
    return total


def _size(nbytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if nbytes < 1024 or unit == "GiB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    raise AssertionError  # pragma: no cover


def _remove(folder: Path) -> int:
    freed = _disk_usage(folder)
    try:
        shutil.rmtree(folder)
    except OSError as exc:
        raise GemmgenError(f"cannot remove {folder}: {exc}") from None
    return freed


def _remove_library(folder: Path) -> int:
    """Remove one library folder under its build lock, so a running `gemmgen build` of it is
    not pulled out from under (clean waits for it to finish)."""
    from .build.builder import _locked

    lock = folder / ".lock"
    if lock.exists():
        with open(lock, "a") as handle:  # only to say why clean waits, if it must
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(handle, fcntl.LOCK_UN)
            except OSError:
                print(f"gemmgen: waiting for the running build of {folder.name!r} to finish ...",
                      flush=True)
    with _locked(folder):
        # NOTES: the folder goes, its .lock with it; the lock held here stays valid until released
        return _remove(folder)


def _cmd_clean(args: argparse.Namespace) -> int:
    root = settings.build_dir(args.build_dir)
    if not root.is_dir():
        if root.exists():
            raise GemmgenError(f"{root} is not a directory, so not a gemmgen build directory; "
                               "nothing removed")
        print(f"gemmgen: nothing to clean: {root} does not exist")
        return 0
    if args.libraries:
        targets = []
        for name in args.libraries:
            folder = root / name
            if not _LIBRARY_NAME.match(name) or not _is_library_dir(folder):
                built = sorted(p.name for p in root.iterdir() if _is_library_dir(p))
                raise GemmgenError(
                    f"{folder} is not a gemmgen library folder (no build.ninja, current or lib/ of "
                    f"a gemmgen build); libraries in {root}: {', '.join(built) or 'none'}; "
                    "nothing removed")
            targets.append(folder)
        tune = None
    else:
        entries = sorted(root.iterdir())
        targets = [p for p in entries if _is_library_dir(p)]
        tune = root / TUNE_DIR if _is_tune_dir(root / TUNE_DIR) else None
        if not targets and tune is None:
            if entries:
                raise GemmgenError(
                    f"{root} does not look like a gemmgen build directory (no library folder "
                    f"holding build.ninja, current or lib/, no {TUNE_DIR}/ of measurements); "
                    "nothing removed")
            print(f"gemmgen: nothing to clean in {root} (empty)")
            return 0
    freed = 0
    for folder in dict.fromkeys(targets):
        size = _remove_library(folder)
        freed += size
        print(f"gemmgen: removed {folder} ({_size(size)})")
    if tune is not None:
        size = _remove(tune)
        freed += size
        print(f"gemmgen: removed {tune} ({_size(size)}: tune measurements and pruned manifests)")
    print(f"gemmgen: freed {_size(freed)} in {root}")
    return 0


def _cmd_tune(args: argparse.Namespace) -> int:
    from .tuning.shapes import load_many, parse_m_grid, resolve_shapes_arg
    from .tuning.tune import TuneOptions, refit_table, tune

    if args.refit:
        defaults = vars(_parser().parse_args(["tune"]))  # every tune option left as it is
        given = [f"--{name.replace('_', '-')}" for name, value in vars(args).items()
                 if name not in ("refit", "out", "library") and name in defaults and value != defaults[name]]
        if given:
            raise GemmgenError(f"--refit rewrites a table's cost model from its stored times and times "
                               f"nothing; {', '.join(given)} belong to a tune")
        path = refit_table(Path(args.refit), Path(args.out) if args.out else None, args.library,
                           "gemmgen " + " ".join(args.argv))
        print(f"gemmgen tune: wrote {path}")
        return 0
    if not args.shapes and not args.from_cache and not args.retune:
        raise GemmgenError("tune: give --shapes, --from-cache, or both (or --retune TABLE)")
    shapes = load_many(args.shapes) if args.shapes else []
    try:
        m_grid = parse_m_grid(args.m) if args.m else ()  # (): the tuned family's own grid
    except ValueError as exc:
        raise GemmgenError(f"--m: {exc}") from None
    options = TuneOptions(
        shapes=shapes, m_grid=m_grid,
        library=args.library, family=args.family, dtypes=tuple(args.dtypes or ()), out_dtype=args.out_dtype,
        epilogue=args.epilogue, knob_top=args.knob_top, tolerance=args.tolerance,
        settled_tolerance=args.settled_tolerance, fresh=args.fresh,
        out=args.out, select=args.select, select_dir=args.select_dir, gpus=args.gpus,
        from_cache=args.from_cache, extend=args.extend, update=args.update, retune=args.retune,
        command="gemmgen " + " ".join(args.argv),
        shape_sources=[resolve_shapes_arg(s).name for s in args.shapes or ()]
        + (["autotune cache"] if args.from_cache else []))
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


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gemmgen", description=__doc__.split("\n", 1)[0])
    parser.add_argument("--version", action="version", version=f"gemmgen {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    build_dir_help = (f"build directory (default: ${settings.BUILD_DIR_VARIABLE}, else "
                      "$XDG_CACHE_HOME/gemmgen, else ~/.cache/gemmgen)")
    build = sub.add_parser("build", help="validate, generate, compile and publish manifests "
                                         "(default: the shipped manifests)")
    build.add_argument("manifests", nargs="*", help="manifest YAML files")
    build.add_argument("--build-dir", help=f"output {build_dir_help}")
    build.add_argument("-j", "--jobs", type=int, help="parallel nvcc jobs (default: cores, capped "
                                                      "at available memory / 4 GiB)")
    build.add_argument("--allow-wgmma-serialization", action="store_true",
                       help="downgrade ptxas warning C7510 (wgmma serialized) from error to warning")
    build.set_defaults(func=_cmd_build)
    validate = sub.add_parser("validate", help="validate and expand manifests; compile nothing")
    validate.add_argument("manifests", nargs="*")
    validate.add_argument("-v", "--verbose", action="store_true", help="list kernel names")
    validate.set_defaults(func=_cmd_validate)
    listing = sub.add_parser("list", help="list the built kernels (--manifests: the kernels the "
                                          "manifests would build)")
    listing.add_argument("--dispatch", action="store_true",
                         help="also print the dispatch rules and the tuned table (what is kept of it)")
    listing.add_argument("--manifests", nargs="*", metavar="MANIFEST",
                         help="read the manifests (default: the shipped ones) and the tuned tables "
                              "beside them instead of the built libraries: nothing needs building")
    listing.add_argument("--build-dir", help=build_dir_help)
    listing.set_defaults(func=_cmd_list)
    clean = sub.add_parser("clean", help="remove what `gemmgen build` (and `gemmgen tune`) left in "
                                         "the build directory")
    clean.add_argument("libraries", nargs="*", metavar="LIBRARY",
                       help="library folders to remove (default: every gemmgen library folder and "
                            f"{TUNE_DIR}/)")
    clean.add_argument("--build-dir", help=build_dir_help)
    clean.set_defaults(func=_cmd_clean)
    tuning = sub.add_parser("tune", help="measure every candidate kernel over weight shapes x an M "
                                         "grid on the GPU and write the tuned dispatch table")
    tuning.add_argument("--shapes", nargs="+",
                        help="shape files (paths, or names in gemmgen/manifests/shapes/, e.g. llama3_8b)")
    tuning.add_argument("--from-cache", action="store_true",
                        help="also tune every (N, K) that tuning at first use recorded on this GPU "
                             "(gemmgen.autotune(), GEMMGEN_AUTOTUNE=1), timed or pending")
    tuning.add_argument("--m", help="comma-separated M grid (default: 1..16384, powers of two and "
                                    "between; for MoE expert layers, rows 2..8192)")
    tuning.add_argument("--library", help="library to tune (default: the one built library with "
                                          "dispatch rules for this GPU's arch; with several, e.g. "
                                          "the shipped w8a8, mixed and moe, name it or --family)")
    tuning.add_argument("--family", help="op family to tune (e.g. w8a8, mixed, moe): picks its library "
                                         "when several are built")
    tuning.add_argument("--dtypes", nargs="+", help="input dtypes (W8A8: int8 e4m3; MoE: x's, "
                                                    "int8 e4m3, or one class: a8w8 a8w4 a8w4g; "
                                                    "mixed-input: the activations', bf16 fp16; "
                                                    "default: all built)")
    tuning.add_argument("--out-dtype", default="bf16", choices=["bf16", "fp16"],
                        help="W8A8 only: output dtype measured (the table serves the other "
                             "through the same configs)")
    tuning.add_argument("--epilogue", default="ScaledEpilogueBias",
                        help="W8A8 only: epilogue measured (others use the same configs' "
                             "kernels)")
    tuning.add_argument("--knob-top", type=_non_negative(int), default=3,
                        help="try every run-time knob on this many fastest kernels per point "
                             "(and on those the family always tries, e.g. the mixed wgmma "
                             "kernel's K splits)")
    tuning.add_argument("--tolerance", type=_non_negative(float), default=selection.DEFAULT_TOLERANCE,
                        help="times within this fraction of the best are ties (stable tie-break)")
    tuning.add_argument("--settled-tolerance", type=_non_negative(float),
                        default=selection.SETTLED_TOLERANCE,
                        help="the tie fraction among candidates re-timed side by side (settled); "
                             "at most --tolerance")
    tuning.add_argument("--out", help="table path (default: <manifest>.tuned.<gpu>.yaml next to the manifest, "
                           "e.g. w8a8_sm90.tuned.h200.yaml)")
    tuning.add_argument("--extend", metavar="TABLE",
                        help="add the shapes to this tuned table (measured on this GPU for this "
                             "library): its buckets and times are kept, only the new shapes are "
                             "timed, and the table is rewritten (or written to --out)")
    tuning.add_argument("--update", metavar="TABLE",
                        help="re-tune the classes this tune measures (e.g. --dtypes e4m3 after adding "
                             "fp8 configs) and write them into this tuned table (measured on this GPU "
                             "for this library), keeping its other classes; every kernel new since "
                             "the table must be of a measured class")
    tuning.add_argument("--retune", metavar="TABLE",
                        help="re-time points of this tuned table (measured on this GPU for this "
                             "library's kernel set): the shapes it lists for the classes this tune "
                             "measures (--shapes: only those; --dtypes: only those classes) at the "
                             "M values of --m (a subset of its grid; default: all of it), timed "
                             "afresh; a pick changes where the old one loses side by side by more "
                             "than the tie tolerance, every other point's is kept")
    tuning.add_argument("--refit", metavar="TABLE",
                        help="rewrite this table's cost model (how it chooses for shapes it does not list) "
                             "in this gemmgen's cost features, fitted to the times it stores: no GPU, "
                             "nothing timed (for a table an older gemmgen wrote)")
    tuning.add_argument("--select", action="store_true",
                        help="also prune the manifest to the smallest config set within 97%% of the "
                             "oracle everywhere (99%% geomean) and write it with its table")
    tuning.add_argument("--select-dir", help="where --select writes (default: <build dir>/tune/pruned)")
    tuning.add_argument("--gpus", type=int, help="GPUs to use (default: all visible; shapes are split)")
    tuning.add_argument("--fresh", action="store_true", help="discard stored measurements (no resume)")
    tuning.set_defaults(func=_cmd_tune)
    return parser


def _stdout_to_devnull() -> None:
    """After EPIPE: point fd 1 at /dev/null, so the interpreter's final flush of what is still
    buffered does not fail a second time ("Exception ignored ... BrokenPipeError")."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # no real stdout (e.g. captured in tests)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def _run(argv: list[str] | None) -> int:
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit:
        sys.stdout.flush()  # --help / --version into a closed pipe: handled in main
        raise
    args.argv = list(sys.argv[1:] if argv is None else argv)
    try:
        status = args.func(args)
        sys.stdout.flush()  # a reader that went away shows here, not at interpreter exit
        return status
    except GemmgenError as exc:
        sys.stdout.flush()
        print(f"gemmgen: error: {exc}", file=sys.stderr)
        return 1


def main(argv: list[str] | None = None) -> int:
    try:
        return _run(argv)
    except BrokenPipeError:
        # `gemmgen list | head -5`: the reader has all it wanted. Exit like a C tool killed by
        # SIGPIPE would (141), quietly: no traceback, no "Exception ignored" at exit.
        _stdout_to_devnull()
        return EXIT_BROKEN_PIPE


if __name__ == "__main__":
    sys.exit(main())
