"""``manage.py demo`` registers ``examples/lightning_training.py`` as the Code ``lightning-training`` of the demo
project, once, without running it (docs/integrations.md)."""

import io
import tarfile

from checkpoints.storage import artifact_storage
from config.management.commands.demo import EXAMPLES_DIR, INTEGRATION_CODES, Command
from runs.models import Code


def test_the_lightning_example_is_a_code_with_one_version_however_often_the_demo_starts(member, project):
    entrypoint = INTEGRATION_CODES["lightning-training"]
    assert (EXAMPLES_DIR / entrypoint[1]).is_file()
    command = Command(stdout=io.StringIO())
    command._register_integration_codes(member, project)
    command._register_integration_codes(member, project)
    versions = list(Code.objects.get(project=project, name="lightning-training").versions.all())
    assert [version.entrypoint for version in versions] == [entrypoint]
    with artifact_storage().open(versions[0].archive.storage_key) as stored:
        names = tarfile.open(fileobj=io.BytesIO(stored.read()), mode="r:gz").getnames()
    assert "lightning_training.py" in names
