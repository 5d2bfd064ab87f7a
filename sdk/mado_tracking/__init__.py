"""mado_tracking: the Python SDK of mado (SPEC F2, F29), a pure HTTP client of ``/api/v1/``.

    from mado_tracking import start_run

    with start_run(project="vision", name="baseline", parameters={"lr": 0.1}) as run:
        for step in range(steps):
            ...
            run.log_metrics({"train.loss": loss}, step=step)

Configuration: arguments, else ``MMT_API_URL``, ``MMT_API_TOKEN``, ``MMT_PROJECT``.
"""

from mado_tracking._version import __version__
from mado_tracking.errors import ApiError, ConfigError, MadoError
from mado_tracking.run import Run, start_run

__all__ = ["ApiError", "ConfigError", "MadoError", "Run", "__version__", "start_run"]
