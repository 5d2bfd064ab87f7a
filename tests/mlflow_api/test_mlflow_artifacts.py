"""MLflow artifact proxy ``/api/2.0/mlflow-artifacts/``: streamed PUT, ranged GET, listing, DELETE, auth, multipart
fallback, and the "Bad input" corpus over every endpoint that takes a path (docs/design/checkpoints.md#deletion;
docs/design/interfaces.md#mlflow)."""

import base64
import hashlib

import pytest
from rest_framework.test import APIClient

from checkpoints import storage
from checkpoints.models import Artifact
from tests.factories import RunFactory, api_key, run_token

pytestmark = pytest.mark.django_db
BASE = "/api/2.0/mlflow-artifacts"
BLOB = bytes(range(256)) * 4096 + b"tail"  # 1 MiB + 4 bytes: crosses a chunk boundary


def root(run) -> str:
    return f"{run.project_id}/{run.external_id}/artifacts"


def url(run, path="model/weights.bin") -> str:
    return f"{BASE}/artifacts/{root(run)}/{path}"


def bearer(user) -> APIClient:
    client = APIClient()
    if user is not None:
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {api_key(user)}")
    return client


def basic(user, password="pw") -> APIClient:
    user.set_password("pw")
    user.save()
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Basic " + base64.b64encode(f"{user.username}:{password}".encode()).decode())
    return client


def put(client, run, path="model/weights.bin", data=BLOB):
    return client.put(url(run, path), data=data, content_type="application/octet-stream")


def body(response) -> bytes:
    return b"".join(response.streaming_content)


@pytest.fixture
def users(admin, creator, member, viewer, outsider):
    return {
        "admin": admin,
        "creator": creator,
        "member": member,
        "viewer": viewer,
        "outsider": outsider,
        "anonymous": None,
    }


@pytest.mark.parametrize(
    "role, status",
    [
        ("admin", 200),
        ("creator", 200),
        ("member", 403),
        ("viewer", 403),
        ("outsider", 404),
        ("anonymous", 401),
    ],
)
def test_put_permissions_with_bearer(users, run, role, status):
    response = put(bearer(users[role]), run)
    assert response.status_code == status
    assert Artifact.objects.filter(run=run).exists() == (status == 200)
    expected = {403: "PERMISSION_DENIED", 404: "RESOURCE_DOES_NOT_EXIST", 401: "UNAUTHENTICATED"}.get(status)
    if expected:
        assert response.json()["error_code"] == expected and response.json()["message"]


def test_put_streams_the_body_and_get_returns_it_byte_exact(creator, viewer, run):
    assert put(basic(creator), run).json() == {}
    artifact = Artifact.objects.get(run=run, path="model/weights.bin")
    assert (artifact.size, artifact.sha256) == (len(BLOB), hashlib.sha256(BLOB).hexdigest())
    response = bearer(viewer).get(url(run))
    assert response.status_code == 200 and body(response) == BLOB


def test_basic_auth_with_a_wrong_password_is_unauthenticated(creator, run):
    response = put(basic(creator, password="wrong"), run)
    assert response.status_code == 401 and response.json()["error_code"] == "UNAUTHENTICATED"
    assert not Artifact.objects.exists()


def test_get_honours_range(creator, run):
    put(bearer(creator), run)
    response = bearer(creator).get(url(run), HTTP_RANGE="bytes=10-19")
    assert response.status_code == 206 and body(response) == BLOB[10:20]
    assert response["Content-Range"] == f"bytes 10-19/{len(BLOB)}"


def test_get_of_a_missing_file_is_resource_does_not_exist(creator, run):
    response = bearer(creator).get(url(run, "nothing.bin"))
    assert response.status_code == 404 and response.json()["error_code"] == "RESOURCE_DOES_NOT_EXIST"


def test_the_same_bytes_again_is_a_no_op_and_different_bytes_replace_the_file(creator, run):
    assert put(bearer(creator), run).status_code == 200
    assert put(bearer(creator), run).status_code == 200
    assert put(bearer(creator), run, data=b"other").status_code == 200
    assert body(bearer(creator).get(url(run))) == b"other"
    stored = Artifact.objects.get(run=run, path="model/weights.bin")
    assert [(h["sha256"], h["size"]) for h in stored.history] == [(hashlib.sha256(BLOB).hexdigest(), len(BLOB))]


def test_a_checkpoint_file_is_never_replaced(creator, run):
    assert put(bearer(creator), run, "checkpoints/step-5/w.bin", data=b"one").status_code == 200
    response = put(bearer(creator), run, "checkpoints/step-5/w.bin", data=b"two")
    assert response.status_code == 409 and response.json()["error_code"] == "RESOURCE_ALREADY_EXISTS"
    assert body(bearer(creator).get(url(run, "checkpoints/step-5/w.bin"))) == b"one"


