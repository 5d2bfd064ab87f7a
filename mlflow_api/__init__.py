"""The MLflow protocol (docs/design/interfaces.md#mlflow): the tracking API under ``/api/2.0/mlflow/``
(``tracking/``) and the artifact proxy under ``/api/2.0/mlflow-artifacts/`` (``artifacts/``), each also under
``/mlflow/``; its errors (``errors``) and authentication (``auth``). Routes: ``urls``.

Experiments are mado Projects, runs are mado Runs; docs/api.md ("MLflow endpoints") says what maps to what.
"""
