"""The parameter set of a sweep's next trial (docs/design/sweeps.md#sweeps): a grid point, or an Optuna sampler's
suggestion.

Grid: the points in a fixed order (``itertools.product`` over the sorted
parameter names, each parameter's values in the configured order); trial
``n`` is point ``n - 1``. Random and bayes: Optuna's ``RandomSampler`` and
``TPESampler`` on an in-memory study rebuilt for every suggestion from the
sweep's finished trials (their parameters and last metric value), asked with
the configured distributions. The sampler's seed is derived from the sweep id
and the trial number, so the same sweep with the same finished trials gets
the same suggestion again, and successive trials differ.
"""

import itertools
import math

from sweeps.models import MetricGoal, Sweep, SweepMethod

# A seed per (sweep, trial): the sweep id in the high bits, the trial number in the low ones.
_SEED_STRIDE = 1_000_003


def grid_point(*, parameters: dict, index: int) -> dict | None:
    """The ``index``-th (0-based) point of the grid of normalised ``parameters``, or None past the end."""
    names = sorted(parameters)
    axes = [
        parameters[name]["values"] if "values" in parameters[name] else [parameters[name]["value"]] for name in names
    ]
    point = next(itertools.islice(itertools.product(*axes), index, None), None)
    return None if point is None else dict(zip(names, point, strict=True))


def _distributions(parameters: dict) -> dict:
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    distributions = {}
    for name, spec in parameters.items():
        if "values" in spec:
            distributions[name] = CategoricalDistribution(spec["values"])
        elif spec.get("distribution") == "int_uniform":
            distributions[name] = IntDistribution(spec["min"], spec["max"])
        elif "min" in spec:
            log = spec["distribution"] == "log_uniform_values"
            distributions[name] = FloatDistribution(spec["min"], spec["max"], log=log)
    return distributions


def optuna_suggestion(*, sweep: Sweep, number: int, finished: list[tuple[dict, float]]) -> dict:
    """Trial ``number``'s parameters for a random or bayes ``sweep``, given ``finished`` ``(parameters, metric)``.

    Fixed parameters (``value``) are copied; the others are asked from
    ``RandomSampler`` / ``TPESampler`` seeded from (sweep id, ``number``). A
    finished trial whose parameters no longer fit the space (or whose metric
    is not finite) is left out of the study.
    """
    # Imported here: optuna is slow to import, and only claims of new trials need it.
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    distributions = _distributions(sweep.parameters)
    seed = (sweep.pk * _SEED_STRIDE + number) % 2**32
    sampler_class = optuna.samplers.TPESampler if sweep.method == SweepMethod.BAYES else optuna.samplers.RandomSampler
    direction = "maximize" if sweep.metric_goal == MetricGoal.MAXIMIZE else "minimize"
    study = optuna.create_study(sampler=sampler_class(seed=seed), direction=direction)
    for parameters, value in finished:
        if not math.isfinite(value):
            continue
        asked = {name: parameters[name] for name in distributions if name in parameters}
        try:
            trial = optuna.trial.create_trial(params=asked, distributions=distributions, value=value)
        except ValueError:
            continue  # a parameter outside the space (or missing): nothing to learn from it
        study.add_trial(trial)
    suggestion = study.ask(distributions).params if distributions else {}
    fixed = {name: spec["value"] for name, spec in sweep.parameters.items() if "value" in spec}
    return {name: suggestion[name] if name in suggestion else fixed[name] for name in sorted(sweep.parameters)}


def suggest_parameters(*, sweep: Sweep, number: int, finished: list[tuple[dict, float]]) -> dict | None:
    """The parameters of trial ``number`` (1-based) of ``sweep``; None when a grid has no point left.

    ``finished``: ``(parameters, last metric value)`` of the sweep's trials
    whose Run finished (only random and bayes use them).
    """
    if sweep.method == SweepMethod.GRID:
        return grid_point(parameters=sweep.parameters, index=number - 1)
    return optuna_suggestion(sweep=sweep, number=number, finished=finished)
