"""Django admin: every model is registered and its changelist and change page load
(docs/design/interfaces.md#surfaces)."""

import re

import numpy as np
import pytest
from django.apps import apps
from django.contrib import admin
from django.urls import reverse

from checkpoints.models import (
    Artifact,
    Checkpoint,
    CheckpointDeletion,
    CheckpointState,
    ManifestEntry,
    RetentionPolicy,
    ScrubState,
    StorageUsage,
)
from mlflow_api.tracking.logged_models import logged_model_create
from runs.metrics import metrics_ingest
from runs.models import DataStage, ExternalIdentity, Project, ResumeSegment, Run, SegmentPoint, ServiceAccount
from runs.segments import values_to_bits
from runs.services import run_table_columns_save
from sweeps.services import sweep_claim, sweep_create
from tests.factories import CodeVersionFactory, DatasetVersionFactory, UserFactory

# Every table; not views (MetricPoint unnests the registered MetricChunk's rows).
MODELS = [
    model
    for label in ("runs", "checkpoints")
    for model in apps.get_app_config(label).get_models()
    if model._meta.managed
]


@pytest.fixture
def superuser(db):
    return UserFactory(username="root", is_staff=True, is_superuser=True)


@pytest.fixture
def one_of_each(project, run, creator):
    """A row of every model, so the changelists render real rows (list_display columns included)."""
    CodeVersionFactory(code__project=project, code__created_by=creator)
    run.input_dataset_versions.set([DatasetVersionFactory(dataset__project=project)])
    metrics_ingest(actor=creator, run=run, points=[{"key": "loss", "value": "NaN", "step": 0}], idempotency_key="b1")
    artifact = Artifact.objects.create(
        project=project, run=run, path="checkpoints/step-10.tar", size=10, sha256="a" * 64, storage_key="k/1"
    )
    checkpoint = Checkpoint.objects.create(
        run=run, step=10, artifact=artifact, file_count=1, total_bytes=3, state=CheckpointState.COMPLETE
    )
    ManifestEntry.objects.create(checkpoint=checkpoint, path="model.pt", sha256="b" * 64, size=3)
    stage = DataStage.objects.create(run=run, start_step=10, checkpoint=checkpoint, created_by=creator)
    stage.dataset_versions.set(run.input_dataset_versions.all())
    run.tags.create(key="team", value="vision")
    run.parameter_changes.create(key="lr", old_value=0.1, new_value=0.2, lease_token=2, changed_by=creator)
    sweep = sweep_create(
        actor=creator,
        project=project,
        config={
            "method": "grid",
            "metric": {"name": "loss"},
            "parameters": {"lr": {"values": [0.1]}},
            "program": "python t.py",
        },
    )
    sweep_claim(actor=creator, sweep=sweep, agent="gpu-1:7")
    run_table_columns_save(user=creator, project=project, column_ids=["param:lr", "metric:loss:min"])
    logged_model_create(actor=creator, project=project, name="net", source_run=run)
    ServiceAccount.objects.create(user=UserFactory(username="ci-bot"), project=project, name="ci", created_by=creator)
    ExternalIdentity.objects.create(issuer="https://idp.example.com", subject="42", user=creator, linked_by="sign-up")
    RetentionPolicy.objects.create(project=project, keep_last=3, updated_by=creator)
    gone = Checkpoint.objects.create(run=run, step=5, state=CheckpointState.DELETED)
    CheckpointDeletion.objects.create(
        project=project, run=run, checkpoint=gone, step=5, bytes=10, cause="hand", deleted_by=creator
    )
    StorageUsage.objects.create(project=project, run=run, kind=StorageUsage.Kind.CHECKPOINT_TAR, bytes=10, files=1)
    ScrubState.objects.create(credit=0.0)
    segment = ResumeSegment.objects.create(run=run, number=1, lease_token=1, floor=10)
    SegmentPoint.objects.create(segment=segment, key="loss", step=3, value_bits=values_to_bits(np.array([0.5]))[0])


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_every_model_is_registered(model):
    assert admin.site.is_registered(model)


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_changelist_and_change_page_load_for_a_superuser(client, superuser, one_of_each, model):
    client.force_login(superuser)
    opts = model._meta
    changelist = client.get(reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist"))
    assert changelist.status_code == 200
    assert changelist.context["cl"].result_count >= 1
    obj = model.objects.first()
    change = client.get(reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[obj.pk]))
    assert change.status_code == 200


@pytest.mark.parametrize("model", [Project, Run, Checkpoint], ids=lambda m: m.__name__)
def test_changelist_search_works(client, superuser, one_of_each, model):
    client.force_login(superuser)
    opts = model._meta
    response = client.get(reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist"), {"q": "vision"})
    assert response.status_code == 200


def test_checkpoints_and_metric_points_are_read_only(client, superuser, one_of_each):
    client.force_login(superuser)
    checkpoint = Checkpoint.objects.get(step=10)
    response = client.post(reverse("admin:checkpoints_checkpoint_delete", args=[checkpoint.pk]), {"post": "yes"})
    assert response.status_code == 403
    assert Checkpoint.objects.filter(pk=checkpoint.pk).exists()
    assert client.get(reverse("admin:runs_metricchunk_add")).status_code == 403


def test_metric_chunks_are_listed_in_index_order_without_a_page_per_chunk(client, superuser, one_of_each):
    run = Run.objects.first()
    # Stored in an order that newest-first (the admin's default) would not list as the index does.
    metrics_ingest(
        actor=run.created_by,
        run=run,
        columns={"keys": ["alpha", "zeta", "alpha"], "steps": [5, 0, 1], "values": [1, 2, 3]},
    )
    client.force_login(superuser)
    response = client.get(reverse("admin:runs_metricchunk_changelist"))
    assert response.status_code == 200
    listed = [
        (c.key, c.first_step, c.last_step, c.count) for c in response.context["cl"].result_list if c.run_id == run.pk
    ]
    assert listed == [("alpha", 1, 5, 2), ("zeta", 0, 0, 1)]
    assert not re.search(r"/admin/runs/metricchunk/\d+/change/", response.content.decode())