def test_listing_in_mlflow_shape(creator, viewer, run):
    for path, data in [("a.txt", b"abc"), ("dir/b.bin", b"12345"), ("dir/sub/c", b""), ("dir 2/d", b"x")]:
        assert put(bearer(creator), run, path, data).status_code == 200
    listed = bearer(viewer).get(f"{BASE}/artifacts", {"path": root(run)})
    assert listed.status_code == 200
    assert listed.json() == {
        "files": [
            {"path": "a.txt", "is_dir": False, "file_size": 3},
            {"path": "dir", "is_dir": True},
            {"path": "dir 2", "is_dir": True},
        ]
    }
    listed = bearer(viewer).get(f"{BASE}/artifacts", {"path": f"{root(run)}/dir"})
    assert listed.json() == {
        "files": [{"path": "b.bin", "is_dir": False, "file_size": 5}, {"path": "sub", "is_dir": True}]
    }
    assert bearer(viewer).get(f"{BASE}/artifacts", {"path": f"{root(run)}/none"}).json() == {"files": []}


def test_listing_another_projects_run_is_not_found(creator, outsider, run):
    put(bearer(creator), run)
    response = bearer(outsider).get(f"{BASE}/artifacts", {"path": root(run)})
    assert response.status_code == 404 and response.json()["error_code"] == "RESOURCE_DOES_NOT_EXIST"


@pytest.mark.parametrize("role, status", [("admin", 200), ("member", 403), ("viewer", 403), ("outsider", 404)])
def test_delete_is_for_project_admins(users, creator, run, role, status):
    put(bearer(creator), run)
    response = bearer(users[role]).delete(url(run))
    assert response.status_code == status
    assert Artifact.objects.filter(run=run).exists() == (status != 200)


def test_delete_of_a_directory_removes_every_file_below_it(admin, creator, run):
    put(bearer(creator), run, "logs/a", b"a")
    put(bearer(creator), run, "logs/b", b"b")
    put(bearer(creator), run, "keep", b"k")
    assert bearer(admin).delete(url(run, "logs")).status_code == 200
    assert list(Artifact.objects.filter(run=run).values_list("path", flat=True)) == ["keep"]


def test_a_run_token_acts_only_on_its_own_run(creator, project, run):

    other = RunFactory(project=project, created_by=creator)
    token = run_token(other, creator)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token.key}")
    assert put(client, run).status_code == 403
    assert put(client, other).status_code == 200


@pytest.mark.parametrize("action", ["create", "complete", "abort"])
def test_multipart_answers_the_message_that_makes_the_client_fall_back_to_one_put(creator, run, action):
    response = bearer(creator).post(
        f"{BASE}/mpu/{action}/{root(run)}/big.bin", {"path": "big.bin", "num_parts": 3}, format="json"
    )
    assert response.status_code == 501
    from mlflow.exceptions import _UnsupportedMultipartUploadException

    assert response.json()["message"].startswith(_UnsupportedMultipartUploadException.MESSAGE)


# --- Bad input: traversal and injection in every path parameter ------------------------------------------

# What follows ``<experiment_id>/<run_id>/artifacts/`` in the URL, percent-encoded as a client would send it
# (the server decodes once); ``{root}`` is replaced by the real run's root where the defect is elsewhere.
CORPUS = [
    "{root}/../../other/x",
    "{root}/a/../../x",
    "{root}/%2e%2e/x",
    "{root}/%2E%2E/%2E%2E/x",
    "{root}/%252e%252e/x",
    "{root}/..%2fx",
    "{root}/a%2f..%2f..%2fx",
    "%2Fetc/passwd",
    "/etc/passwd",
    "{root}/a%5C..%5Cx",
    "{root}/a\\b",
    "{root}/a//b",
    "{root}//a",
    "{root}/a%23b",
    "{root}/a%3Fb",
    "{root}/a;b",
    "{root}/a%3Bb",
    "{root}/a%00b",
    "{root}/a%0Ab",
    "{root}/a%0Db",
    "{root}/a%09b",
    "{root}/a%7Fb",
    "{root}/./a",
    "{root}/a/.",
    "file:///etc/passwd",
    "http://evil.example/x",
    "file:{root}/x",
    "C:%5Cwindows",
    "{root}/a%2500b",
]


def _endpoints(client, run, payload):
    target = payload.format(root=root(run))
    yield "put", client.put(f"{BASE}/artifacts/{target}", data=b"x", content_type="application/octet-stream")
    yield "get", client.get(f"{BASE}/artifacts/{target}")
    yield "delete", client.delete(f"{BASE}/artifacts/{target}")
    yield "list", client.get(f"{BASE}/artifacts?path={target}")
    yield "mpu", client.post(f"{BASE}/mpu/create/{target}", {"path": "x", "num_parts": 1}, format="json")


@pytest.mark.parametrize("payload", CORPUS)
def test_unsafe_paths_are_refused_before_any_storage_access(admin, run, monkeypatch, payload):
    def no_storage(*args, **kwargs):
        raise AssertionError("the storage was touched")

    monkeypatch.setattr(storage, "artifact_storage", no_storage)
    for endpoint, response in _endpoints(bearer(admin), run, payload):
        assert response.status_code == 400, (endpoint, payload, response.status_code)
        assert response.json()["error_code"] == "INVALID_PARAMETER_VALUE", (endpoint, payload)
    assert not Artifact.objects.exists()
