"""What ``config.wsgi`` (imported by gunicorn in each web worker) leaves behind before the first request
(docs/design/resume.md#steps-continue)."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import gc, json, sys
import config.wsgi
gc.collect()
print(json.dumps({"frozen": gc.get_freeze_count(), "tracked": len(gc.get_objects()),
                  "views_loaded": "runs.api.runs" in sys.modules}))
"""


def test_the_loaded_code_is_frozen_out_of_the_collectors_full_collections():
    env = {"DJANGO_SETTINGS_MODULE": "config.settings", "MADO_SECRET_KEY": "x" * 60, "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    ).stdout
    probe = json.loads(out.splitlines()[-1])
    assert probe["views_loaded"], "the URL patterns' view modules are imported before the freeze"
    assert probe["frozen"] > 50_000  # Django, DRF, the apps and their views
    assert probe["tracked"] < probe["frozen"] / 10  # what a full collection still walks
