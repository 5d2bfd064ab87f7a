"""Page URLs of Jobs (names ``jobs:<entity>-<page>``).

The Project's Jobs list and Launch form hang under the Project; the
Checkpoint tab's "Resume from this checkpoint" confirmation under the
checkpoint; the Logs tab's polled partial under the Run.
"""

from django.urls import path

from jobs import views

app_name = "jobs"

urlpatterns = [
    path("projects/<slug:slug>/jobs/", views.project_jobs, name="project-jobs"),
    path("projects/<slug:slug>/jobs/table/", views.project_jobs_table, name="project-jobs-table"),
    path("projects/<slug:slug>/jobs/new/", views.job_launch, name="job-launch"),
    path("jobs/<int:pk>/", views.job_detail, name="job-detail"),
    path("jobs/<int:pk>/live/", views.job_live, name="job-live"),
    path("jobs/<int:pk>/abort/", views.job_abort, name="job-abort"),
    path("jobs/<int:pk>/resume-latest/", views.job_resume_latest, name="job-resume-latest"),
    path("checkpoints/<int:pk>/resume/", views.checkpoint_resume, name="checkpoint-resume"),
    path("checkpoints/<int:pk>/continue/", views.checkpoint_continue, name="checkpoint-continue"),
    path("runs/<int:pk>/log/", views.run_log, name="run-log"),
]
