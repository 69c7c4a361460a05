"""A small filter language for ``--where`` and the web page, parsed into a pyarrow expression.

Never SQL: the text is tokenised and parsed here, every column is checked against the table's
schema and every literal is converted to that column's type, so the result can only ever be a
``pyarrow.compute.Expression`` that Arrow evaluates while scanning. The grammar::

    filter     := or
    or         := and ( OR and )*
    and        := unary ( AND unary )*
    unary      := NOT unary | '(' or ')' | condition
    condition  := column op literal
                | column [NOT] IN '(' literal ( ',' literal )* ')'
                | column IS [NOT] NULL
    op         := = | != | <> | < | <= | > | >=
    literal    := number | 'string' ('' escapes a quote) | TRUE | FALSE

Keywords are case-insensitive. Timestamp and date columns take quoted literals
``'YYYY-MM-DD'`` or ``'YYYY-MM-DD HH:MM[:SS]'`` (UTC unless an offset is given). The column is
always on the left: ``1 = 1`` is rejected, as is anything after the last condition (``;``).
"""

from __future__ import annotations

import datetime as dt
import decimal
import operator
import re
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from spark_jobs.errors import InspectError

__all__ = ["MAX_FILTER_LENGTH", "TIME_PATTERN", "is_number", "parse_where"]

MAX_FILTER_LENGTH = 2000
_MAX_DEPTH = 32
_MAX_IN_VALUES = 1000
_KEYWORDS = ("AND", "OR", "NOT", "IN", "IS", "NULL", "TRUE", "FALSE")
_OPS = {"=": operator.eq, "!=": operator.ne, "<>": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt,
        ">=": operator.ge}
_EXAMPLE = "page = '/home' AND views >= 10"
_TOKEN = re.compile(r"""
    (?P<ws>\s+)
  | (?P<number>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)
  | (?P<string>'(?:[^']|'')*')
  | (?P<word>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<op><=|>=|!=|<>|=|<|>)
  | (?P<punct>[(),])
  | (?P<bad>.)
""", re.VERBOSE)
TIME_PATTERN = re.compile(r"^\d{4}-\d{2}-\d{2}(?:[ T]\d{2}:\d{2}(?::\d{2}(?:\.\d{1,6})?)?)?(?:Z|[+-]\d{2}:?\d{2})?$")


@dataclass(frozen=True)
class _Tok:
    kind: str  # number, string, word, keyword, op, punct, end
    text: str
    pos: int  # 0-based offset in the filter text


def _fail(text: str, pos: int, message: str, hint: str | None = None) -> InspectError:
    shown = re.sub(r"\s", " ", text)  # one line, so the caret stays under the position
    hint = hint or f"write conditions as <column> <op> <value> joined by AND/OR, e.g. {_EXAMPLE}"
    return InspectError(f"bad filter at position {pos + 1}: {message}\n  {shown}\n  {' ' * pos}^\n{hint}")


def _tokens(text: str) -> list[_Tok]:
    out: list[_Tok] = []
    for m in _TOKEN.finditer(text):
        kind, word, pos = m.lastgroup or "", m.group(), m.start()
        if kind == "bad" and word == "'":
            raise _fail(text, pos, "this quoted string is never closed", "close it with ' (write '' for a quote inside)")
        if kind == "bad":
            raise _fail(text, pos, f"unexpected character {word!r}",
                        "a filter holds conditions joined by AND/OR, not SQL statements or functions; "
                        f"e.g. {_EXAMPLE}")
        if kind == "word" and word.upper() in _KEYWORDS:
            kind, word = "keyword", word.upper()
        if kind != "ws":
            out.append(_Tok(kind, word, pos))
    out.append(_Tok("end", "", len(text)))
    return out


def _describe(tok: _Tok) -> str:
    if tok.kind == "end":
        return "the end of the filter"
    return f"the {tok.kind} {tok.text}" if tok.kind in ("number", "string", "keyword") else repr(tok.text)


