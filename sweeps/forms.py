"""The "New sweep" form: the configuration as YAML (or JSON) text; ``services.sweep_create`` checks it
(docs/design/sweeps.md#sweeps)."""

from django import forms
from django.utils.translation import gettext_lazy as _

EXAMPLE = """name: digits-lr
method: bayes
metric:
  name: val_loss
  goal: minimize
parameters:
  lr: {min: 0.0001, max: 0.1, distribution: log_uniform_values}
  hidden: {values: [32, 64, 128]}
program: python examples/sweep_training.py
run_cap: 20
"""


class SweepCreateForm(forms.Form):
    config = forms.CharField(
        label=_("Configuration (YAML or JSON)"),
        widget=forms.Textarea(attrs={"rows": 16, "spellcheck": "false", "class": "code"}),
        initial=EXAMPLE,
        help_text=_(
            "method: grid, random or bayes; metric: the logged metric to optimise and its goal; parameters: "
            "values, value, or min and max; program: the command an agent runs with --name=value per "
            "parameter; run_cap: the most trials."
        ),
    )
