"""The runs app's models: Projects, Runs and their records (``core``). Sweeps and trials are the sweeps app's."""

from runs.models.core import (
    FINAL_STATES,
    Code,
    CodeVersion,
    CodeVersionQuerySet,
    DataStage,
    DataStageQuerySet,
    Dataset,
    DatasetVersion,
    DatasetVersionQuerySet,
    Membership,
    MetricBatch,
    ParameterChange,
    Project,
    ProjectQuerySet,
    Role,
    Run,
    RunKind,
    RunStatus,
    RunTag,
    RunTagQuerySet,
    VisibleQuerySet,
    new_external_id,
)
from runs.models.logged_models import LoggedModel, LoggedModelStatus
from runs.models.metrics import (
    CHUNK_ID_STRIDE,
    MetricChunk,
    MetricPoint,
    MetricPointQuerySet,
    MetricRollup,
    MetricSummary,
    MetricSummaryQuerySet,
)
from runs.models.workspace import RunTableColumns

__all__ = [
    "CHUNK_ID_STRIDE", "FINAL_STATES", "Code", "CodeVersion", "CodeVersionQuerySet", "DataStage",
    "DataStageQuerySet", "Dataset", "DatasetVersion", "DatasetVersionQuerySet", "LoggedModel", "LoggedModelStatus",
    "MetricBatch", "MetricChunk",
    "MetricPoint", "MetricPointQuerySet", "MetricRollup", "MetricSummary", "MetricSummaryQuerySet",
    "Membership", "ParameterChange", "Project", "ProjectQuerySet", "Role", "Run", "RunKind", "RunStatus", "RunTag",
    "RunTagQuerySet", "VisibleQuerySet", "new_external_id",
    "RunTableColumns",
]
