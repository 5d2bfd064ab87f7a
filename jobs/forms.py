"""Forms of the Jobs pages: they parse and validate input; the services decide (docs/design/house.md#views).

Field names follow the services' error fields (``parameters``, ``queue``,
``max_retries``, ``input_dataset_version_ids``, ``code_version``), so a
service's ``UserError`` lands on the field it names (``add_service_error``).
"""

import json
import uuid

from django import forms
from django.utils.translation import gettext_lazy as _

from jobs import selectors
from jobs.services._common import MAX_RETRIES_LIMIT, NPROC_PER_NODE_LIMIT
from mado.templatetags.mado_ui import LABELS
from runs import selectors as run_selectors
from runs.forms import DatasetVersionChoiceField
from runs.models import CodeVersion, RunKind

RETRY_HELP = _(
    "A retry starts the code again from scratch, without any checkpoint. To continue from a checkpoint after a "
    "failure, resume the Job by hand."
)
RESTART_HELP = _(
    "When the Job is preempted or its worker is lost, resume it by itself from its latest checkpoint, at most this "
    "many times (with a growing wait between restarts)."
)


NPROC_HELP = _("Processes on the worker: above 1 the code runs under torchrun, one process per rank (one per GPU).")
RESHARD_HELP = _(
    "The checkpoint was saved by %(world_size)s process(es). Another number works: torch.distributed.checkpoint "
    "reshards the saved state when it is loaded."
)


def nproc_per_node_field(**kwargs) -> forms.IntegerField:
    """Processes per node of a distributed Job (docs/design/worker.md#distributed)."""
    return forms.IntegerField(label=_("Processes per node"), min_value=1, max_value=NPROC_PER_NODE_LIMIT, **kwargs)


def source_world_size(source_job, checkpoint=None) -> int:
    """The processes that wrote ``checkpoint`` (its ``world_size``), else the source Job's, else 1."""
    if checkpoint is not None and checkpoint.world_size:
        return checkpoint.world_size
    return source_job.nproc_per_node if source_job is not None else 1


def set_world_size_initial(field: forms.IntegerField, source_job, checkpoint) -> None:
    """Preset the field to the source's world size and say that another one reshards."""
    world_size = source_world_size(source_job, checkpoint)
    field.initial = world_size
    field.help_text = RESHARD_HELP % {"world_size": world_size}


class CodeVersionChoiceField(forms.ModelChoiceField):
    def label_from_instance(self, obj):
        return f"{obj.code.name} v{obj.version}"


class QueueChoiceField(forms.ModelChoiceField):
    def label_from_instance(self, obj):
        return f"{obj.name} — {obj.description}" if obj.description else obj.name


def parameters_field() -> forms.CharField:
    return forms.CharField(
        label=_("Parameters"),
        required=False,
        initial="{}",
        widget=forms.Textarea(attrs={"rows": 6, "spellcheck": "false", "class": "code"}),
        help_text=_('A JSON object, for example {"lr": 0.01, "steps": 200}.'),
    )


def dataset_versions_field(**kwargs) -> DatasetVersionChoiceField:
    return DatasetVersionChoiceField(
        label=_("Dataset versions"),
        queryset=None,
        required=False,
        widget=forms.SelectMultiple(attrs={"size": 6}),
        **kwargs,
    )


def queue_field(**kwargs) -> QueueChoiceField:
    return QueueChoiceField(label=_("Queue"), queryset=None, empty_label=None, to_field_name="name", **kwargs)


def request_key_field() -> forms.CharField:
    """A hidden one-time token per rendered form: a double-clicked submit launches one Job
    (docs/design/house.md#idempotent)."""
    return forms.CharField(widget=forms.HiddenInput, required=False, initial=lambda: uuid.uuid4().hex, max_length=100)


class ParametersMixin:
    """``clean_parameters``: the ``parameters`` field's text as a JSON object (a form error otherwise)."""

    def clean_parameters(self) -> dict:
        raw = (self.cleaned_data.get("parameters") or "").strip() or "{}"
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise forms.ValidationError(
                _("Not valid JSON: %(error)s (line %(line)s, column %(column)s)."),
                params={"error": exc.msg, "line": exc.lineno, "column": exc.colno},
                code="json",
            ) from None
        if not isinstance(value, dict):
            raise forms.ValidationError(_('Parameters must be a JSON object such as {"lr": 0.01}.'), code="object")
        return value


