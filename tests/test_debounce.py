"""Debounce (docs/debounce.md): a burst of enqueues of one key runs once, with the newest
arguments, a window after the last enqueue; on one Redis and on the 3-master Cluster."""

from __future__ import annotations

import re
from io import StringIO

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.db import transaction

from django_rtq import InvalidTask, Operations, task
from django_rtq.broker import Broker, TaskMessage, TaskState, manual
from django_rtq.broker import message as message_module
from django_rtq.broker.broker import OUTBOX_SENT, OUTBOX_SENT_BEFORE
from django_rtq.broker.waiting import NEWER_FORMAT, waiting_for_worker
from django_rtq.worker.processor import abilities
from django_rtq.workflows import chain
from tests.support.admin_pages import task_url, text
from tests.support.clock import FakeClock
from tests.support.factories import BILLING, EMAILS, SEARCH, claim, claim_ids, message
from tests.support.polling import wait_for
from tests.support.reading import column, ids_in, state_of
from tests.support.runs import task_state
from tests.testapp import dtasks, tasks

WINDOW = 5.0


def debounced(queue: str = SEARCH, key: str = "reindex:42", **fields) -> TaskMessage:
    return message(queue, debounce=WINDOW, debounce_key=key, **fields)


def stored(broker: Broker, queue: str, task_id: str) -> TaskMessage:
    raw = column(broker, queue, "msg", task_id)
    assert raw is not None
    return TaskMessage.from_json(raw, id=task_id, queue=queue)


def due_ms(broker: Broker, queue: str, task_id: str) -> float | None:
    return broker.client.zscore(broker.queue(queue).scheduled, task_id)


# The script, on one Redis and on the Cluster (any_broker), on a clock of the test's


@pytest.mark.parametrize("queue", [EMAILS, SEARCH, BILLING])  # one per node of the cluster
def test_a_burst_of_100_enqueues_runs_once_with_the_newest_arguments(
    any_broker: Broker, clock: FakeClock, queue
):
    burst = [debounced(queue, args=[42, n]) for n in range(100)]
    merged_into = []
    for m in burst:
        merged_into.append(any_broker.enqueue([m]))
        clock.advance(0.01)
    last_enqueue = clock.now - 0.01

    first = burst[0].id
    assert merged_into[0] == {}
    assert merged_into[1:] == [{0: first}] * 99  # each later enqueue names the copy that waits
    assert ids_in(any_broker, queue, TaskState.SCHEDULED) == [first]
    copy = stored(any_broker, queue, first)
    assert copy.args == [42, 99] and copy.merged_enqueues == 99 and copy.version() == 3
    assert due_ms(any_broker, queue, first) == int((last_enqueue + WINDOW) * 1000)

    clock.advance(WINDOW - 0.1)
    assert any_broker.forward(queue) == 0
    clock.advance(0.2)
    assert any_broker.forward(queue) == 1
    (run,) = claim(any_broker, queue)
    ran = TaskMessage.from_json(run.raw_message or "", id=run.id, queue=queue)
    assert (run.id, ran.args, ran.merged_enqueues) == (first, [42, 99], 99)


def test_each_enqueue_restarts_the_window(any_broker: Broker, clock: FakeClock):
    first = debounced(args=[1])
    any_broker.enqueue([first])
    for _ in range(3):
        clock.advance(WINDOW - 1)  # never a whole window of quiet
        any_broker.enqueue([debounced(args=[2])])
        assert any_broker.forward(SEARCH) == 0
    clock.advance(WINDOW - 1)
    assert any_broker.forward(SEARCH) == 0
    clock.advance(1)
    assert any_broker.forward(SEARCH) == 1
    assert claim_ids(any_broker, SEARCH) == [first.id]


@pytest.mark.parametrize("started", [False, True])
def test_once_the_copy_is_due_a_new_enqueue_starts_another(any_broker: Broker, clock: FakeClock, started):
    first = debounced(args=[1])
    any_broker.enqueue([first])
    clock.advance(WINDOW)
    assert any_broker.forward(SEARCH) == 1  # due: pending, its arguments final
    if started:
        assert claim_ids(any_broker, SEARCH) == [first.id]  # running
    second = debounced(args=[2])
    assert any_broker.enqueue([second]) == {}
    assert ids_in(any_broker, SEARCH, TaskState.SCHEDULED) == [second.id]
    assert stored(any_broker, SEARCH, first.id).args == [1]  # the first copy is left as it was
    third = debounced(args=[3])
    assert any_broker.enqueue([third]) == {0: second.id}  # the new copy takes the next burst


def test_a_copy_deleted_while_it_waits_is_not_merged_into(any_broker: Broker, clock: FakeClock):
    first = debounced(args=[1])
    any_broker.enqueue([first])
    assert manual.delete(any_broker, SEARCH, [first.id]) == 1
    second = debounced(args=[2])
    assert any_broker.enqueue([second]) == {}
    assert state_of(any_broker, SEARCH, second.id) == TaskState.SCHEDULED


