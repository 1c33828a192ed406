"""The admin's task lists: a page size chosen among a few, either end of the sorted set, a button
per row, emptying a state after asking."""

from __future__ import annotations

import html
import re
import time

import pytest

from django_rtq.admin_views.tasks import PAGE_SIZES, PER_PAGE
from django_rtq.broker import TaskState
from django_rtq.operations import Operations
from tests.support.admin_pages import ACTION_URL, Q, confirm, messages_of, row_ids, tasks_url, text
from tests.support.factories import enqueue, make_tasks
from tests.support.reading import ids_in

pytestmark = pytest.mark.django_db


S = TaskState


def test_the_page_size_is_chosen_among_a_few(broker, superuser_client):
    ids = make_tasks(broker, S.SCHEDULED, Q, count=PAGE_SIZES[0] + 5)

    assert len(row_ids(superuser_client.get(tasks_url("scheduled", queue=Q)))) == min(len(ids), PER_PAGE)
    small = superuser_client.get(tasks_url("scheduled", queue=Q, per_page="20"))
    assert len(row_ids(small)) == 20
    assert "per_page=20" in small.context["page_links"][1][1]  # the pager keeps the size
    assert [size for size, current, _ in small.context["page_sizes"] if current] == [20]
    odd = superuser_client.get(tasks_url("scheduled", queue=Q, per_page="7"))
    assert len(row_ids(odd)) == len(ids)  # not a size offered: the default (50)


def test_the_list_reads_either_end_of_its_sorted_set(broker, superuser_client):
    ids = []
    for _ in range(3):
        ids += make_tasks(broker, S.ARCHIVED, Q)
        time.sleep(0.002)  # distinct archive times (ms): the order under test
    newest_first = row_ids(superuser_client.get(tasks_url("archived", queue=Q)))
    oldest_first = superuser_client.get(tasks_url("archived", queue=Q, order="reverse"))

    assert newest_first == ids[::-1]
    assert row_ids(oldest_first) == ids
    assert [label for label, current, _ in oldest_first.context["orders"] if current] == ["oldest first"]


def test_the_inspector_reads_a_page_from_the_other_end(broker, inspector):
    ids = enqueue(broker, Q, count=5)

    assert [t.id for t in inspector.list_tasks(Q, S.PENDING, offset=1, limit=2, reverse=True)] == ids[::-1][
        1:3
    ]
    assert [t.id for t in Operations().list_tasks(Q, S.PENDING, limit=10, reverse=True)] == ids[::-1]


def test_a_row_button_acts_on_its_task_after_asking(broker, superuser_client):
    kept, chosen = make_tasks(broker, S.ARCHIVED, Q, count=2)
    listing = superuser_client.get(tasks_url("archived", queue=Q))
    assert f'form="rtq-row-form" name="row" value="run:{chosen}"' in listing.text
    assert f'value="delete:{chosen}"' in listing.text

    data = {"row": f"run:{chosen}", "queue": Q, "state": "archived", "next": tasks_url("archived", queue=Q)}
    asked = superuser_client.post(ACTION_URL, data)
    assert "Run now: 1 selected task of queue 'emails'?" in text(asked)
    assert set(ids_in(broker, Q, S.ARCHIVED)) == {kept, chosen}  # asked first: nothing done yet
    done = superuser_client.post(ACTION_URL, {**dict(asked.context["hidden"]), "confirm": "yes"})

    assert messages_of(done) == ["1 task of queue 'emails' moved to pending."]
    assert ids_in(broker, Q, S.PENDING) == [chosen]
    assert ids_in(broker, Q, S.ARCHIVED) == [kept]


def test_a_row_button_for_an_action_the_state_refuses_does_nothing(broker, superuser_client):
    [task_id] = make_tasks(broker, S.PENDING, Q)
    data = {"row": f"run:{task_id}", "queue": Q, "state": "pending", "confirm": "yes"}

    assert messages_of(superuser_client.post(ACTION_URL, data)) == [
        "That action does not apply to pending tasks."
    ]
    assert ids_in(broker, Q, S.PENDING) == [task_id]


def test_viewers_get_no_row_buttons_and_may_not_post_one(broker, viewer_client):
    [task_id] = make_tasks(broker, S.ARCHIVED, Q)

    listing = viewer_client.get(tasks_url("archived", queue=Q))
    assert 'name="row"' not in listing.text and "Empty this state" not in listing.text
    data = {"row": f"delete:{task_id}", "queue": Q, "state": "archived", "confirm": "yes"}
    assert viewer_client.post(ACTION_URL, data).status_code == 403
    assert ids_in(broker, Q, S.ARCHIVED) == [task_id]


def test_empty_this_state_deletes_the_whole_state_after_asking(broker, superuser_client):
    make_tasks(broker, S.ARCHIVED, Q, count=3)
    [scheduled] = make_tasks(broker, S.SCHEDULED, Q)
    listing = superuser_client.get(tasks_url("archived", queue=Q))
    form = re.search(r'<form[^>]*id="rtq-empty-state">(.*?)</form>', listing.text, re.S).group(1)
    data = dict(re.findall(r'name="(\w+)" value="([^"]*)"', form))
    data.pop("csrfmiddlewaretoken")
    assert data == {
        "queue": Q,
        "state": "archived",
        "next": html.unescape(listing.context["here"]),
        "action": "delete",
        "scope": "all",
    }

    done = confirm(superuser_client, ACTION_URL, data)

    assert "/livetask/bulk/" in done["Location"]
    assert ids_in(broker, Q, S.ARCHIVED) == []
    assert ids_in(broker, Q, S.SCHEDULED) == [scheduled]


def test_no_empty_button_where_delete_does_not_apply(broker, superuser_client):
    make_tasks(broker, S.ACTIVE, Q)
    assert "Empty this state" not in superuser_client.get(tasks_url("active", queue=Q)).text
