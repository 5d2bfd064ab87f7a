"""The warning for points dropped after a resume names the run by the id the user chose:
``start_run(id="exp-42", ...)`` → "run exp-42", not the API's numeric id."""

import logging

from mado_tracking.config import Config
from mado_tracking.lease import Lease
from mado_tracking.metrics import MetricSender


class Answer:
    def json(self):
        return {"stored": 0, "dropped": 2, "dropped_keys": ["acc", "loss"]}


def test_the_dropped_points_warning_names_the_run_id_once_per_key(caplog):
    lease = Lease(run_label="exp-42", token=2, heartbeat_interval=30)
    sender = MetricSender(Config(api_url="http://127.0.0.1:9", api_token="t", project="p"), 17, lease=lease)
    try:
        with caplog.at_level(logging.WARNING, logger="mado_tracking"):
            sender._warn_dropped_keys(Answer())
            sender._warn_dropped_keys(Answer())
    finally:
        sender.close(0)
    warned = [record.getMessage() for record in caplog.records if "dropped by the server" in record.getMessage()]
    assert len(warned) == 2
    assert all("run exp-42 continues" in text for text in warned)