def test_keys_are_apart_and_calls_of_one_batch_merge(any_broker: Broker, clock: FakeClock):
    a1, b1 = debounced(args=["a1"], key="a"), debounced(args=["b1"], key="b")
    a2, plain = debounced(args=["a2"], key="a"), message(SEARCH, args=["plain"])
    assert any_broker.enqueue([a1, b1, a2, plain]) == {2: a1.id}
    assert sorted(ids_in(any_broker, SEARCH, TaskState.SCHEDULED)) == sorted([a1.id, b1.id])
    assert ids_in(any_broker, SEARCH, TaskState.PENDING) == [plain.id]
    assert stored(any_broker, SEARCH, a1.id).args == ["a2"]
    assert stored(any_broker, SEARCH, b1.id).merged_enqueues == 0


def test_the_newest_priority_is_taken(any_broker: Broker, clock: FakeClock):
    first = debounced(priority=10)
    any_broker.enqueue([first])
    any_broker.enqueue([debounced(priority=0)])
    assert column(any_broker, SEARCH, "priority", first.id) is None
    any_broker.enqueue([debounced(priority=-5)])
    assert column(any_broker, SEARCH, "priority", first.id) == "-5"


def test_the_outbox_send_merges_and_a_resend_of_its_row_merges_nothing(any_broker: Broker, clock: FakeClock):
    first, second = debounced(args=[1]), debounced(args=[2])
    assert any_broker.send_outboxed([first]) == [OUTBOX_SENT]
    assert any_broker.send_outboxed([second]) == [OUTBOX_SENT]
    assert any_broker.send_outboxed([second]) == [OUTBOX_SENT_BEFORE]  # its row sent again
    assert ids_in(any_broker, SEARCH, TaskState.SCHEDULED) == [first.id]
    copy = stored(any_broker, SEARCH, first.id)
    assert (copy.args, copy.merged_enqueues) == ([2], 1)


def test_the_key_lives_in_the_queues_slot_and_outlives_the_window(any_broker: Broker, clock: FakeClock):
    any_broker.enqueue([debounced(key="reindex:7")])
    key = any_broker.queue(SEARCH).debounce("reindex:7")
    assert "{" + SEARCH + "}" in key
    ttl_ms = any_broker.client.pttl(key)
    assert WINDOW * 1000 < ttl_ms <= WINDOW * 1000 + 60_000


# Through @task, .using(), the backend and the outbox (one Redis)


def test_task_debounce_merges_calls_of_one_key_and_returns_the_copy_that_waits(broker):
    first = tasks.reindex.enqueue("article-1", value="v1")
    later = [tasks.reindex.enqueue("article-1", value=f"v{n}") for n in range(2, 6)]
    other = tasks.reindex.enqueue("article-2", value="w1")

    assert {m.id for m in later} == {first.id}  # the caller's handle is of the task that runs
    assert other.id != first.id
    task = Operations().live_task(first.id)
    assert task.state == TaskState.SCHEDULED
    assert task.message.kwargs == {"value": "v5"} and task.message.merged_enqueues == 4
    assert task.message.debounce_key == "reindex:article-1" and task.message.debounce == 0.5


def test_the_default_key_is_the_task_and_all_its_arguments(broker):
    a = tasks.rebuild.enqueue("menu")
    assert tasks.rebuild.enqueue("menu").id == a.id
    assert tasks.rebuild.enqueue("footer").id != a.id
    assert a.debounce_key.startswith(f"{tasks.rebuild.name}:")


def test_using_sets_or_lifts_debounce(broker):
    lifted = tasks.record.using(debounce=1, debounce_key="k").enqueue("x")
    assert tasks.record.using(debounce=1, debounce_key="k").enqueue("y").id == lifted.id
    plain = tasks.rebuild.using(debounce=None)
    assert plain.enqueue("menu").id != plain.enqueue("menu").id


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"unique": True}, "unique or debounce, not both"),
        ({"delay": 3}, "no delay or process_at"),
        ({"debounce": 0}, "a millisecond at least"),
        ({"debounce": None, "debounce_key": "k"}, "debounce_key needs debounce"),
        ({"debounce_key": lambda name: ""}, "debounce_key must be a non-empty string"),
    ],
)
def test_options_debounce_does_not_go_with_are_refused(broker, options, error):
    with pytest.raises(InvalidTask, match=error):
        tasks.rebuild.using(**options).prepare("menu")


def test_a_periodic_task_type_cannot_be_debounced():
    with pytest.raises(ImproperlyConfigured, match="cannot be debounced"):
        task(name="tests.debounced_tick", every=60, debounce=5)(lambda: None)


