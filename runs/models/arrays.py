"""A column holding a list of numbers: a native array on PostgreSQL, JSON text elsewhere (SPEC F2).

The metric points of a chunk (``MetricChunk``) are three such columns. On
PostgreSQL they are ``bigint[]`` / ``double precision[]``, written by binary
``COPY`` straight from numpy (``pg_array``) and unnested by the
``runs_metricpoint`` view. SQLite has no arrays: the list is JSON text,
NaN written ``null`` and ±Infinity ``±1e999`` (which SQLite's and Python's
JSON readers both read back as infinities), unnested by ``json_each``.
"""

import json
import math
import struct

import numpy as np
from django.db import models

# kind: (column type on PostgreSQL, element type oid, numpy dtype of an element in PostgreSQL's binary form)
_KINDS = {"int8": ("bigint[]", 20, ">i8"), "float8": ("double precision[]", 701, ">f8")}
_NOT_FINITE = {math.inf: "1e999", -math.inf: "-1e999"}  # anything else not finite (NaN) is null


def json_numbers(values) -> str:
    """``values`` (ints or floats, None or NaN for NaN) as a JSON array that SQLite's ``json_each`` reads back.

    ``repr`` keeps every float exact; NaN becomes ``null`` and ±Infinity ``±1e999``.
    """
    isfinite = math.isfinite
    return "[" + ",".join([
        repr(v) if v is not None and isfinite(v) else _NOT_FINITE.get(v, "null") for v in values
    ]) + "]"


def pg_array(kind: str, values: np.ndarray) -> bytes:
    """PostgreSQL's binary form of a one-dimensional array of ``kind`` ("int8" or "float8") holding ``values``.

    What binary ``COPY`` expects for an array column: a header (one
    dimension, no NULL element, the element type's oid, the length, lower
    bound 1), then each element as a 4-byte length and 8 big-endian bytes.
    NaN stays NaN (the view turns it into NULL).
    """
    _, oid, dtype = _KINDS[kind]
    body = np.empty(len(values), dtype=[("size", ">i4"), ("value", dtype)])
    body["size"] = 8
    body["value"] = values
    return struct.pack(">iiIii", 1, 0, oid, len(values), 1) + body.tobytes()


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
