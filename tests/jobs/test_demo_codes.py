"""``manage.py demo`` registers the framework examples as Codes of the demo project, without running them
(docs/integrations.md)."""

import io
import tarfile

from checkpoints.storage import artifact_storage
from config.management.commands.demo import EXAMPLES_DIR, INTEGRATION_CODES, Command
from runs.models import Code


def test_each_integration_example_is_a_code_with_one_version_however_often_the_demo_starts(member, project):
    command = Command(stdout=io.StringIO())
    command._register_integration_codes(member, project)
    command._register_integration_codes(member, project)
    for name, entrypoint in INTEGRATION_CODES.items():
        assert (EXAMPLES_DIR / entrypoint[1]).is_file(), f"{name}: {entrypoint[1]} is not in examples/"
        versions = list(Code.objects.get(project=project, name=name).versions.all())
        assert [version.entrypoint for version in versions] == [entrypoint]
        with artifact_storage().open(versions[0].archive.storage_key) as stored:
            names = tarfile.open(fileobj=io.BytesIO(stored.read()), mode="r:gz").getnames()
        assert entrypoint[1] in names
    assert "hf-trainer" in INTEGRATION_CODES
