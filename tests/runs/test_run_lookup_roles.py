"""A Run's lookup brings the reader's role along, so the policy's checks on it ask the database nothing more
(docs/design/runs.md#write-rule)."""

from mado import policy
from runs import selectors
from runs.models import Membership, Role


def test_the_role_read_with_the_run_answers_the_policy_without_a_query(run, creator, django_assert_num_queries):
    found = selectors.run_get_for_user(user=creator, run_id=run.pk)
    with django_assert_num_queries(0):
        assert policy.role_in(creator, found.project) == Role.MEMBER
        assert policy.why_cannot_write_run(creator, found) is None


def test_another_users_role_on_the_same_project_is_still_read_from_the_database(
    run, member, admin, django_assert_num_queries
):
    found = selectors.run_get_for_user(user=member, run_id=run.pk)
    with django_assert_num_queries(1):
        assert policy.role_in(admin, found.project) == Role.ADMIN


def test_a_changed_role_counts_from_the_next_lookup(run, member):
    selectors.run_get_for_user(user=member, run_id=run.pk)
    Membership.objects.filter(user=member, project=run.project).update(role=Role.VIEWER)
    found = selectors.run_get_for_user(user=member, run_id=run.pk)
    assert policy.role_in(member, found.project) == Role.VIEWER
    assert "viewer" in policy.why_cannot_write_run(member, found)
