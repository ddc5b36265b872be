"""Parse, validate and evaluate the dispatch-rule conditions of a manifest.

A manifest's dispatch table is an ordered list of rules (first match wins),
each guarded by a small boolean condition over the dispatch variables that
its op family declares: the problem sizes ``m``, ``n`` and ``k`` for GEMMs by
default; a grouped (MoE) GEMM may add e.g. ``experts`` and
``tokens_per_expert``.  Every variable is an integer in [1, MAX_DIM].  This
module turns the condition text into an exact normal form without ever
``eval``-ing it, and proves statically that a table has no gaps and no
unreachable rules.
"""

from __future__ import annotations

import ast
import itertools
import keyword
import math
import re
import unicodedata
from dataclasses import dataclass, field
from typing import Sequence

VARIABLES: tuple[str, ...] = ("m", "n", "k")  # the default: GEMM problem sizes
MAX_DIM: int = 2**31 - 1  # every variable is an int in [1, MAX_DIM]

MAX_CLAUSES = 512  # normal-form size cap: guards against `not` blow-up
MAX_POINTS = 2_000_000  # cap on the critical-point grid of check_rule_table

# A clause is a box: inclusive bounds (v0_lo, v0_hi, v1_lo, v1_hi, ...), one
# (lo, hi) pair per variable in declaration order; (m_lo, m_hi, n_lo, n_hi,
# k_lo, k_hi) for the default variables.  A condition is the union (OR) of its
# clauses; no clauses means "false".
_Clause = tuple[int, ...]
_Dnf = tuple[_Clause, ...]
_RESERVED = frozenset({"true", "false", "and", "or", "not"})


def _full(width: int) -> _Clause:
    """The box covering the whole domain, for `width` variables."""
    return (1, MAX_DIM) * width


def _allowed(variables: tuple[str, ...]) -> str:
    """The "allowed: ..." text of error messages, naming the declared variables."""
    noun = "variable" if len(variables) == 1 else "variables"
    return (f"integer literals >= 0, {noun} {', '.join(variables)}, comparisons "
            "(<, <=, >, >=, ==, !=, chainable) between a variable and an integer, "
            "and, or, not, parentheses, true, false")


_FULL: _Clause = _full(len(VARIABLES))
_ALLOWED = _allowed(VARIABLES)
_CMP_OPS = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!="}
_BAD_OPS = {ast.In: "in", ast.NotIn: "not in", ast.Is: "is", ast.IsNot: "is not"}
_FLIPPED = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "==": "==", "!=": "!="}
_BOOL_WORD = re.compile(r"(?<![\w.])(true|false)(?!\w)")
_NODE_NAMES = {
    ast.Call: "function call", ast.Attribute: "attribute access", ast.Subscript: "subscript",
    ast.BinOp: "arithmetic", ast.Lambda: "lambda", ast.IfExp: "conditional expression",
    ast.List: "list", ast.Tuple: "tuple", ast.Set: "set", ast.Dict: "dict",
    ast.NamedExpr: "assignment expression", ast.JoinedStr: "f-string",
}


class ConditionError(ValueError):
    """Bad condition text; message says what is wrong and where (column), and what is allowed."""


class RuleTableError(ValueError):
    """A rule table that cannot be right.

    ``rule_index`` is the offending (0-based) rule, or None for a gap or an
    oversized table; ``point`` is an example problem for a gap, one entry per
    variable in declaration order ({"m":..,"n":..,"k":..} by default), else
    None.
    """

    def __init__(self, message: str, rule_index: int | None = None,
                 point: dict[str, int] | None = None) -> None:
        super().__init__(message)
        self.rule_index = rule_index
        self.point = point


