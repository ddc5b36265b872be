"""Tests for gemmgen.generator.dispatch_rules (CPU only, fast)."""

from __future__ import annotations

import operator
import random
from typing import Callable

import pytest

from gemmgen.generator.dispatch_rules import (
    MAX_DIM,
    MAX_POINTS,
    VARIABLES,
    Condition,
    ConditionError,
    RuleTableError,
    check_rule_table,
    first_match,
    parse_condition,
)

Oracle = Callable[[int, int, int], bool]


def table(*texts: str) -> list[Condition]:
    return [parse_condition(text) for text in texts]


# ------------------------------------------------------------------ parsing

@pytest.mark.parametrize(
    "text, inside, outside",
    [
        ("m <= 16", [(16, 1, 1), (1, 9, 9)], [(17, 1, 1)]),
        ("16 < m <= 64", [(17, 1, 1), (64, 5, 5)], [(16, 1, 1), (65, 1, 1)]),
        ("64 >= m", [(64, 1, 1)], [(65, 1, 1)]),
        ("m > 16 and m <= 64 and n <= 1280", [(20, 1280, 7)], [(20, 1281, 7), (16, 1, 1)]),
        ("m >= 8192 and k >= 6144", [(8192, 1, 6144)], [(8191, 1, 6144), (8192, 1, 6143)]),
        ("m <= 16 or (n > 4 and not k == 3)", [(1, 1, 3), (99, 5, 4)], [(99, 5, 3), (99, 4, 1)]),
        ("not (m < 8 or m > 9)", [(8, 1, 1), (9, 1, 1)], [(7, 1, 1), (10, 1, 1)]),
        ("m != 5", [(4, 1, 1), (6, 1, 1)], [(5, 1, 1)]),
        ("true", [(1, 1, 1), (MAX_DIM, MAX_DIM, MAX_DIM)], []),
        ("True and m < 4", [(3, 1, 1)], [(4, 1, 1)]),
        ("m < 4 or false", [(3, 1, 1)], [(4, 1, 1)]),
        ("  m < 0x10", [(15, 1, 1)], [(16, 1, 1)]),
        ("(m < 4 and\n n < 4)", [(3, 3, 1)], [(3, 4, 1)]),
    ],
)
def test_valid_parses(text: str, inside: list, outside: list) -> None:
    cond = parse_condition(text)
    assert str(cond) == text and cond.source == text
    assert all(cond.matches(*p) for p in inside)
    assert not any(cond.matches(*p) for p in outside)


def test_yaml_boolean_and_thresholds() -> None:
    assert parse_condition(True).matches(1, 1, 1)  # type: ignore[arg-type]
    assert parse_condition("16 < m <= 64 and k != 7").thresholds() == {
        "m": (17, 65), "n": (), "k": (7, 8)}
    assert parse_condition("true").thresholds() == {v: () for v in VARIABLES}


@pytest.mark.parametrize(
    "text, fragments",
    [
        ("x < 4", ["unknown variable 'x' in dispatch condition 'x < 4'; allowed: m, n, k",
                   "column 1"]),
        ("m < 4 and truex > 3", ["unknown variable 'truex'", "column 11"]),
        ("f(m) < 3", ["function call 'f(m)'", "allowed:"]),
        ("eval('x')", ["function call", "eval('x')"]),
        ("__import__('os').system('ls') < 1", ["function call", "not allowed"]),
        ("m.real < 3", ["attribute access 'm.real'"]),
        ("m < 4.0", ["float literal 4.0", "column 5"]),
        ("m < 'a'", ["string literal 'a'"]),
        ("m > -1", ["negative number '-1'", "column 5"]),
        ("m*2 < 4", ["arithmetic 'm*2'", "column 1"]),
        ("m < n", ["two variables"]),
        ("1 < 2", ["two integers"]),
        ("m", ["bare variable 'm'"]),
        ("m in [17, 64]", ["operator 'in'"]),
        ("m < 4 if n else 3", ["conditional expression"]),
        ("m <", ["syntax error", "column 4"]),
        ("(m < 4", ["syntax error", "never closed"]),
        ("m < 4; import os", ["syntax error"]),
        ("", ["empty dispatch condition"]),
        ("   ", ["empty dispatch condition"]),
    ],
)
def test_rejections(text: str, fragments: list[str]) -> None:
    with pytest.raises(ConditionError) as info:
        parse_condition(text)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, message
    if text.strip() and "unknown variable" not in message:
        assert "allowed: integer literals" in message


