"""A sweep configuration (YAML or JSON text, or an already parsed object) checked and normalised
(docs/design/sweeps.md#sweeps).

The format follows W&B's::

    name: digits-lr            # optional
    method: grid | random | bayes
    metric: {name: val_loss, goal: minimize | maximize}
    parameters:
      lr: {min: 0.0001, max: 0.1, distribution: log_uniform_values}
      hidden: {values: [32, 64, 128]}
      epochs: {value: 5}
    program: python examples/sweep_training.py   # or an argv list
    run_cap: 20                # optional, >= 1

Every error is a ``ValidationFailed`` (400) naming the field as a dotted path
(``method``, ``metric.name``, ``parameters``, ``parameters.lr.values``,
``program``, ``run_cap``...).
"""

import json
import math
import re
import shlex
from dataclasses import dataclass

import yaml
from django.utils.translation import gettext as _

from mado.errors import ValidationFailed
from sweeps.models import MetricGoal, SweepMethod

DISTRIBUTIONS = ("uniform", "int_uniform", "log_uniform_values")
# Keys of W&B configs that mado accepts but does not use (the project comes from the request).
IGNORED_KEYS = ("description", "project", "entity")
KNOWN_KEYS = ("name", "method", "metric", "parameters", "program", "run_cap", *IGNORED_KEYS)
# A parameter becomes the program argument --name=value, so its name must be a plain word.
PARAMETER_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,99}\Z")
NAME_MAX, METRIC_MAX = 200, 250
# The three shapes of a parameter, by the keys each may hold.
PARAMETER_KINDS = {"values": {"values"}, "value": {"value"}, "range": {"min", "max", "distribution"}}


class _ConfigLoader(yaml.SafeLoader):
    """PyYAML follows YAML 1.1, where ``1e-4`` is a string; YAML 1.2 (and every W&B config) reads it as a float."""


_ConfigLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"), list("-+0123456789")
)


@dataclass(frozen=True)
class SweepConfig:
    """A checked configuration: the fields of ``sweeps.models.Sweep`` plus ``config`` (the object as submitted).

    ``parameters`` maps each name to ``{"values": [...]}``, ``{"value": x}``
    or ``{"min": a, "max": b, "distribution": d}``; ``program`` is an argv
    list; ``run_cap`` None means no limit (never for grid: the grid size).
    """

    name: str
    method: str
    metric_name: str
    metric_goal: str
    parameters: dict
    program: list[str]
    run_cap: int | None
    config: dict


def _fail(field: str, message: str, **values):
    """Raise ``ValidationFailed`` naming ``field``: ``message`` (translated) with ``values`` filled in."""
    raise ValidationFailed(message % values if values else message, field=field)


def _load(config) -> dict:
    if isinstance(config, str):
        try:
            config = yaml.load(config, Loader=_ConfigLoader)  # noqa: S506 - a SafeLoader subclass
        except yaml.YAMLError as exc:
            _fail("config", _("config is not valid YAML or JSON: %(error)s"), error=exc)
    if not isinstance(config, dict):
        _fail(
            "config",
            _("config must be a mapping (YAML) or an object (JSON) with method, metric, parameters and program"),
        )
    unknown = sorted(str(key) for key in config if key not in KNOWN_KEYS)
    if unknown:
        _fail(
            unknown[0],
            _("unknown key '%(key)s'; a sweep config has %(keys)s"),
            key=unknown[0],
            keys=", ".join(KNOWN_KEYS),
        )
    try:
        json.dumps(config, allow_nan=False)
    except (TypeError, ValueError) as exc:
        _fail("config", _("config must hold only text, numbers, booleans, lists and mappings: %(error)s"), error=exc)
    return config


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _scalar(value) -> bool:
    return value is None or isinstance(value, (str, bool)) or _is_number(value)


def _range(field: str, spec: dict) -> dict:
    low, high = spec.get("min"), spec.get("max")
    if not _is_number(low) or not _is_number(high):
        _fail(field, _("min and max must both be finite numbers"))
    if low >= high:
        _fail(f"{field}.max", _("max (%(max)s) must be greater than min (%(min)s)"), max=high, min=low)
    both_int = isinstance(low, int) and isinstance(high, int)
    distribution = spec.get("distribution", "int_uniform" if both_int else "uniform")
    if distribution not in DISTRIBUTIONS:
        _fail(f"{field}.distribution", _("distribution must be one of %(choices)s"), choices=", ".join(DISTRIBUTIONS))
    if distribution == "int_uniform" and not both_int:
        _fail(f"{field}.distribution", _("int_uniform needs integer min and max"))
    if distribution == "log_uniform_values" and low <= 0:
        _fail(f"{field}.min", _("log_uniform_values needs min > 0"))
    return {"min": low, "max": high, "distribution": distribution}