def _check_variables(variables: object) -> tuple[str, ...]:
    """Return `variables` if it is a valid declaration, else raise ValueError."""
    if not isinstance(variables, tuple) or not variables:
        raise ValueError(f"dispatch variables must be a non-empty tuple of names, "
                         f"got {variables!r}")
    for name in variables:
        if name in _RESERVED:
            raise ValueError(f"dispatch variable {name!r} is a reserved word of the condition "
                             f"language ({', '.join(sorted(_RESERVED))}) (in {variables!r})")
        # Python keywords cannot be names in the parsed text, and ast reads names
        # NFKC-normalized, so a non-normalized declaration could never be matched.
        if (not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name)
                or unicodedata.normalize("NFKC", name) != name):
            raise ValueError(f"dispatch variable {name!r} is not a plain Python identifier "
                             f"(in {variables!r})")
    if len(set(variables)) != len(variables):
        dupes = sorted({name for name in variables if variables.count(name) > 1})
        raise ValueError(f"dispatch variables {variables!r} repeat {', '.join(dupes)}")
    return variables


@dataclass(frozen=True)
class Condition:
    """A parsed condition: ``source`` text plus its exact normal form.

    ``variables`` names the dispatch variables, in the order ``matches`` takes
    them; ``clauses`` is a union of boxes of inclusive per-variable bounds
    (lo, hi for each variable in that order), so ``matches`` is a handful of
    integer comparisons with no allocation.
    """

    source: str
    clauses: _Dnf = field(repr=False)
    variables: tuple[str, ...] = VARIABLES
    _arity: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _check_variables(self.variables)
        object.__setattr__(self, "_arity", len(self.variables))
        width = 2 * len(self.variables)
        for clause in self.clauses:
            if len(clause) != width:
                raise ValueError(f"clause {clause!r} of condition {self.source!r} has "
                                 f"{len(clause)} bounds; {len(self.variables)} variables "
                                 f"need {width}")

    def matches(self, v0: int, v1: int | None = None, v2: int | None = None, /, *more: int) -> bool:
        """True when the point satisfies the condition: ``matches(*values)``.

        Takes one value per variable, positionally, in ``variables`` order:
        ``matches(m, n, k)`` for the default variables.  (The first three are
        spelled out so that the common three-variable call packs no tuple.)
        """
        if v2 is not None and not more and self._arity == 3:  # the GEMM case, unrolled
            for m_lo, m_hi, n_lo, n_hi, k_lo, k_hi in self.clauses:
                if m_lo <= v0 <= m_hi and n_lo <= v1 <= n_hi and k_lo <= v2 <= k_hi:
                    return True
            return False
        values = ((v0,) if v1 is None else (v0, v1)) if v2 is None else (v0, v1, v2, *more)
        if len(values) != self._arity:
            raise TypeError(f"condition {self.source!r} takes {self._arity} values "
                            f"({', '.join(self.variables)}), got {len(values)}")
        for clause in self.clauses:
            bound = 0
            for value in values:
                if not clause[bound] <= value <= clause[bound + 1]:
                    break
                bound += 2
            else:
                return True
        return False

    def thresholds(self) -> dict[str, tuple[int, ...]]:
        """Per variable, the sorted values t where truth may differ from t-1.

        Those are every box's lower bound and one past its upper bound; the
        truth value is constant between consecutive thresholds.
        """
        out: dict[str, tuple[int, ...]] = {}
        for axis, name in enumerate(self.variables):
            points: set[int] = set()
            for clause in self.clauses:
                lo, hi = clause[2 * axis], clause[2 * axis + 1]
                if lo > 1:
                    points.add(lo)
                if hi < MAX_DIM:
                    points.add(hi + 1)
            out[name] = tuple(sorted(points))
        return out

    def __str__(self) -> str:
        return self.source


# ---------------------------------------------------------------- normal form
# Every helper works for any number of variables: a clause's width (2 bounds
# per variable) says how many axes it has.