@pytest.mark.parametrize(
    "text", ["m < 1", "m <= 0", "m > 4 and m < 3", "not true", "false", "m > 2147483647",
             "m == 3 and not m != 3 and m != 3"])
def test_never_true(text: str) -> None:
    with pytest.raises(ConditionError, match="never true"):
        parse_condition(text)


# ------------------------------------------------- matches vs brute force

_OPS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
        "==": operator.eq, "!=": operator.ne}
_CONSTS = [0, 1, 2, 3, 16, 17, 64, 1280, 8192, MAX_DIM - 1, MAX_DIM, MAX_DIM + 5]


def _random_expr(rng: random.Random, depth: int, consts: list[int] = _CONSTS,
                 variables: tuple[str, ...] = VARIABLES) -> tuple[str, Oracle]:
    """A random grammar-valid expression over `variables` and an independent Python oracle."""
    roll = rng.random()
    if depth == 0 or roll < 0.35:
        var, op, const = rng.choice(variables), rng.choice(list(_OPS)), rng.choice(consts)
        index, fn = variables.index(var), _OPS[op]
        if rng.random() < 0.5:
            return f"{var} {op} {const}", lambda *p: fn(p[index], const)
        return f"{const} {op} {var}", lambda *p: fn(const, p[index])
    if roll < 0.45:
        value = rng.random() < 0.5
        return ("true" if value else "False"), lambda *p: value
    if roll < 0.6:
        text, inner = _random_expr(rng, depth - 1, consts, variables)
        return f"not ({text})", lambda *p: not inner(*p)
    (lt, lf), (rt, rf) = (_random_expr(rng, depth - 1, consts, variables),
                          _random_expr(rng, depth - 1, consts, variables))
    if rng.random() < 0.5:
        return f"({lt}) and ({rt})", lambda *p: lf(*p) and rf(*p)
    return f"({lt}) or ({rt})", lambda *p: lf(*p) or rf(*p)


def _sample_points(rng: random.Random, count: int) -> list[tuple[int, int, int]]:
    near = sorted({min(max(c + d, 1), MAX_DIM) for c in _CONSTS for d in (-1, 0, 1)})
    def one() -> int:
        return rng.choice(near) if rng.random() < 0.7 else rng.randint(1, MAX_DIM)
    return [(one(), one(), one()) for _ in range(count)]


def test_matches_agrees_with_brute_force() -> None:
    rng = random.Random(20240611)
    points = _sample_points(rng, 150)
    parsed = rejected = 0
    for _ in range(300):
        text, oracle = _random_expr(rng, depth=3)
        try:
            cond = parse_condition(text)
        except ConditionError as exc:
            assert "never true" in str(exc), text
            assert not any(oracle(*p) for p in points), text
            rejected += 1
            continue
        parsed += 1
        for p in points:
            assert cond.matches(*p) == oracle(*p), (text, p)
    assert parsed > 100 and rejected > 0


def test_chained_comparison_matches_python_chaining() -> None:
    cond = parse_condition("1 < m <= 64")
    for m in range(0, 70):
        assert cond.matches(m, 1, 1) == (1 < m <= 64)


# --------------------------------------------------------------- rule table

VLLM_LIKE = ("m <= 16 and n <= 1280", "m <= 16", "m <= 64 and n <= 1280", "m <= 64",
             "m <= 128", "m >= 8192 and k >= 6144", "true")


def test_realistic_table_passes() -> None:
    check_rule_table(table(*VLLM_LIKE))


def test_gap_reports_exact_point() -> None:
    with pytest.raises(RuleTableError) as info:
        check_rule_table(table("m <= 16", "m > 64"))
    err = info.value
    assert err.rule_index is None and err.point == {"m": 17, "n": 1, "k": 1}
    assert "no dispatch rule matches m=17, n=1, k=1" in str(err)
    assert "end the table with 'true'" in str(err)


def test_gap_in_second_variable_and_empty_table() -> None:
    with pytest.raises(RuleTableError) as info:
        check_rule_table(table("m <= 16", "m > 16 and n != 1280"))
    assert info.value.point == {"m": 17, "n": 1280, "k": 1}
    with pytest.raises(RuleTableError) as info:
        check_rule_table([])
    assert info.value.point == {"m": 1, "n": 1, "k": 1}


