"""Django admin for the model registry: read-only (docs/api.md#model-registry).

Versions protect their checkpoints through ``Checkpoint.registered_as``, which
only the registry's services keep current (docs/design/checkpoints.md#deletion),
so the admin shows these rows without add, change or delete.
"""

from django.contrib import admin

from mado.admin import ReadOnlyAdmin
from mlflow_api.models import ModelAlias, ModelVersion, RegisteredModel


@admin.register(RegisteredModel)
class RegisteredModelAdmin(ReadOnlyAdmin):
    list_display = ["name", "project", "last_version", "created_by", "created_at"]
    list_filter = ["project"]
    search_fields = ["name", "project__slug"]
    list_select_related = ["project", "created_by"]


@admin.register(ModelVersion)
class ModelVersionAdmin(ReadOnlyAdmin):
    list_display = ["registered_model", "version", "run", "logged_model", "checkpoint", "created_by", "created_at"]
    search_fields = ["registered_model__name", "run__external_id", "source"]
    raw_id_fields = ["registered_model", "run", "logged_model", "checkpoint"]
    list_select_related = ["registered_model", "run", "logged_model", "checkpoint"]


@admin.register(ModelAlias)
class ModelAliasAdmin(ReadOnlyAdmin):
    list_display = ["registered_model", "alias", "version", "updated_at"]
    search_fields = ["registered_model__name", "alias"]
    list_select_related = ["registered_model", "version"]
