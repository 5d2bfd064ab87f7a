"""MLflow ``log-inputs`` (``mlflow.log_input``) mapped onto DatasetVersions and data stages
(docs/design/runs.md#data-stages; docs/design/interfaces.md#mlflow).

An MLflow dataset ``{name, digest, source_type, source, schema, profile}``
becomes the Dataset ``name`` of the Run's Project and its DatasetVersion
``digest`` (``uri`` = source; the rest in ``mlflow_dataset``), made on first
use. The Run then trains on them: before it logged any metric or data stage
they join its initial inputs; later a data stage at its current step (the
last metric step + 1) records the set in force plus them, so MLflow dataset
logging feeds the training-data-history tab. Logging the same datasets again
changes nothing.
"""

from django.db import IntegrityError, transaction
from django.db.models import Max

from mado import policy
from mado.errors import Conflict
from mlflow_api.errors import INVALID_PARAMETER_VALUE, INVALID_STATE, MlflowError
from mlflow_api.tracking.selectors import CONTEXT_TAG
from runs.models import Dataset, DatasetVersion, DataStage, MetricSummary, Run
from runs.stages import data_composition_at, data_stage_record

MAX_DATASETS = 100


def _text(value, name: str, limit: int, *, required: bool = True) -> str:
    if value in (None, "") and not required:
        return ""
    if not isinstance(value, str) or not value or len(value) > limit or "\x00" in value:
        raise MlflowError(INVALID_PARAMETER_VALUE, f"{name} must be a string of 1 to {limit} characters")
    return value


def _parse(datasets) -> list[dict]:
    if not isinstance(datasets, list) or len(datasets) > MAX_DATASETS:
        raise MlflowError(INVALID_PARAMETER_VALUE, f"datasets must be a list of at most {MAX_DATASETS} dataset inputs")
    parsed = []
    for index, item in enumerate(datasets):
        dataset = item.get("dataset") if isinstance(item, dict) else None
        if not isinstance(dataset, dict):
            raise MlflowError(INVALID_PARAMETER_VALUE, f"datasets[{index}].dataset must be an object")
        where = f"datasets[{index}].dataset"
        tags = item.get("tags") or []
        context = next((t.get("value") for t in tags if isinstance(t, dict) and t.get("key") == CONTEXT_TAG), "")
        parsed.append(
            {
                "name": _text(dataset.get("name"), f"{where}.name", 200),
                "digest": _text(dataset.get("digest"), f"{where}.digest", 100),
                "source": _text(dataset.get("source"), f"{where}.source", 2000, required=False),
                "meta": {
                    "source_type": _text(dataset.get("source_type"), f"{where}.source_type", 100, required=False),
                    "schema": _text(dataset.get("schema"), f"{where}.schema", 100_000, required=False),
                    "profile": _text(dataset.get("profile"), f"{where}.profile", 100_000, required=False),
                    "context": context if isinstance(context, str) else "",
                },
            }
        )
    return parsed


def _version(run: Run, entry: dict) -> DatasetVersion:
    for _attempt in range(2):  # a concurrent first use of the same name or digest: read what it made
        try:
            with transaction.atomic():
                dataset, _ = Dataset.objects.get_or_create(project=run.project, name=entry["name"])
                version, _ = DatasetVersion.objects.get_or_create(
                    dataset=dataset,
                    version=entry["digest"],
                    defaults={
                        "uri": entry["source"],
                        "mlflow_dataset": entry["meta"],
                        "description": "logged through the MLflow API",
                    },
                )
                return version
        except IntegrityError:
            continue
    raise MlflowError(INVALID_PARAMETER_VALUE, f"dataset {entry['name']!r} is being created concurrently; retry")


def run_log_inputs(*, actor, run: Run, datasets) -> list[DatasetVersion]:
    """Record MLflow dataset inputs of ``run`` (see the module docstring); the versions logged.

    Writers of the Run only (``Forbidden``, docs/design/runs.md#write-rule); INVALID_PARAMETER_VALUE naming the bad
    field; INVALID_STATE when the Run has ended and the datasets would need a new stage.
    """
    policy.require_run_writer(actor, run)
    versions = [_version(run, entry) for entry in _parse(datasets)]
    if not versions:
        return []
    with transaction.atomic():
        locked = Run.objects.select_for_update().get(pk=run.pk)
        last_step = MetricSummary.objects.filter(run=locked).aggregate(last=Max("last_step"))["last"]
        last_stage = DataStage.objects.filter(run=locked).aggregate(last=Max("start_step"))["last"]
        if last_step is None and last_stage is None:
            locked.input_dataset_versions.add(*versions)
            return versions
    step = max(-1 if last_step is None else last_step, -1 if last_stage is None else last_stage) + 1
    current = {v.pk for v in data_composition_at(run=run, step=step)}
    wanted = current | {v.pk for v in versions}
    if wanted != current:
        try:
            data_stage_record(
                actor=actor,
                run=run,
                start_step=step,
                dataset_version_ids=sorted(wanted),
                metadata={"logged_through": "mlflow log_input"},
            )
        except Conflict as exc:
            raise MlflowError(INVALID_STATE, str(exc.detail)) from None
    return versions
