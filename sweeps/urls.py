"""Page URLs of Sweeps. They join the Run pages in ``config.urls`` (the roof) under the ``runs:`` names
(``runs:sweep-list``, ``runs:sweep-create``, ``runs:sweep-detail``) that the Project page links to."""

from django.urls import path

from sweeps import views

urlpatterns = [
    path("projects/<slug:slug>/sweeps/", views.sweep_list, name="sweep-list"),
    path("projects/<slug:slug>/sweeps/new/", views.sweep_create, name="sweep-create"),
    path("sweeps/<int:pk>/", views.sweep_detail, name="sweep-detail"),
]
