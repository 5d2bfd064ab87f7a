"""``make demo`` registers each framework example as a Code of the demo project, once, without running it."""

import pytest

from config.management.commands.demo import EXAMPLE_CODES, EXAMPLES_DIR, Command
from runs.models import Code

pytestmark = pytest.mark.django_db


def test_each_example_is_registered_once_with_an_entrypoint_that_names_a_program_of_examples(admin, project):
    Command()._register_example_codes(admin, project)
    Command()._register_example_codes(admin, project)  # the demo started again
    assert "accelerate-training" in EXAMPLE_CODES
    assert "hf-trainer" in EXAMPLE_CODES
    for name, entrypoint in EXAMPLE_CODES.items():
        (version,) = Code.objects.get(project=project, name=name).versions.all()
        assert version.entrypoint == entrypoint
        assert (EXAMPLES_DIR / entrypoint[1]).is_file()