def test_single_point_gap_is_found_not_sampled() -> None:
    with pytest.raises(RuleTableError) as info:
        check_rule_table(table("k != 777777", "m != 123456"))
    assert info.value.point == {"m": 123456, "n": 1, "k": 777777}


def test_unreachable_rule_index() -> None:
    with pytest.raises(RuleTableError) as info:
        check_rule_table(table("m <= 16", "m <= 64", "m <= 128", "m <= 8", "true"))
    err = info.value
    assert err.rule_index == 3 and err.point is None
    assert str(err) == ("rule 3 ('m <= 8') can never be chosen: earlier rules "
                        "cover every problem it matches")


def test_unreachable_by_union_of_earlier_rules() -> None:
    with pytest.raises(RuleTableError) as info:
        check_rule_table(table("m <= 16 or n > 9", "n <= 9", "m == 3 and n == 9", "true"))
    assert info.value.rule_index == 2
    with pytest.raises(RuleTableError) as info:
        check_rule_table(table("true", "m <= 16"))
    assert info.value.rule_index == 1


def _exact_against_brute_force(rng: random.Random, grid: list, variables: tuple[str, ...],
                               constants: list[int]) -> None:
    """60 random rule tables: check_rule_table agrees with a brute-force walk of `grid`."""
    verdicts = set()
    for _ in range(60):
        rules: list[tuple[Condition, Oracle]] = []
        target = rng.randint(1, 4)
        while len(rules) < target:
            text, oracle = _random_expr(rng, 2, constants, variables)
            try:
                rules.append((parse_condition(text, variables), oracle))
            except ConditionError:
                pass
        firsts = [next((i for i, (_, f) in enumerate(rules) if f(*p)), None) for p in grid]
        gaps = [p for p, i in zip(grid, firsts) if i is None]
        unreachable = [i for i in range(len(rules)) if i not in firsts]
        try:
            check_rule_table([c for c, _ in rules])
            verdicts.add("ok")
            assert not gaps and not unreachable
        except RuleTableError as err:
            if gaps:
                verdicts.add("gap")
                assert err.point == dict(zip(variables, gaps[0])) and err.rule_index is None
            else:
                verdicts.add("unreachable")
                assert err.rule_index == unreachable[0] and err.point is None
    assert verdicts == {"ok", "gap", "unreachable"}


def test_check_rule_table_is_exact_against_brute_force() -> None:
    """Constants <= 8 make every value >= 9 behave alike, so a 1..10 grid is exhaustive."""
    grid = [(m, n, k) for m in range(1, 11) for n in range(1, 11) for k in range(1, 11)]
    _exact_against_brute_force(random.Random(7), grid, VARIABLES, list(range(9)))


def test_oversized_table_is_refused() -> None:
    rules = [f"m == {i} and n == {i} and k == {i}" for i in range(1, 140)] + ["true"]
    with pytest.raises(RuleTableError, match="too fine-grained"):
        check_rule_table(table(*rules))


def test_first_match() -> None:
    rules = table(*VLLM_LIKE)
    assert first_match(rules, 8, 1000, 1) == 0
    assert first_match(rules, 8, 4096, 1) == 1
    assert first_match(rules, 17, 1280, 1) == 2
    assert first_match(rules, 64, 1281, 1) == 3
    assert first_match(rules, 100, 1, 1) == 4
    assert first_match(rules, 8192, 1, 6144) == 5
    assert first_match(rules, 8192, 1, 6143) == 6
    assert first_match(table("m <= 16"), 17, 1, 1) is None
    assert first_match([], 1, 1, 1) is None


# ------------------------------------------- op-family-declared variables

MOE = ("m", "n", "k", "experts", "tokens_per_expert")


def _sample_points_over(rng: random.Random, count: int, width: int) -> list[tuple[int, ...]]:
    near = sorted({min(max(c + d, 1), MAX_DIM) for c in _CONSTS for d in (-1, 0, 1)})
    def one() -> int:
        return rng.choice(near) if rng.random() < 0.7 else rng.randint(1, MAX_DIM)
    return [tuple(one() for _ in range(width)) for _ in range(count)]


