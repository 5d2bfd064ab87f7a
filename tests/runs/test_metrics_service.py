import math

import pytest

from mado.errors import Forbidden, ValidationFailed
from runs import selectors
from runs.metrics import metrics_ingest


def test_it_stores_a_batch_and_reads_history_in_step_order(run, creator):
    points = [{"key": "loss", "value": 1.0 / (s + 1), "step": s} for s in (2, 0, 1)]
    assert metrics_ingest(actor=creator, run=run, points=points).stored == 3
    history = selectors.metric_history(run=run, key="loss")
    assert [p[0] for p in history] == [0, 1, 2]
    assert history[0][1] == 1.0


def test_nan_and_infinity_are_stored_as_information(run, creator):
    metrics_ingest(
        actor=creator,
        run=run,
        points=[
            {"key": "loss", "value": "NaN", "step": 0},
            {"key": "loss", "value": "Infinity", "step": 1},
            {"key": "loss", "value": float("-inf"), "step": 2},
        ],
    )
    values = [p[1] for p in selectors.metric_history(run=run, key="loss")]
    assert math.isnan(values[0]) and values[1] == math.inf and values[2] == -math.inf


@pytest.mark.parametrize(
    "bad, field",
    [
        ({"value": 1.0, "step": 0}, "points[1].key"),
        ({"key": "loss", "value": "high", "step": 0}, "points[1].value"),
        ({"key": "loss", "value": 1.0, "step": -1}, "points[1].step"),
        ({"key": "loss", "step": 0}, "points[1].value"),
    ],
)
def test_a_bad_point_refuses_the_whole_batch_naming_the_field(run, creator, bad, field):
    good = {"key": "loss", "value": 0.5, "step": 0}
    with pytest.raises(ValidationFailed) as caught:
        metrics_ingest(actor=creator, run=run, points=[good, bad])
    assert caught.value.field == field
    assert selectors.metric_history(run=run, key="loss") == []


def test_a_batch_over_the_limit_is_refused(run, creator, settings):
    settings.MADO_METRIC_BATCH_MAX = 10
    with pytest.raises(ValidationFailed) as caught:
        metrics_ingest(actor=creator, run=run, points=[{"key": "k", "value": 1, "step": i} for i in range(11)])
    assert caught.value.field == "points"


def test_a_viewer_cannot_log(run, viewer):
    with pytest.raises(Forbidden):
        metrics_ingest(actor=viewer, run=run, points=[{"key": "k", "value": 1, "step": 0}])