def test_a_workflow_step_of_a_debounced_type_is_not_debounced(broker):
    chain(tasks.rebuild.si("menu"), tasks.rebuild.si("menu")).enqueue()
    children = [t for t in ids_in(broker, "default", TaskState.PENDING)]
    assert len(children) == 1  # the chain's first step, at once
    assert stored(broker, "default", children[0]).debounce is None
    assert broker.client.keys(broker.queue("default").debounce("*")) == []


def test_djangos_task_on_the_backend_is_debounced_and_its_result_is_the_copy_that_waits(broker):
    first = dtasks.reindex_page.enqueue(7, "draft")
    later = dtasks.reindex_page.enqueue(7, "final")
    other = dtasks.reindex_page.enqueue(8, "other")

    assert later.id == first.id != other.id
    task = Operations().live_task(first.id)
    assert task.state == TaskState.SCHEDULED
    assert task.message.args == [7, "final"] and task.message.merged_enqueues == 1


@pytest.mark.django_db(transaction=True)
def test_enqueue_on_commit_debounces_when_the_commit_sends(broker):
    with transaction.atomic():
        first = tasks.reindex.enqueue_on_commit("article-9", value="a")
        tasks.reindex.enqueue_on_commit("article-9", value="b")
    with transaction.atomic():
        tasks.reindex.enqueue_on_commit("article-9", value="c")
    assert ids_in(broker, "default", TaskState.SCHEDULED) == [first.id]
    copy = stored(broker, "default", first.id)
    assert (copy.kwargs, copy.merged_enqueues) == ({"value": "c"}, 2)


# Where it shows: the admin's task page, the API, rtq_task


@pytest.mark.django_db
def test_the_admin_and_the_api_show_the_window_the_key_and_the_merges(broker, superuser_client, reader_api):
    first = tasks.reindex.enqueue("article-5", value="a")
    for value in "bcd":
        tasks.reindex.enqueue("article-5", value=value)

    page = text(superuser_client.get(task_url(first.id, queue="default")))
    assert "<tr><th>Debounce</th><td>0.5s</td></tr>" in page
    assert "<tr><th>Debounce key</th><td>reindex:article-5</td></tr>" in page
    assert "<tr><th>Merged enqueues</th><td>3</td></tr>" in page

    body = reader_api.get(f"/rtq/api/tasks/{first.id}/?queue=default").json()
    assert body["state"] == "scheduled" and body["kwargs"] == {"value": "d"}
    assert body["debounce"] == {"window": 0.5, "key": "reindex:article-5", "merged_enqueues": 3}
    plain = tasks.record.enqueue("plain")
    assert reader_api.get(f"/rtq/api/tasks/{plain.id}/?queue=default").json()["debounce"] is None


def test_rtq_task_shows_the_merges(broker):
    first = tasks.reindex.enqueue("article-6", value="a")
    tasks.reindex.enqueue("article-6", value="b")
    shown = StringIO()
    call_command("rtq_task", first.id, stdout=shown)
    assert re.search(r"\nmerged_enqueues: +1\n", shown.getvalue())
    assert re.search(r"\ndebounce: +0\.5s\n", shown.getvalue())


# Workers of other releases


def test_a_worker_that_reads_format_2_leaves_a_debounced_task_for_one_that_reads_3(
    broker, inspector, run_worker, redis_client, monkeypatch
):
    plain = tasks.record.enqueue("plain-run").id
    debounced_task = tasks.reindex.using(debounce=0.05).enqueue("left", value="v").id
    wait_for(lambda: broker.forward("default") or state_of(broker, "default", debounced_task) == "pending")

    with monkeypatch.context() as older_release:
        older_release.setattr(message_module, "MESSAGE_FORMAT", 2)
        older_release.setattr(abilities, "READABLE", {**abilities.READABLE, "message": 2})
        with run_worker(queues={"default": 1}):
            wait_for(lambda: task_state(inspector, plain) is None, message="the plain task")
            [waiting] = wait_for(lambda: waiting_for_worker(broker, "default"), message="the debounced task")
    assert waiting.why == NEWER_FORMAT
    assert redis_client.lrange(tasks.report_key("left"), 0, -1) == []

    with run_worker(queues={"default": 1}):
        wait_for(lambda: redis_client.lrange(tasks.report_key("left"), 0, -1) == ["v"])


# A real worker


def test_a_worker_process_runs_a_burst_once_with_the_newest_arguments(broker, start_worker, redis_client):
    start_worker()
    for n in range(50):
        tasks.reindex.enqueue("burst", value=str(n))
    wait_for(lambda: redis_client.lrange(tasks.report_key("burst"), 0, -1), timeout=20)
    assert redis_client.lrange(tasks.report_key("burst"), 0, -1) == ["49"]
    # a later burst, once the copy has run, runs again
    tasks.reindex.enqueue("burst", value="again")
    wait_for(lambda: len(redis_client.lrange(tasks.report_key("burst"), 0, -1)) == 2, timeout=20)
    assert redis_client.lrange(tasks.report_key("burst"), 0, -1) == ["49", "again"]
