"""Exception types gemmgen raises: each one says what is wrong, where, and what was expected."""

from __future__ import annotations


class GemmgenError(Exception):
    """Base class of gemmgen's own errors."""


class ManifestError(GemmgenError, ValueError):
    """A manifest that cannot be built; names file, line and key before anything compiles."""

    def __init__(self, file: str, line: int | None, key: str, message: str):
        self.file = str(file)
        self.line = line
        self.key = key
        self.detail = message
        where = f"{self.file}:{line}" if line else self.file
        super().__init__(f"{where}: {key}: {message}")

    def __reduce__(self):  # picklable (e.g. from a worker process) with its fields
        return type(self), (self.file, self.line, self.key, self.detail)


class ManifestErrors(ManifestError):
    """Every independent error of one manifest, as a compiler lists them: `errors` holds them
    (each a plain ManifestError, sorted by line, duplicates dropped); `file`, `line`, `key` and
    `detail` are the first one's, so code that handles a single ManifestError keeps working;
    `str()` is one `file:line: key: message` line per error, the first error's first."""

    def __init__(self, errors):
        flat: list[ManifestError] = []
        for error in errors:
            for one in (error.errors if isinstance(error, ManifestErrors) else (error,)):
                if not any(_same(one, seen) for seen in flat):
                    flat.append(one)
        if not flat:
            raise ValueError("ManifestErrors needs at least one error")
        # stable: errors on one line keep the order they were found in; no line (the file) first
        flat.sort(key=lambda e: (e.line is not None, e.line or 0))
        self.errors = tuple(flat)
        first = flat[0]
        self.file, self.line, self.key, self.detail = first.file, first.line, first.key, first.detail
        GemmgenError.__init__(self, "\n".join(str(e) for e in flat))

    def __reduce__(self):  # picklable (e.g. across processes) like its errors
        return type(self), (self.errors,)


def _same(a: ManifestError, b: ManifestError) -> bool:
    return (a.file, a.line, a.key, a.detail) == (b.file, b.line, b.key, b.detail)


class BuildError(GemmgenError, RuntimeError):
    """The compile or link of a kernel library failed; the previous library stays published."""


class LibraryNotBuiltError(GemmgenError, RuntimeError):
    """No kernel library has been built yet, or it does not match its bindings."""


class NoKernelError(GemmgenError, ValueError):
    """No built kernel (or none of the given manifests) computes the class a call asks for:
    `key` is that dispatch class (op, *class fields), `op` its op (e.g. "scaled_mm"), `arches`
    the arches asked for, `from_manifests` whether the answer came from manifests rather than
    built libraries; the message lists the classes there are."""

    def __init__(self, key: tuple[str, ...], arches: tuple[str, ...], message: str,
                 from_manifests: bool = False):
        self.key = tuple(key)
        self.arches = tuple(arches)
        self.from_manifests = from_manifests
        super().__init__(message)

    @property
    def op(self) -> str:
        return self.key[0]

    def __reduce__(self):
        return type(self), (self.key, self.arches, str(self), self.from_manifests)


class KernelLaunchError(GemmgenError, RuntimeError):
    """A kernel refused the problem or failed to launch; carries CUTLASS's or CUDA's reason."""


_PLAIN_NAMES = {bool: "a bool", int: "an int", float: "a float", str: "a string", list: "a list",
                tuple: "a tuple", dict: "a dict"}


def describe_argument(value) -> str:
    """A value as argument errors show it, in plain words (no Python type names such as
    NoneType): a tensor's dtype, shape and device; None; a plain int, float, bool or str with
    its value; a list / tuple with its length; else "a <class name> object". Needs no torch
    import."""
    if hasattr(value, "dtype") and hasattr(value, "shape") and hasattr(value, "device"):
        return f"{value.dtype} tensor of shape {tuple(value.shape)} on {value.device}"
    if value is None:
        return "None"
    kind = _PLAIN_NAMES.get(type(value))
    if isinstance(value, (bool, int, float, str)) and kind:
        return f"{kind} {value!r}"
    if isinstance(value, (list, tuple)) and kind:
        return f"{kind} of {len(value)} item{'' if len(value) == 1 else 's'}"
    name = type(value).__name__
    return kind or f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name} object"


def argument_error(where: str, argument: str, expected: str, got: object) -> ValueError:
    """The one message format of argument errors: `gemmgen.<where>: argument '<argument>':
    expected <expected>; got <got>`."""
    return ValueError(f"gemmgen.{where}: argument '{argument}': expected {expected}; got {got}")
