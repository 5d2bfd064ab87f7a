"""A column holding a list of numbers: a native array on PostgreSQL, JSON text elsewhere
(docs/design/resume.md#steps-continue).

The metric points of a chunk (``MetricChunk``) are three such columns. On
PostgreSQL they are ``bigint[]`` / ``double precision[]``, written as binary
parameters built straight from numpy (``pg_array``) and unnested by the
``runs_metricpoint`` view. SQLite has no arrays: the list is JSON text,
NaN written ``null`` and ±Infinity ``±1e999`` (which SQLite's and Python's
JSON readers both read back as infinities), unnested by ``json_each``.
"""

import json
import math
import struct

import numpy as np
from django.db import models
from psycopg.adapt import Dumper
from psycopg.pq import Format


class PgArray(bytes):
    """An array in PostgreSQL's binary form (``pg_array``): psycopg sends it as it is, typed ``array_oid``."""

    array_oid = 0


class _Int8Array(PgArray):
    array_oid = 1016  # bigint[]


class _Float8Array(PgArray):
    array_oid = 1022  # double precision[]


# kind: (column type on PostgreSQL, element type oid, numpy dtype of an element in PostgreSQL's binary form, bytes)
_KINDS = {"int8": ("bigint[]", 20, ">i8", _Int8Array), "float8": ("double precision[]", 701, ">f8", _Float8Array)}
_NOT_FINITE = {math.inf: "1e999", -math.inf: "-1e999"}  # anything else not finite (NaN) is null


def json_numbers(values) -> str:
    """``values`` (ints or floats, None or NaN for NaN) as a JSON array that SQLite's ``json_each`` reads back.

    ``repr`` keeps every float exact; NaN becomes ``null`` and ±Infinity ``±1e999``.
    """
    isfinite = math.isfinite
    return (
        "[" + ",".join([repr(v) if v is not None and isfinite(v) else _NOT_FINITE.get(v, "null") for v in values]) + "]"
    )


def pg_array(kind: str, values: np.ndarray) -> PgArray:
    """PostgreSQL's binary form of a one-dimensional array of ``kind`` ("int8" or "float8") holding ``values``.

    What the server reads for a binary array parameter (or a binary
    ``COPY`` field): a header (one dimension, no NULL element, the element
    type's oid, the length, lower bound 1), then each element as a 4-byte
    length and 8 big-endian bytes. NaN stays NaN (the view turns it into
    NULL). A cursor passes it as a parameter once ``register_pg_arrays`` ran on it.
    """
    _, oid, dtype, kind_bytes = _KINDS[kind]
    body = np.empty(len(values), dtype=[("size", ">i4"), ("value", dtype)])
    body["size"] = 8
    body["value"] = values
    return kind_bytes(struct.pack(">iiIii", 1, 0, oid, len(values), 1) + body.tobytes())


class _PgArrayDumper(Dumper):
    format = Format.BINARY

    def __init__(self, cls, context=None):
        super().__init__(cls, context)
        self.oid = cls.array_oid

    def dump(self, obj: PgArray) -> bytes:
        return obj


def register_pg_arrays(cursor) -> None:
    """Let psycopg ``cursor`` (a server-side binding ``psycopg.Cursor``) take ``pg_array`` values as parameters."""
    for kind in _KINDS.values():
        cursor.adapters.register_dumper(kind[3], _PgArrayDumper)


class NumberArrayField(models.Field):
    """A list of ``int`` (``kind="int8"``) or ``float`` (``kind="float8"``; NaN allowed) values."""

    def __init__(self, *args, kind: str = "int8", **kwargs):
        if kind not in _KINDS:
            raise ValueError(f"kind must be one of {sorted(_KINDS)}, got {kind!r}")
        self.kind = kind
        super().__init__(*args, **kwargs)

    def deconstruct(self):
        name, path, args, kwargs = super().deconstruct()
        kwargs["kind"] = self.kind
        return name, path, args, kwargs

    def db_type(self, connection):
        return _KINDS[self.kind][0] if connection.vendor == "postgresql" else "text"

    def get_db_prep_value(self, value, connection, prepared=False):
        if value is None:
            return None
        if connection.vendor == "postgresql":
            return [math.nan if v is None else v for v in value] if self.kind == "float8" else list(value)
        return json_numbers(value)

    def from_db_value(self, value, expression, connection):
        if value is None or isinstance(value, list):
            return value
        numbers = json.loads(value)
        return [math.nan if v is None else v for v in numbers] if self.kind == "float8" else numbers
