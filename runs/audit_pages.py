"""A Project's audit log page and its CSV (docs/api.md#audit): Project admins only."""

from datetime import datetime, time, timedelta

from django import forms
from django.core.paginator import Paginator
from django.http import HttpResponseBadRequest, StreamingHttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.utils.translation import gettext_lazy as _lazy
from django.views.decorators.http import require_GET

from runs.audit import audit_csv_lines, audit_list
from runs.views import _administered_project, page


class AuditFilterForm(forms.Form):
    action = forms.CharField(label=_lazy("Action"), required=False, max_length=64)
    actor = forms.CharField(label=_lazy("Who"), required=False, max_length=150)
    since = forms.DateField(label=_lazy("From"), required=False, widget=forms.DateInput(attrs={"type": "date"}))
    until = forms.DateField(label=_lazy("To"), required=False, widget=forms.DateInput(attrs={"type": "date"}))

    def filters(self) -> dict:
        """The cleaned filters for ``audit_list`` (``until`` a whole day: up to the next midnight)."""
        data = self.cleaned_data
        return {
            "action": data["action"],
            "actor": data["actor"],
            "since": _midnight(data["since"], 0),
            "until": _midnight(data["until"], 1),
        }


def _midnight(day, shift: int):
    """The start of ``day`` + ``shift`` days in the current time zone, or None without a day."""
    return timezone.make_aware(datetime.combine(day, time.min)) + timedelta(days=shift) if day else None


def _events(request, project):
    form = AuditFilterForm(request.GET)
    if not form.is_valid():
        return form, None
    return form, audit_list(user=request.user, project=project, **form.filters())


@page
@require_GET
def project_audit(request, slug):
    """The Project's audit records, newest first, filterable, 50 a page."""
    project = _administered_project(request, slug)
    form, events = _events(request, project)
    page_obj = Paginator(events if events is not None else [], 50).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    context = {"project": project, "form": form, "page_obj": page_obj, "query": query.urlencode()}
    return render(request, "runs/project_audit.html", context, status=200 if events is not None else 400)


@page
@require_GET
def project_audit_csv(request, slug):
    """The filtered records as CSV, streamed."""
    project = _administered_project(request, slug)
    form, events = _events(request, project)
    if events is None:
        return HttpResponseBadRequest("; ".join(f"{k}: {' '.join(v)}" for k, v in form.errors.items()))
    response = StreamingHttpResponse(audit_csv_lines(events), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{project.slug}-audit.csv"'
    return response