def _intersect(a: _Clause, b: _Clause) -> _Clause | None:
    """The box a ∩ b, or None when empty."""
    box: list[int] = []
    for axis in range(len(a) // 2):
        lo, hi = max(a[2 * axis], b[2 * axis]), min(a[2 * axis + 1], b[2 * axis + 1])
        if lo > hi:
            return None
        box += (lo, hi)
    return tuple(box)


def _contains(outer: _Clause, inner: _Clause) -> bool:
    return all(outer[2 * a] <= inner[2 * a] and inner[2 * a + 1] <= outer[2 * a + 1]
               for a in range(len(outer) // 2))


def _simplify(clauses: list[_Clause], text: str) -> _Dnf:
    """Drop duplicate and subsumed boxes; refuse forms too big to be sane."""
    unique = sorted(set(clauses))
    kept = [c for c in unique if not any(o != c and _contains(o, c) for o in unique)]
    if len(kept) > MAX_CLAUSES:
        raise ConditionError(f"dispatch condition {text!r} is too complex "
                             f"(over {MAX_CLAUSES} clauses); simplify it")
    return tuple(kept)


def _and(x: _Dnf, y: _Dnf, text: str) -> _Dnf:
    boxes = (_intersect(a, b) for a in x for b in y)
    return _simplify([box for box in boxes if box is not None], text)


def _not(x: _Dnf, width: int, text: str) -> _Dnf:
    """Complement (in `width` variables): AND over clauses of (OR of each bound's outside)."""
    full = _full(width)
    result: _Dnf = (full,)
    for clause in x:
        outside: list[_Clause] = []
        for axis in range(width):
            lo, hi = clause[2 * axis], clause[2 * axis + 1]
            for span in ((1, lo - 1), (hi + 1, MAX_DIM)):
                if span[0] <= span[1]:
                    box = list(full)
                    box[2 * axis:2 * axis + 2] = span
                    outside.append(tuple(box))
        result = _and(result, tuple(outside), text)
    return result


def _compare(axis: int, width: int, op: str, value: int) -> _Dnf:
    """Boxes for `variable[axis] op value` in `width` variables, clipped to [1, MAX_DIM]."""
    spans = {"<": [(1, value - 1)], "<=": [(1, value)], ">": [(value + 1, MAX_DIM)],
             ">=": [(value, MAX_DIM)], "==": [(value, value)],
             "!=": [(1, value - 1), (value + 1, MAX_DIM)]}[op]
    full = _full(width)
    out: list[_Clause] = []
    for lo, hi in spans:
        lo, hi = max(lo, 1), min(hi, MAX_DIM)
        if lo <= hi:
            box = list(full)
            box[2 * axis:2 * axis + 2] = (lo, hi)
            out.append(tuple(box))
    return tuple(out)


# -------------------------------------------------------------------- parsing

class _Walker:
    """Whitelist walk of the ast, building the normal form as it goes."""

    def __init__(self, text: str, indent: int, variables: tuple[str, ...]) -> None:
        self.text, self.indent, self.variables = text, indent, variables
        self.width = len(variables)
        self.allowed = _allowed(variables)

    def fail(self, problem: str, node: ast.AST | None = None,
             allowed: str | None = None) -> ConditionError:
        where = ""
        if node is not None and hasattr(node, "col_offset"):
            where = f" (at {_location(self.text, self.indent, node.lineno, node.col_offset, True)})"
        allowed = self.allowed if allowed is None else allowed
        return ConditionError(f"{problem} in dispatch condition {self.text!r}; allowed: {allowed}{where}")

    def snippet(self, node: ast.AST) -> str:
        return ast.get_source_segment(self.text.lstrip(), node) or type(node).__name__

    def walk(self, node: ast.AST) -> _Dnf:
        if isinstance(node, ast.BoolOp):
            parts = [self.walk(value) for value in node.values]
            result = parts[0]
            for part in parts[1:]:
                result = (_and(result, part, self.text) if isinstance(node.op, ast.And)
                          else _simplify(list(result + part), self.text))
            return result
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return _not(self.walk(node.operand), self.width, self.text)
        if isinstance(node, ast.Compare):
            return self.comparison(node)
        if isinstance(node, ast.Constant) and isinstance(node.value, bool):
            return (_full(self.width),) if node.value else ()
        if isinstance(node, ast.Constant) and type(node.value) is int:
            raise self.fail(f"integer {node.value} on its own is not a condition", node)
        if isinstance(node, ast.Name):
            if node.id in self.variables:
                raise self.fail(f"bare variable '{node.id}' is not a condition (compare it)", node)
            raise self.unknown(node)
        raise self.fail(self.describe(node), node)

    def comparison(self, node: ast.Compare) -> _Dnf:
        result: _Dnf = (_full(self.width),)
        operands = [node.left, *node.comparators]
        for left, op_node, right in zip(operands, node.ops, operands[1:]):
            op = _CMP_OPS.get(type(op_node))
            if op is None:
                bad = _BAD_OPS.get(type(op_node), type(op_node).__name__)
                raise self.fail(f"operator '{bad}' is not allowed", node)
            lhs, rhs = self.operand(left), self.operand(right)
            if isinstance(lhs, str) and isinstance(rhs, int):
                part = _compare(self.variables.index(lhs), self.width, op, rhs)
            elif isinstance(lhs, int) and isinstance(rhs, str):
                part = _compare(self.variables.index(rhs), self.width, _FLIPPED[op], lhs)
            else:
                what = "two variables" if isinstance(lhs, str) else "two integers"
                raise self.fail(f"comparison between {what} ('{self.snippet(left)} {op} "
                                f"{self.snippet(right)}')", left)
            result = _and(result, part, self.text)
        return result

    def operand(self, node: ast.AST) -> str | int:
        """A comparison side: a variable name or a non-negative integer."""
        if isinstance(node, ast.Name):
            if node.id not in self.variables:
                raise self.unknown(node)
            return node.id
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        raise self.fail(self.describe(node), node)

    def unknown(self, node: ast.Name) -> ConditionError:
        return self.fail(f"unknown variable '{node.id}'", node, allowed=", ".join(self.variables))

    def describe(self, node: ast.AST) -> str:
        """Human name of a rejected construct, with the text it came from."""
        shown = self.snippet(node)
        if isinstance(node, ast.Constant):
            kinds = {bool: "boolean", float: "float", str: "string", complex: "complex number"}
            kind = kinds.get(type(node.value), type(node.value).__name__)
            return f"{kind} literal {shown} is not allowed (use a non-negative integer)"
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return f"negative number '{shown}' is not allowed (problem sizes are >= 1)"
        if isinstance(node, ast.BinOp):
            return f"arithmetic '{shown}' is not allowed (write the bound as a plain integer)"
        name = _NODE_NAMES.get(type(node), f"construct {type(node).__name__}")
        return f"{name} '{shown}' is not allowed"


def _location(text: str, indent: int, lineno: int, col: int, bytes_offset: bool) -> str:
    """1-based column in the original text (ast offsets are UTF-8 bytes)."""
    lines = text.lstrip().splitlines() or [""]
    line = lines[min(lineno, len(lines)) - 1]
    if bytes_offset:
        col = len(line.encode()[:col].decode(errors="ignore"))
    col += 1 + (indent if lineno == 1 else 0)
    return f"column {col}" if lineno == 1 else f"line {lineno}, column {col}"


def parse_condition(text: str, variables: tuple[str, ...] = VARIABLES) -> Condition:
    """Parse and validate one condition over `variables`; raise ConditionError if it is bad.

    `variables` is the op family's declaration (default m, n, k); it must be a
    non-empty tuple of distinct identifiers other than true, false, and, or,
    not (else ValueError).  A bare YAML ``true``/``false`` arrives as a bool
    and is accepted too.
    """
    variables = _check_variables(variables)
    allowed = _allowed(variables)
    if isinstance(text, bool):
        text = "true" if text else "false"
    if not isinstance(text, str):
        raise ConditionError(f"dispatch condition must be a string, got {type(text).__name__}")
    body = text.lstrip()
    if not body.strip():
        raise ConditionError("empty dispatch condition; write 'true' to match every problem")
    indent = len(text) - len(body)
    # Same-length rewrite keeps every column valid for error messages.
    mapped = _BOOL_WORD.sub(lambda m: m.group(1).capitalize(), body)
    try:
        tree = ast.parse(mapped, mode="eval")
    except SyntaxError as exc:
        where = _location(text, indent, exc.lineno or 1, (exc.offset or len(body) + 1) - 1, False)
        raise ConditionError(f"syntax error ({exc.msg}) in dispatch condition {text!r}; "
                             f"allowed: {allowed} (at {where})") from None
    except (RecursionError, MemoryError, ValueError):
        raise ConditionError(f"dispatch condition {text!r} is too deeply nested or malformed") from None
    clauses = _Walker(text, indent, variables).walk(tree.body)
    if not clauses:
        raise ConditionError(f"dispatch condition {text!r} is never true for problem sizes "
                             f"in [1, {MAX_DIM}]; fix or delete the rule")
    return Condition(text, clauses, variables)


# ----------------------------------------------------------------- rule table

def first_match(conditions: Sequence[Condition], *values: int) -> int | None:
    """Index of the first condition matching the point `values` (in variable order), or None."""
    for index, condition in enumerate(conditions):
        if condition.matches(*values):
            return index
    return None


# NOTES: why check_rule_table is exact, not sampling.  Every condition is a
# union of boxes in the N-dimensional space of its N variables, so along one
# axis each box changes membership only at its lower bound lo (from lo-1) and
# at hi+1 (from hi): exactly the thresholds().  Taking, per axis, {1} plus
# every threshold of EVERY condition on that axis cuts [1, MAX_DIM] into
# segments on which no condition's truth can change (moving along one axis
# inside a segment crosses no box face), and each segment starts at one of
# those points.  The product of the N point sets therefore holds one
# representative of every cell of the N-D grid on which the whole truth vector
# (hence first_match) is constant.  So a gap exists iff some representative
# matches no rule, and a rule is ever first iff it is first at some
# representative.  (The brief's t-1 / t+1 points add nothing: they fall in
# cells already represented.)  The grid has prod(len(axis)) points, which is
# what MAX_POINTS bounds before any is visited.

def check_rule_table(conditions: Sequence[Condition], *,
                     variables: tuple[str, ...] | None = None) -> None:
    """Raise RuleTableError on a gap or an unreachable rule; else return.

    All conditions must be over the same variables (those of the first rule,
    or `variables` when given; an empty table is over `variables`, default
    m, n, k).
    """
    for index, condition in enumerate(conditions):
        if not isinstance(condition, Condition):
            raise TypeError(f"rule {index} is {type(condition).__name__}, expected Condition "
                            "(use parse_condition)")
    if variables is not None:
        variables, origin = _check_variables(variables), "the table declares"
    elif conditions:
        variables, origin = conditions[0].variables, f"rule 0 ({conditions[0].source!r}) is over"
    else:
        variables, origin = VARIABLES, ""
    for index, condition in enumerate(conditions):
        if condition.variables != variables:
            raise RuleTableError(
                f"rule {index} ({condition.source!r}) is over variables "
                f"({', '.join(condition.variables)}) but {origin} ({', '.join(variables)}); "
                "all rules of one dispatch table must share the same variables",
                rule_index=index)
    axes: list[set[int]] = [{1} for _ in variables]
    for condition in conditions:
        for axis, points in enumerate(condition.thresholds().values()):
            axes[axis].update(points)
    sorted_axes = [sorted(points) for points in axes]
    total = math.prod(len(points) for points in sorted_axes)
    if total > MAX_POINTS:
        raise RuleTableError(f"dispatch table too fine-grained to verify ({total} critical "
                             f"points > {MAX_POINTS}); use fewer distinct thresholds")
    chosen = [False] * len(conditions)
    matchers = [condition.matches for condition in conditions]
    for point in itertools.product(*sorted_axes):  # == first_match, inlined: hot loop
        for index, match in enumerate(matchers):
            if match(*point):
                chosen[index] = True
                break
        else:
            raise _gap(conditions, dict(zip(variables, point)))
    for index, ok in enumerate(chosen):
        if not ok:
            raise RuleTableError(f"rule {index} ({conditions[index].source!r}) can never be "
                                 "chosen: earlier rules cover every problem it matches",
                                 rule_index=index)


def _gap(conditions: Sequence[Condition], point: dict[str, int]) -> RuleTableError:
    shown = ", ".join(repr(c.source) for c in conditions[:6]) or "nothing: the table is empty"
    if len(conditions) > 6:
        shown += f", ... ({len(conditions) - 6} more)"
    where = ", ".join(f"{name}={value}" for name, value in point.items())
    return RuleTableError(f"no dispatch rule matches {where} (rules cover only: {shown}); "
                          "add a rule or end the table with 'true'", point=point)