def test_five_variable_condition_parses_matches_and_thresholds() -> None:
    cond = parse_condition("experts >= 8 and 16 < tokens_per_expert <= 64 or m <= 4", MOE)
    assert cond.variables == MOE and cond.source.startswith("experts")
    assert all(len(clause) == 2 * len(MOE) for clause in cond.clauses)
    assert cond.matches(100, 1, 1, 8, 17) and cond.matches(100, 1, 1, MAX_DIM, 64)
    assert cond.matches(4, 1, 1, 1, 1)
    assert not cond.matches(100, 1, 1, 7, 17) and not cond.matches(100, 1, 1, 8, 16)
    assert not cond.matches(5, 1, 1, 8, 65)
    assert cond.thresholds() == {"m": (5,), "n": (), "k": (), "experts": (8,),
                                 "tokens_per_expert": (17, 65)}
    assert list(cond.thresholds()) == list(MOE)
    assert list(parse_condition("true", MOE).thresholds()) == list(MOE)
    assert first_match([parse_condition("experts > 8", MOE), cond], 100, 1, 1, 8, 17) == 1
    assert first_match([parse_condition("experts > 8", MOE)], 1, 1, 1, 8, 1) is None


def test_five_variable_matches_agree_with_brute_force() -> None:
    rng = random.Random(5)
    points = _sample_points_over(rng, 150, len(MOE))
    parsed = rejected = 0
    for _ in range(300):
        text, oracle = _random_expr(rng, 3, _CONSTS, MOE)
        try:
            cond = parse_condition(text, MOE)
        except ConditionError as exc:
            assert "never true" in str(exc), text
            assert not any(oracle(*p) for p in points), text
            rejected += 1
            continue
        parsed += 1
        for p in points:
            assert cond.matches(*p) == oracle(*p), (text, p)
    assert parsed > 100 and rejected > 0


@pytest.mark.parametrize("variables", [("k", "m", "n"), ("tokens",), ("experts", "m"),
                                       ("a", "b", "c", "d")])
def test_other_variable_counts_and_orders_agree_with_brute_force(variables: tuple[str, ...]) -> None:
    """Three variables in another order take the unrolled path; 1, 2, 4 the generic one."""
    rng = random.Random(len(variables))
    points = _sample_points_over(rng, 80, len(variables))
    parsed = 0
    for _ in range(150):
        text, oracle = _random_expr(rng, 3, _CONSTS, variables)
        try:
            cond = parse_condition(text, variables)
        except ConditionError:
            continue
        parsed += 1
        for p in points:
            assert cond.matches(*p) == oracle(*p), (text, p)
    assert parsed > 50
    reordered = parse_condition("m <= 16", ("k", "m", "n"))
    assert reordered.matches(17, 16, 1) and not reordered.matches(1, 17, 1)


def test_matches_wants_one_value_per_variable() -> None:
    with pytest.raises(TypeError, match="takes 5 values"):
        parse_condition("experts > 1", MOE).matches(1, 2, 3)
    with pytest.raises(TypeError, match="takes 3 values"):
        parse_condition("m > 1").matches(1, 2, 3, 4)
    with pytest.raises(TypeError, match="takes 3 values"):
        parse_condition("m > 1").matches(1, 2)


def test_gap_in_five_variables_reports_every_variable() -> None:
    with pytest.raises(RuleTableError) as info:
        check_rule_table([parse_condition(t, MOE) for t in
                          ("experts <= 8", "experts > 8 and tokens_per_expert > 16")])
    err = info.value
    assert err.rule_index is None
    assert err.point == {"m": 1, "n": 1, "k": 1, "experts": 9, "tokens_per_expert": 1}
    assert list(err.point) == list(MOE)
    assert "no dispatch rule matches m=1, n=1, k=1, experts=9, tokens_per_expert=1" in str(err)


def test_single_point_gap_in_four_variables() -> None:
    four = ("m", "n", "k", "experts")
    with pytest.raises(RuleTableError) as info:
        check_rule_table([parse_condition(t, four) for t in ("k != 777777", "experts != 3")])
    assert info.value.point == {"m": 1, "n": 1, "k": 777777, "experts": 3}