def _parameter(name, spec) -> dict:
    field = f"parameters.{name}"
    if not isinstance(name, str) or not PARAMETER_NAME.match(name):
        _fail(field, _("a parameter name must start with a letter or _ and use letters, digits, _ . - (at most 100)"))
    if not isinstance(spec, dict):
        _fail(field, _("a parameter must be a mapping with values, value, or min and max"))
    kinds = [kind for kind, keys in PARAMETER_KINDS.items() if keys & spec.keys()]
    if len(kinds) != 1:
        _fail(field, _("a parameter needs exactly one of: values (a list), value, or min and max"))
    extra = sorted(str(key) for key in spec if key not in PARAMETER_KINDS[kinds[0]])
    if extra:
        _fail(f"{field}.{extra[0]}", _("unknown key '%(key)s' for this parameter"), key=extra[0])
    if kinds[0] == "value":
        if not _scalar(spec["value"]):
            _fail(f"{field}.value", _("value must be a string, number, boolean or null"))
        return {"value": spec["value"]}
    if kinds[0] == "range":
        return _range(field, spec)
    values = spec["values"]
    if not isinstance(values, list) or not values:
        _fail(f"{field}.values", _("values must be a non-empty list"))
    if not all(_scalar(value) for value in values):
        _fail(f"{field}.values", _("every value must be a string, number, boolean or null"))
    if len({repr(value) for value in values}) != len(values):
        _fail(f"{field}.values", _("values must not repeat"))
    return {"values": values}


def _parameters(raw, method: str) -> dict:
    if not isinstance(raw, dict) or not raw:
        _fail("parameters", _("parameters must be a non-empty mapping of name to its values or range"))
    parameters = {name: _parameter(name, spec) for name, spec in raw.items()}
    if method == SweepMethod.GRID:
        for name, spec in parameters.items():
            if "min" in spec:
                _fail(f"parameters.{name}", _("a grid sweep needs values or value for every parameter, not min/max"))
    return parameters


def grid_size(parameters: dict) -> int:
    """How many points the grid of normalised ``parameters`` has (a fixed value counts once)."""
    return math.prod(len(spec["values"]) if "values" in spec else 1 for spec in parameters.values())


def _program(raw) -> list[str]:
    if isinstance(raw, str):
        try:
            argv = shlex.split(raw)
        except ValueError as exc:
            _fail("program", _("program cannot be split into arguments: %(error)s"), error=exc)
    elif isinstance(raw, list) and all(isinstance(arg, str) and arg for arg in raw):
        argv = raw
    else:
        _fail("program", _('program must be a command line ("python train.py") or a list of non-empty strings'))
    if not argv:
        _fail("program", _("program must name the command to run"))
    return argv


def _run_cap(raw, method: str, parameters: dict) -> int | None:
    if raw is not None and (not isinstance(raw, int) or isinstance(raw, bool) or raw < 1):
        _fail("run_cap", _("run_cap must be an integer >= 1"))
    if method != SweepMethod.GRID:
        return raw
    size = grid_size(parameters)
    return size if raw is None else min(raw, size)


def _metric(raw) -> tuple[str, str]:
    if not isinstance(raw, dict):
        _fail("metric", _("metric must be a mapping with name and goal (minimize or maximize)"))
    name = raw.get("name")
    if not isinstance(name, str) or not name.strip():
        _fail("metric.name", _("metric.name must name the logged metric to optimise"))
    if len(name) > METRIC_MAX:
        _fail("metric.name", _("metric.name must be at most %(max)s characters"), max=METRIC_MAX)
    goal = raw.get("goal", MetricGoal.MINIMIZE)
    if goal not in MetricGoal.values:
        _fail("metric.goal", _("metric.goal must be one of %(choices)s"), choices=", ".join(MetricGoal.values))
    return name.strip(), goal


def sweep_config_parse(*, config) -> SweepConfig:
    """Check and normalise a sweep configuration (docs/design/sweeps.md#sweeps).

    ``config``: YAML or JSON text (``str``) or a parsed ``dict``. Returns a
    ``SweepConfig``. Raises ``ValidationFailed`` naming the field: ``config``
    (not a mapping / bad YAML / unknown key), ``method`` (not grid, random or
    bayes), ``metric`` / ``metric.name`` / ``metric.goal``, ``parameters``
    (missing or empty), ``parameters.<p>[.values|.min|.max|.distribution]``,
    ``program``, ``run_cap`` (not an integer >= 1). A grid's ``run_cap``
    defaults to, and is capped at, the grid size.
    """
    raw = _load(config)
    name = raw.get("name") or ""
    if not isinstance(name, str) or len(name) > NAME_MAX:
        _fail("name", _("name must be text of at most %(max)s characters"), max=NAME_MAX)
    method = raw.get("method")
    if method not in SweepMethod.values:
        _fail(
            "method",
            _("method must be one of %(choices)s (got '%(method)s')"),
            choices=", ".join(SweepMethod.values),
            method=method,
        )
    metric_name, metric_goal = _metric(raw.get("metric"))
    parameters = _parameters(raw.get("parameters"), method)
    return SweepConfig(
        name=name.strip(),
        method=method,
        metric_name=metric_name,
        metric_goal=metric_goal,
        parameters=parameters,
        program=_program(raw.get("program")),
        run_cap=_run_cap(raw.get("run_cap"), method, parameters),
        config=raw,
    )