class JobLaunchForm(ParametersMixin, forms.Form):
    """Launch Job: a Code version of the Project run on an enabled queue as a new Run."""

    code_version = CodeVersionChoiceField(label=_("Code version"), queryset=None, empty_label=None)
    parameters = parameters_field()
    input_dataset_version_ids = dataset_versions_field()
    queue = queue_field()
    name = forms.CharField(label=_("Run name"), max_length=200, required=False)
    kind = forms.ChoiceField(
        label=_("Run kind"), choices=[(code, LABELS["kind"][code]) for code in RunKind.values], initial=RunKind.TRAINING
    )
    max_retries = forms.IntegerField(
        label=_("Max retries"), min_value=0, max_value=MAX_RETRIES_LIMIT, initial=0, help_text=RETRY_HELP
    )
    max_restarts = forms.IntegerField(
        label=_("Max restarts"), min_value=0, max_value=MAX_RETRIES_LIMIT, required=False, help_text=RESTART_HELP
    )  # empty: the Project's job_max_restarts
    nproc_per_node = nproc_per_node_field(initial=1, required=False, help_text=NPROC_HELP)
    request_key = request_key_field()

    def __init__(self, *args, project, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["max_restarts"].initial = project.job_max_restarts
        self.fields["code_version"].queryset = run_selectors.code_version_choices(project=project)
        self.fields["input_dataset_version_ids"].queryset = run_selectors.dataset_version_choices(project=project)
        self.fields["queue"].queryset = selectors.queue_list()
        self.fields["queue"].initial = selectors.default_queue_name()

    def service_arguments(self) -> dict:
        """The keyword arguments of ``jobs.services.job_launch`` (without ``actor``)."""
        data = self.cleaned_data
        return {
            "code_version": data["code_version"],
            "queue": data["queue"],
            "parameters": data["parameters"],
            "dataset_version_ids": [version.pk for version in data["input_dataset_version_ids"]],
            "name": data["name"],
            "kind_of_run": data["kind"],
            "max_retries": data["max_retries"],
            "max_restarts": data["max_restarts"],
            "request_key": data["request_key"],
            "nproc_per_node": data["nproc_per_node"],
        }


class CheckpointResumeForm(forms.Form):
    """ "Resume in a new Run" (docs/design/resume.md#from-a-checkpoint): a version of the source Job's Code (default:
    its newest) and a queue (default: the source Job's).

    Without a source Job (the Run did not run as a Job) both lists are empty
    and the service refuses with the reason.
    """

    code_version = CodeVersionChoiceField(
        label=_("Code version"),
        queryset=None,
        empty_label=None,
        required=False,
        help_text=_("A version of the same Code; by default its newest (the stopped Job may have failed on its own)."),
    )
    queue = queue_field(required=False, help_text=_("By default the queue of the stopped Job."))
    nproc_per_node = nproc_per_node_field(required=False)

    def __init__(self, *args, source_job, checkpoint=None, **kwargs):
        super().__init__(*args, **kwargs)
        versions = self.fields["code_version"]
        queues = self.fields["queue"]
        queues.queryset = selectors.queue_list()
        set_world_size_initial(self.fields["nproc_per_node"], source_job, checkpoint)
        if source_job is None:
            versions.queryset = CodeVersion.objects.none()
            return
        versions.queryset = run_selectors.code_version_list(code=source_job.code_version.code).select_related("code")
        newest = versions.queryset.first()
        versions.initial = newest.pk if newest else source_job.code_version_id
        queues.initial = source_job.queue.name

    def service_arguments(self) -> dict:
        """``code_version``, ``queue`` and ``nproc_per_node`` for ``run_resume_from_checkpoint`` (None: the source
        Job's)."""
        data = self.cleaned_data
        return {
            "code_version": data.get("code_version"),
            "queue": data.get("queue"),
            "nproc_per_node": data.get("nproc_per_node"),
        }


class CheckpointContinueForm(ParametersMixin, forms.Form):
    """ "Continue training from these weights" (docs/design/resume.md#continue): the data mix, Code version, parameters,
    queue, name.

    ``composition`` (the dataset versions in force at the checkpoint's step)
    is preselected; any dataset version of the Project may be added. The Code
    versions offered are those of the source Run's Code (default: the
    source's), or every Code of the Project when the source recorded none;
    parameters default to the source Run's, the queue to the source Job's.
    """

    SERVICE_FIELDS = {"dataset_version_ids": "input_dataset_version_ids", "code_version_id": "code_version"}

    input_dataset_version_ids = dataset_versions_field(
        help_text=_("Preselected: the versions in force at the checkpoint's step. Add the new data here."),
    )
    code_version = CodeVersionChoiceField(label=_("Code version"), queryset=None, empty_label=None)
    parameters = parameters_field()
    queue = queue_field()
    name = forms.CharField(label=_("Run name"), max_length=200, required=False)
    nproc_per_node = nproc_per_node_field(required=False)
    request_key = request_key_field()

    def __init__(self, *args, source_run, source_job, composition, checkpoint=None, **kwargs):
        super().__init__(*args, **kwargs)
        project = source_run.project
        self.fields["input_dataset_version_ids"].queryset = run_selectors.dataset_version_choices(project=project)
        self.fields["input_dataset_version_ids"].initial = [version.pk for version in composition]
        versions = self.fields["code_version"]
        if source_run.code_version_id:
            versions.queryset = run_selectors.code_version_list(code=source_run.code_version.code).select_related(
                "code"
            )
            versions.initial = source_run.code_version_id
        else:
            versions.queryset = run_selectors.code_version_choices(project=project)
        self.fields["parameters"].initial = json.dumps(source_run.parameters or {}, indent=2)
        self.fields["queue"].queryset = selectors.queue_list()
        self.fields["queue"].initial = selectors.continue_queue_name(source_job=source_job)
        set_world_size_initial(self.fields["nproc_per_node"], source_job, checkpoint)

    def service_arguments(self) -> dict:
        """The keyword arguments of ``jobs.services.run_continue_from_checkpoint`` (without actor, checkpoint)."""
        data = self.cleaned_data
        return {
            "code_version": data["code_version"],
            "queue": data["queue"],
            "parameters": data["parameters"],
            "dataset_version_ids": [version.pk for version in data["input_dataset_version_ids"]],
            "name": data["name"],
            "request_key": data["request_key"],
            "nproc_per_node": data.get("nproc_per_node"),
        }