def test_unreachable_rule_in_five_variables() -> None:
    rules = [parse_condition(t, MOE) for t in
             ("experts <= 8 or tokens_per_expert > 100", "tokens_per_expert <= 100",
              "experts == 9 and tokens_per_expert == 50", "true")]
    with pytest.raises(RuleTableError) as info:
        check_rule_table(rules)
    assert info.value.rule_index == 2 and info.value.point is None
    check_rule_table(rules[:2])


def test_empty_table_over_declared_variables() -> None:
    with pytest.raises(RuleTableError) as info:
        check_rule_table([], variables=MOE)
    assert info.value.point == dict.fromkeys(MOE, 1)
    check_rule_table([parse_condition("true", MOE)], variables=MOE)


def test_check_rule_table_is_exact_in_four_variables() -> None:
    """Constants <= 4 make every value >= 5 behave alike, so a 1..6 grid is exhaustive."""
    four = ("m", "n", "experts", "tokens_per_expert")
    grid = [(a, b, c, d) for a in range(1, 7) for b in range(1, 7)
            for c in range(1, 7) for d in range(1, 7)]
    _exact_against_brute_force(random.Random(11), grid, four, list(range(5)))


def test_oversized_five_variable_table_is_refused_before_iterating() -> None:
    """21 points (1..21) on each of 5 axes is 4,084,101 > MAX_POINTS, though each axis is small."""
    rules = [parse_condition(f"{v} == {i}", MOE) for v in MOE for i in range(1, 21)]
    with pytest.raises(RuleTableError, match="too fine-grained") as info:
        check_rule_table(rules + [parse_condition("true", MOE)])
    assert f"({21 ** 5} critical points > {MAX_POINTS})" in str(info.value)


def test_unknown_variable_names_the_declared_variables() -> None:
    with pytest.raises(ConditionError) as info:
        parse_condition("groups > 2", MOE)
    assert str(info.value).startswith(
        "unknown variable 'groups' in dispatch condition 'groups > 2'; "
        "allowed: m, n, k, experts, tokens_per_expert (at column 1)")
    with pytest.raises(ConditionError, match="unknown variable 'experts'.*allowed: m, n, k "):
        parse_condition("experts > 2")
    with pytest.raises(ConditionError) as info:
        parse_condition("experts < 4.0", MOE)
    assert "allowed: integer literals >= 0, variables m, n, k, experts, tokens_per_expert, " \
        "comparisons" in str(info.value)
    with pytest.raises(ConditionError, match="syntax error.*variables m, n, k, experts, "):
        parse_condition("experts <", ("m", "n", "k", "experts"))
    with pytest.raises(ConditionError, match="bare variable 'experts'"):
        parse_condition("experts", MOE)
    with pytest.raises(ConditionError) as info:
        parse_condition("m < 4.0")
    assert "variables m, n, k, comparisons" in str(info.value)


def test_mismatched_variables_in_one_table() -> None:
    with pytest.raises(RuleTableError, match="must share the same variables") as info:
        check_rule_table([parse_condition("m <= 16"), parse_condition("true", MOE)])
    assert info.value.rule_index == 1 and info.value.point is None
    assert "rule 1 ('true') is over variables (m, n, k, experts, tokens_per_expert) but " \
        "rule 0 ('m <= 16') is over (m, n, k)" in str(info.value)
    with pytest.raises(RuleTableError, match="the table declares") as info:
        check_rule_table([parse_condition("true")], variables=MOE)
    assert info.value.rule_index == 0
    with pytest.raises(RuleTableError, match="must share the same variables"):
        check_rule_table([parse_condition("true", ("m", "n", "k")),
                          parse_condition("true", ("n", "m", "k"))])


@pytest.mark.parametrize(
    "variables",
    [(), ["m", "n", "k"], "mnk", ("m", "m"), ("m", "n", "k", "n"), ("m", "1x"), ("m n",),
     ("m", ""), ("m", 3), ("m", "and"), ("true",), ("false", "m"), ("or",), ("not",),
     ("if",), ("None",), ("m", "ﬁ")],
)
def test_invalid_variables_are_refused(variables: object) -> None:
    with pytest.raises(ValueError) as info:
        parse_condition("true", variables)  # type: ignore[arg-type]
    assert not isinstance(info.value, ConditionError)
    with pytest.raises(ValueError):
        check_rule_table([], variables=variables)  # type: ignore[arg-type]