class _Parser:
    def __init__(self, text: str, schema: pa.Schema) -> None:
        self.text = text
        self.schema = schema
        self.toks = _tokens(text)
        self.i = 0

    @property
    def tok(self) -> _Tok:
        return self.toks[self.i]

    def next(self) -> _Tok:
        self.i += 1
        return self.toks[self.i - 1]

    def fail(self, tok: _Tok, message: str, hint: str | None = None) -> InspectError:
        return _fail(self.text, tok.pos, message, hint)

    def accept(self, kind: str, text: str) -> bool:
        hit = self.tok.kind == kind and self.tok.text == text
        self.i += hit
        return hit

    def keyword(self, word: str) -> bool:
        return self.accept("keyword", word)

    def expect_punct(self, ch: str, what: str) -> None:
        if not self.accept("punct", ch):
            raise self.fail(self.tok, f"expected {what}, found {_describe(self.tok)}")

    def parse(self) -> pc.Expression:
        expr = self.or_(0)
        if self.tok.kind != "end":
            raise self.fail(self.tok, f"expected AND, OR or the end of the filter, found {_describe(self.tok)}")
        return expr

    def or_(self, depth: int) -> pc.Expression:
        expr = self.and_(depth)
        while self.keyword("OR"):
            expr = expr | self.and_(depth)
        return expr

    def and_(self, depth: int) -> pc.Expression:
        expr = self.unary(depth)
        while self.keyword("AND"):
            expr = expr & self.unary(depth)
        return expr

    def unary(self, depth: int) -> pc.Expression:
        if depth > _MAX_DEPTH:
            raise self.fail(self.tok, f"nested more than {_MAX_DEPTH} levels deep", "simplify the filter")
        if self.keyword("NOT"):
            return ~self.unary(depth + 1)
        if self.accept("punct", "("):
            expr = self.or_(depth + 1)
            self.expect_punct(")", "')' to close the parenthesis")
            return expr
        return self.condition()

    def condition(self) -> pc.Expression:
        tok = self.next()
        if tok.kind != "word":
            raise self.fail(tok, f"expected a column name, found {_describe(tok)}",
                            f"each condition starts with a column, e.g. {_EXAMPLE}; columns are "
                            f"{', '.join(self.schema.names)}")
        if tok.text not in self.schema.names:
            raise self.fail(tok, f"unknown column {tok.text!r}", f"columns are {', '.join(self.schema.names)}")
        field = self.schema.field(tok.text)
        if not _filterable(field.type):
            raise self.fail(tok, f"column {tok.text!r} is {field.type}, which cannot be filtered",
                            "filter on numbers, strings, booleans, dates or timestamps")
        col = pc.field(tok.text)
        op = self.tok
        if op.kind == "op":
            return _OPS[self.next().text](col, pc.scalar(self.literal(field)))
        if self.keyword("IS"):
            negate = self.keyword("NOT")
            if not self.keyword("NULL"):
                raise self.fail(self.tok, f"expected NULL after IS{' NOT' if negate else ''}, found "
                                f"{_describe(self.tok)}")
            return ~col.is_null() if negate else col.is_null()
        negate = self.keyword("NOT")
        if self.keyword("IN"):
            self.expect_punct("(", "'(' to open the IN list")
            values = [self.literal(field)]
            while self.accept("punct", ","):
                values.append(self.literal(field))
                if len(values) > _MAX_IN_VALUES:
                    raise self.fail(self.tok, f"more than {_MAX_IN_VALUES} values in one IN list")
            self.expect_punct(")", "',' or ')' in the IN list")
            expr = col.isin(pa.array(values, type=field.type))
            return (~expr & col.is_valid()) if negate else expr  # NULL is never in, nor not in, a list
        raise self.fail(op, f"expected an operator (=, !=, <, <=, >, >=, IN, IS NULL) after {tok.text}, found "
                            f"{_describe(op)}")

    def literal(self, field: pa.Field) -> Any:
        tok = self.next()
        t = field.type
        if tok.kind == "keyword" and tok.text == "NULL":
            raise self.fail(tok, "NULL cannot be compared with an operator", f"write {field.name} IS NULL or "
                            f"{field.name} IS NOT NULL")
        if pa.types.is_boolean(t):
            if tok.kind == "keyword" and tok.text in ("TRUE", "FALSE"):
                return tok.text == "TRUE"
            raise self.fail(tok, f"column {field.name!r} is boolean; expected TRUE or FALSE, found {_describe(tok)}")
        if is_number(t):
            if tok.kind != "number":
                raise self.fail(tok, f"column {field.name!r} is {t}; expected a number, found {_describe(tok)}",
                                f"write numbers unquoted, e.g. {field.name} >= 10")
            if pa.types.is_integer(t) and not re.fullmatch(r"[-+]?\d+", tok.text):
                raise self.fail(tok, f"column {field.name!r} is {t}; expected a whole number, found {tok.text}")
            number = decimal.Decimal if pa.types.is_decimal(t) else int if pa.types.is_integer(t) else float
            return number(tok.text)
        if tok.kind != "string":
            kind = "a date" if pa.types.is_date(t) else "a timestamp" if pa.types.is_timestamp(t) else "a string"
            raise self.fail(tok, f"column {field.name!r} is {t}; expected {kind} in single quotes, found "
                            f"{_describe(tok)}", f"quote the value, e.g. {field.name} = '{_sample(t)}'")
        value = tok.text[1:-1].replace("''", "'")
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            return value
        return self.timestamp(tok, field, value)  # the other types :func:`_filterable` lets through

    def timestamp(self, tok: _Tok, field: pa.Field, value: str) -> Any:
        t = field.type
        if not TIME_PATTERN.match(value):
            raise self.fail(tok, f"{value!r} is not a date or time", f"use 'YYYY-MM-DD' or 'YYYY-MM-DD HH:MM:SS' (UTC), "
                            f"e.g. {field.name} >= '{_sample(t)}'")
        try:
            parsed = dt.datetime.fromisoformat(value)
        except ValueError as exc:
            raise self.fail(tok, f"{value!r} is not a valid date or time ({exc})") from None
        if pa.types.is_date(t):
            if len(value) != 10:
                raise self.fail(tok, f"column {field.name!r} is a date; expected 'YYYY-MM-DD', found {tok.text}")
            return parsed.date()
        parsed = (parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=dt.UTC)).astimezone(dt.UTC)
        return parsed if getattr(t, "tz", None) else parsed.replace(tzinfo=None)


def _sample(t: pa.DataType) -> str:
    return "2024-03-01" if pa.types.is_date(t) else "2024-03-01 12:00:00" if pa.types.is_timestamp(t) else "text"


def is_number(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t)


def _filterable(t: pa.DataType) -> bool:
    return (pa.types.is_boolean(t) or is_number(t) or pa.types.is_string(t) or pa.types.is_large_string(t)
            or pa.types.is_timestamp(t) or pa.types.is_date(t))


def parse_where(text: str, schema: pa.Schema) -> pc.Expression:
    """Parse a ``--where`` filter (e.g. ``page = '/home' AND window_start >= '2024-03-01'``) against the table's
    ``schema``, which must hold every column named, into an Arrow expression; :class:`InspectError` names the
    position, what was found and how to write it instead."""
    if len(text) > MAX_FILTER_LENGTH:
        raise InspectError(f"filter is {len(text)} characters long; the limit is {MAX_FILTER_LENGTH}")
    if not text.strip():
        raise InspectError(f"empty filter; write conditions like {_EXAMPLE}, or leave the filter out")
    return _Parser(text, schema).parse()
