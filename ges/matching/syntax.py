"""The one-line syntax of the CLI: ``--where 'price > 10'`` constraints and ``--attr name=value``.

Value typing: a value is an int if it parses as one, else a float if it parses as one, else a
string; ``name:str=value`` (for attributes) or a quoted value (for constraints) forces a string.
Constraints come out as ``ges.matching.model.Constraint`` with canonical operator names.
"""

from __future__ import annotations

import re

from ges.errors import UserInputError
from ges.matching.model import ALIASES, INT_MAX, INT_MIN, Constraint, Value


def parse_value(text: str) -> Value:
    """``true``/``false`` are booleans; else an int if it parses as one, else a float if it
    parses as one, else the string itself."""
    if text in _BOOLS:
        return _BOOLS[text]
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        return text
    return value if value == value else text  # keep "nan" a string: it never compares equal


def parse_attr(text: str) -> tuple[str, Value]:
    """``name=value`` or ``name:str=value`` → (name, typed value); raises UserInputError."""
    name, sep, raw = text.partition("=")
    if not sep or not name.strip():
        raise UserInputError(f"--attr {text!r}: expected name=value (or name:str=value)")
    name = name.strip()
    force_str = False
    if ":" in name:
        name, _, kind = name.partition(":")
        if kind not in ("str", "int", "float", "bool"):
            raise UserInputError(
                f"--attr {text!r}: unknown type {kind!r} (use str, int, float or bool)"
            )
        force_str = kind == "str"
        if not _NAME.fullmatch(name):
            raise UserInputError(
                f"--attr {text!r}: attribute name must be a word ([A-Za-z_][\\w.-]*)"
            )
        if kind == "bool":
            if raw not in _BOOLS:
                raise UserInputError(f"--attr {text!r}: {raw!r} is not true or false")
            return name, _BOOLS[raw]
        if kind in ("int", "float"):
            try:
                value = int(raw) if kind == "int" else float(raw)
            except ValueError:
                article = "an" if kind == "int" else "a"
                raise UserInputError(f"--attr {text!r}: {raw!r} is not {article} {kind}") from None
            return name, _in_range(value, text)
    if not _NAME.fullmatch(name):
        raise UserInputError(f"--attr {text!r}: attribute name must be a word ([A-Za-z_][\\w.-]*)")
    return name, raw if force_str else _in_range(parse_value(raw), text)


def _in_range(value: Value, text: str) -> Value:
    if type(value) is int and not INT_MIN <= value <= INT_MAX:
        raise UserInputError(f"--attr {text!r}: integer outside the signed 64-bit range")
    return value


_BOOLS = {"true": True, "false": False}


_NAME = re.compile(r"[A-Za-z_][\w.\-]*")
_WHERE = re.compile(
    r"\s*(?P<attr>[A-Za-z_][\w.\-]*|@topic)"
    r"(?:\s+(?P<exists>exists)\s*$"
    r"|(?:\s*(?P<op>==|!=|<=|>=|=|<|>)|\s+(?P<word>prefix|in|topic)\b)\s*(?P<value>.*?)\s*$)"
)


def _typed(raw: str) -> Value:
    if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "'\"":
        return raw[1:-1]
    return parse_value(raw)


def _split_list(raw: str) -> list[str]:
    """``a, 'b,c', "d"`` → ``["a", "'b,c'", '"d"']``: commas inside quotes do not split."""
    parts, current, quote = [], [], None
    for ch in raw:
        if quote:
            current.append(ch)
            if ch == quote:
                quote = None
        elif ch == ",":
            parts.append("".join(current).strip())
            current = []
        else:
            if ch in "'\"" and not "".join(current).strip():
                quote = ch
            current.append(ch)
    parts.append("".join(current).strip())
    return parts


def parse_where(text: str) -> Constraint:
    """``'price > 10'``, ``'sym = IBM'``, ``"sym = '42'"`` (quoted: string), ``'sym exists'``,
    ``'sym in IBM,HPQ'`` (comma-separated values, each typed on its own), ``'@topic topic
    sensors/+/temp'`` (an MQTT topic filter; ``@topic`` is an MQTT publish's topic)."""
    m = _WHERE.fullmatch(text)
    if not m:
        raise UserInputError(
            f"--where {text!r}: expected 'name OP value' with OP one of "
            "= != < <= > >= prefix in topic, or 'name exists'"
        )
    if m["exists"]:
        return Constraint(m["attr"], "exists")
    raw = m["value"]
    op = m["op"] or m["word"]
    if not raw:
        raise UserInputError(f"--where {text!r}: missing value after {op!r}")
    if raw[0] in "=<>!" and op not in ("prefix", "topic"):
        raise UserInputError(f"--where {text!r}: value {raw!r} starts with an operator; quote it")
    if op == "in":
        if raw.startswith("(") and raw.endswith(")"):  # as str() writes it: in (a, b)
            raw = raw[1:-1]
        parts = _split_list(raw)
        if any(not p for p in parts):
            raise UserInputError(f"--where {text!r}: empty value in the list (quote '' for one)")
        value = tuple(_typed(p) for p in parts)
    elif op in ("prefix", "topic") and raw[0] not in "'\"":
        value = raw  # always a string: 'code prefix 10' means "10…"
    else:
        value = _typed(raw)
    try:
        return Constraint(m["attr"], ALIASES.get(op, op), value)
    except ValueError as exc:
        raise UserInputError(f"--where {text!r}: {exc}") from None
