"""The admin in a real browser: headless Chromium (Debian's) driven by Playwright, on a live server.

Each test saves a screenshot of the page it ends on, in $RTQ_SCREENSHOTS_DIR or else a
temporary directory: `RTQ_SCREENSHOTS_DIR=docs/screenshots scripts/test -- tests/test_admin_browser.py`
refreshes the ones docs/admin.md shows.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from urllib.parse import quote

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from django_rtq import outbox
from django_rtq.broker import TaskMessage, TaskState
from django_rtq.broker.states import Action
from django_rtq.models import FinishedTask, OutboxTask
from django_rtq.operations import Operations
from tests.support.factories import forget
from tests.support.polling import wait_for
from tests.support.reading import ids_in
from tests.support.runs import reports
from tests.testapp import tasks as testapp_tasks

# Playwright's sync API runs an event loop in this thread; Django refuses database access from a
# thread with a running loop unless told that it is safe (it is: the loop is Playwright's own).
os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"

CHROMIUM = "/usr/bin/chromium"
ROOT = Path(__file__).resolve().parent.parent
SCREENSHOTS = Path(os.environ.get("RTQ_SCREENSHOTS_DIR") or Path(tempfile.gettempdir()) / "rtq-screenshots")

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.browser]
S = TaskState


@pytest.fixture(scope="module")
def browser() -> Iterator:
    if not (Path(CHROMIUM).exists() or shutil.which("chromium")):
        pytest.fail(
            f"The browser tests need Debian's Chromium at {CHROMIUM}: apt-get install -y chromium "
            "(.ci/run installs it)."
        )
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("The browser tests need the playwright package: pip install -e '.[dev]'.")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--no-sandbox", "--disable-gpu"]
        )
        yield browser
        browser.close()


@pytest.fixture
def page(browser, live_server, broker):
    """A page logged in to the admin as a superuser."""
    User.objects.create_superuser("admin", "admin@example.com", "pw")
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(10_000)
    page.goto(f"{live_server.url}/admin/login/?next=/admin/")
    page.fill("#id_username", "admin")
    page.fill("#id_password", "pw")
    page.click("input[type=submit]")
    page.wait_for_url(f"{live_server.url}/admin/")
    yield page
    context.close()


def url(live_server, path: str) -> str:
    return f"{live_server.url}{path}"


def screenshot(page, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.wait_for_load_state("networkidle")  # the admin's CSS and fonts, after a redirect too
    # Tracebacks as repository paths: the pictures are committed, this machine's paths are not.
    page.evaluate(
        "root => document.querySelectorAll('pre').forEach("
        "e => { e.textContent = e.textContent.split(root).join(''); })",
        str(ROOT) + os.sep,
    )
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)


def archived_records(count: int, name: str) -> list[str]:
    """Archived `record` tasks a worker can run (scheduled, then archived by hand)."""
    ids = [testapp_tasks.record.using(delay=3600).enqueue(f"{name}-{i}").id for i in range(count)]
    assert Operations().act(Action.ARCHIVE, ids, "default").count == count
    return ids


def test_the_dashboard(page, live_server, broker, run_worker):
    qk = broker.queue("default")
    today = timezone.now().date()
    for days_ago, processed, failed in [(0, 130, 12), (1, 420, 3), (2, 380, 40), (5, 90, 0), (9, 250, 25)]:
        day = (today - timedelta(days=days_ago)).isoformat()
        broker.client.set(qk.processed(day), processed)
        broker.client.set(qk.failed(day), failed)
    archived_records(3, "dash")
    testapp_tasks.record.using(delay=600).enqueue("later")
    testapp_tasks.block.enqueue("dash-block")
    with run_worker(queues={"default": 3, "low": 1}, concurrency=4):
        wait_for(lambda: any(w.get("active") for w in broker.workers()), message="a worker running a task")
        page.goto(url(live_server, "/admin/"))
        page.get_by_role("link", name="Live tasks").click()

        assert page.locator("#rtq-queues caption").inner_text() == "QUEUES"
        row = page.locator("tr[data-queue='default']")
        assert row.locator("a[data-state='archived']").inner_text() == "3"
        assert row.locator("a[data-state='active']").inner_text() == "1"
        assert "tests.testapp.tasks.block" in page.locator("#rtq-workers").inner_text()
        assert page.locator("#rtq-history svg rect").count() >= 10
        screenshot(page, "dashboard")
        broker.client.set(testapp_tasks.report_key("release:dash-block"), "1")


def test_run_an_archived_task_now(page, live_server, broker, run_worker):
    ids = archived_records(3, "run")
    page.goto(url(live_server, "/admin/django_rtq/livetask/tasks/archived/?queue=default"))
    assert page.locator("#result_list tbody tr[data-task-id]").count() == 3
    screenshot(page, "archived-list")

    page.check(f"tr[data-task-id='{ids[1]}'] input[name=ids]")
    page.select_option("select[name=action]", "run")
    page.click("button[name=scope][value=selected]")
    assert "Run now: 1 selected task of queue 'default'?" in page.inner_text("#content")
    screenshot(page, "confirm-run-now")
    page.click("input[type=submit][value='Yes, run now']")

    assert "1 task of queue 'default' moved to pending." in page.inner_text(".messagelist")
    with run_worker():
        wait_for(lambda: broker.client.lrange(testapp_tasks.report_key("run-1"), 0, -1), message="the run")
    page.reload()
    listed = page.locator("#result_list tbody tr[data-task-id]")
    assert sorted(listed.evaluate_all("rows => rows.map(r => r.dataset.taskId)")) == sorted([ids[0], ids[2]])


def test_the_task_page(page, live_server, broker, run_worker):
    message = testapp_tasks.always_fails.using(priority=5).enqueue("shown")
    with run_worker():
        wait_for(lambda: ids_in(broker, "default", S.ARCHIVED) == [message.id], message="archived")
    page.goto(url(live_server, "/admin/django_rtq/livetask/tasks/archived/?queue=default"))
    page.click(f"a:text('{message.id}')")

    assert "ValueError: this task always fails" in page.inner_text("#rtq-error")
    assert "Traceback (most recent call last)" in page.inner_text("#rtq-error")
    assert '"shown"' in page.inner_text("#rtq-payload")
    screenshot(page, "task")


def test_a_snoozed_task_on_its_page(page, live_server, broker, run_worker):
    message = testapp_tasks.snoozes_once.enqueue("shown-snoozed", 600)
    with run_worker():
        wait_for(lambda: ids_in(broker, "default", S.SCHEDULED) == [message.id], message="snoozed")
    page.goto(url(live_server, "/admin/django_rtq/livetask/tasks/scheduled/?queue=default"))
    page.click(f"a:text('{message.id}')")

    snoozed = page.inner_text("#rtq-snoozed")
    assert "1 time, no attempt counted" in snoozed and "(last " in snoozed
    assert "0 retries of at most 2" in page.inner_text(".rtq-fields")


def test_cancel_an_active_task(page, live_server, broker, run_worker):
    message = testapp_tasks.block.enqueue("browser-cancel")
    with run_worker():
        wait_for(lambda: ids_in(broker, "default", S.ACTIVE) == [message.id], message="active")
        page.goto(url(live_server, "/admin/django_rtq/livetask/tasks/active/?queue=default"))
        screenshot(page, "active-list")
        page.check(f"tr[data-task-id='{message.id}'] input[name=ids]")
        page.select_option("select[name=action]", "cancel")
        page.click("button[name=scope][value=selected]")
        page.click("input[type=submit][value='Yes, cancel']")

        assert "Cancellation of 1 task requested" in page.inner_text(".messagelist")
        wait_for(lambda: ids_in(broker, "default", S.ARCHIVED) == [message.id], message="cancelled")
    page.goto(url(live_server, f"/admin/django_rtq/livetask/task/{message.id}/?queue=default"))
    assert "TaskCancelled" in page.inner_text("#rtq-error")


def test_pause_a_queue(page, live_server, broker):
    testapp_tasks.record.enqueue("waits")
    page.goto(url(live_server, "/admin/django_rtq/livetask/"))
    row = page.locator("tr[data-queue='default']")
    row.locator("input[type=submit][value=Pause]").click()
    assert "Pause queue 'default'?" in page.inner_text("#content")
    page.click("input[type=submit][value='Yes, pause']")

    assert "Queue 'default' paused." in page.inner_text(".messagelist")
    assert broker.is_paused("default")
    row = page.locator("tr[data-queue='default']")
    assert "paused" in row.inner_text()
    assert row.locator("input[type=submit][value=Resume]").count() == 1
    screenshot(page, "paused-queue")


def test_delete_every_archived_task_and_follow_the_progress(
    page, live_server, broker, run_worker, monkeypatch
):
    from playwright.sync_api import expect

    # Pages of two tasks, and a request that works one page only: the job outlives the request.
    monkeypatch.setattr("django_rtq.broker.bulk.PAGE", 2)
    monkeypatch.setattr("django_rtq.operations.REQUEST_BUDGET", 0)
    archived_records(6, "bulk")
    page.goto(url(live_server, "/admin/django_rtq/livetask/tasks/archived/?queue=default"))
    page.select_option("select[name=action]", "delete")
    page.click("button[name=scope][value=all]")
    assert "Delete: all 6 archived tasks of queue 'default'?" in page.inner_text("#content")
    page.click("input[type=submit][value='Yes, delete']")

    page.wait_for_url("**/livetask/bulk/default/*/")
    assert page.inner_text("#rtq-bulk-percent") == "33 %"  # 2 of 6, then the request answered
    assert page.locator("input[type=submit][value='Carry on here']").count() == 1
    screenshot(page, "bulk-running")
    with run_worker():  # its bulk runner carries the job on; the page reloads itself meanwhile
        expect(page.locator("#rtq-bulk-percent")).to_have_text("100 %", timeout=20_000)

    assert page.inner_text("#rtq-bulk-done") == "6 of 6 tasks deleted"
    assert page.locator("input[type=submit][value='Carry on here']").count() == 0
    assert ids_in(broker, "default", S.ARCHIVED) == []
    screenshot(page, "bulk-finished")
    page.click("a:text('Back to the dashboard')")
    job = page.locator("#rtq-bulk-jobs tr[data-job]")
    assert "Delete: archived tasks of queue 'default'" in job.inner_text()
    assert "finished" in job.inner_text()


# The admin as a daily tool: no page scrolls sideways, long values cut to their box.

#: Viewport widths every page must fit: a laptop, and a phone.
WIDTHS = (1280, 390)
#: An id as long as one stored before ids were checked (a list was once 39,562 px wide), long
#: arguments, a long error and a long schedule name.
LONG_ID = "imported-" + "0123456789abcdef" * 180
LONG_ARGUMENT = "lorem-ipsum-" * 400
LONG_ERROR = "ValueError: " + "the input was far too long to be accepted " * 60
LONG_SCHEDULE = "nightly-report-of-everything-" * 6
#: The queue of those tasks (no worker of the tests serves it).
WIDE = "reports"


def long_values(broker) -> dict[str, str]:
    """Tasks with long ids, arguments and errors in every state of queue `WIDE`; return an id of each."""
    from tests.support.factories import make_tasks

    ids = {}
    for state in sorted(S, key=lambda state: state == S.PENDING):  # pending last: the others claim
        [ids[state]] = make_tasks(
            broker, state, WIDE, args=[LONG_ARGUMENT, 7], kwargs={"note" * 20: LONG_ARGUMENT}
        )
    broker.enqueue(
        [
            TaskMessage(
                id=LONG_ID,
                task="tests.testapp.tasks.takes_anything",
                queue=WIDE,
                args=[LONG_ARGUMENT],
                enqueued_at=broker.clock(),
            )
        ]
    )
    assert Operations().act(Action.ARCHIVE, [LONG_ID], WIDE).count == 1
    qk = broker.queue(WIDE)
    for task_id in (*ids.values(), LONG_ID):
        info = json.loads(broker.client.hget(qk.info, task_id) or "{}")
        info.update(
            error=LONG_ERROR,
            error_type="ValueError",
            traceback='Traceback (most recent call last):\n  File "x.py", line 1, in f\n    '
            + "call(" * 80
            + ")" * 80
            + "\n"
            + LONG_ERROR,
            errors=[{"type": "ValueError", "message": LONG_ERROR}],
        )
        broker.client.hset(qk.info, task_id, json.dumps(info))
    return ids


def test_flow_control_on_the_dashboard_and_a_held_tasks_page(page, live_server, broker, settings):
    queue_limit = {"rate_limit": "100/m", "burst": 10, "max_concurrency": 5}
    settings.RTQ = {**settings.RTQ, "QUEUE_LIMITS": {"default": queue_limit}}
    limited = testapp_tasks.flow_two_at_once
    ids = [limited.enqueue(f"screen-{n}").id for n in range(5)]
    testapp_tasks.record.enqueue("screen")
    running = broker.claim("default", worker_id="web-1:4242:1f2e3d4c", limit=10)
    assert [task.id for task in running][:2] == ids[:2] and len(running) == 3  # and the `record`

    page.goto(url(live_server, "/admin/django_rtq/livetask/"))
    table = page.locator("[data-flow-queue='default']")
    assert "whole queue" in table.inner_text()
    row = table.locator(f"tr[data-scope='{limited.name}']")
    assert "at most 2 running" in row.inner_text() and "2 of 2" in row.inner_text()
    assert row.locator("a").inner_text() == "3"  # held back, linked to them
    table.scroll_into_view_if_needed()
    screenshot(page, "flow-control")

    page.goto(url(live_server, f"/admin/django_rtq/livetask/task/{ids[2]}/?queue=default"))
    reason = page.locator("#rtq-held-reason").inner_text()
    assert reason.startswith(f"Held back by the limits of its type {limited.name} (at most 2 running)")
    screenshot(page, "held-task")


#: A partitioned task type with limits for each partition and one partition it names.
PARTITIONED_TYPE = "crm.tasks.sync_contacts"


def test_flow_control_with_partitions_on_the_dashboard(page, live_server, broker):
    from django_rtq import registry

    registry.task(
        name=PARTITIONED_TYPE,
        queue="default",
        partition_by="customer",
        partition_max_concurrency=1,
        partition_rate_limit="30/m",
        partition_limits={"premium": {"max_concurrency": 3, "rate_limit": "120/m", "burst": 3}},
    )(lambda customer: None)
    try:
        for customer, count in (("acme", 4), ("globex", 2), ("initech", 1), ("premium", 5)):
            broker.enqueue(
                [
                    TaskMessage(
                        id=f"sync-{customer}-{n}-{time.time_ns()}",
                        task=PARTITIONED_TYPE,
                        queue="default",
                        partition=customer,
                        enqueued_at=time.time(),
                    )
                    for n in range(count)
                ]
            )
        broker.claim("default", worker_id="web-1:4242:1f2e3d4c", limit=20)

        page.goto(url(live_server, "/admin/django_rtq/livetask/"))
        table = page.locator("[data-flow-queue='default']")
        each = table.locator(f"tr[data-task='{PARTITIONED_TYPE}'][data-partition='']")
        assert "each partition" in each.inner_text() and "per partition" in each.inner_text()
        acme = table.locator(f"tr[data-task='{PARTITIONED_TYPE}'][data-partition='acme']")
        assert "partition acme" in acme.inner_text() and "1 of 1" in acme.inner_text()
        assert acme.locator("a").inner_text() == "3"  # held back, linked to them
        premium = table.locator(f"tr[data-task='{PARTITIONED_TYPE}'][data-partition='premium']")
        assert "at most 3 running" in premium.inner_text() and "3 of 3" in premium.inner_text()
        assert overflow(page) == 0, widest(page)
        table.scroll_into_view_if_needed()
        screenshot(page, "flow-control-partitions")
    finally:
        forget(PARTITIONED_TYPE)


#: A limited task type with a long name (flow control: the dashboard's table, a held task's page).
LONG_LIMITED_TYPE = "tests.wide." + "rate_limited_task_" * 12


@pytest.fixture
def held_back_task(broker) -> Iterator[str]:
    """A task of queue `WIDE` held back by its type's limit (registered for the test); its id."""
    from django_rtq import registry
    from django_rtq.connection import get_broker

    registry.task(name=LONG_LIMITED_TYPE, queue=WIDE, max_concurrency=1)(lambda: None)
    try:
        messages = [
            TaskMessage(
                id=f"held-{n}-{time.time_ns()}", task=LONG_LIMITED_TYPE, queue=WIDE, enqueued_at=time.time()
            )
            for n in range(2)
        ]
        get_broker().enqueue(messages)
        [started] = get_broker().claim(WIDE, worker_id="flow-test", limit=10)
        assert started.id == messages[0].id
        yield messages[1].id
    finally:
        forget(LONG_LIMITED_TYPE)


def outbox_rows() -> None:
    """Tasks waiting in the outbox, one with a long id, name and error, as a failing relay leaves it."""
    outbox.store([testapp_tasks.add.using(queue=WIDE).prepare(n, n) for n in range(3)], using="default")
    OutboxTask.objects.filter(pk=OutboxTask.objects.order_by("pk")[0].pk).update(
        task_id=LONG_ID[:255],
        task_name=LONG_LIMITED_TYPE,
        created_at=timezone.now() - timedelta(hours=2),
        attempts=4,
        last_error=LONG_ERROR,
    )


def overflow(page) -> int:
    """How many pixels the page is wider than the window (0: no sideways scroll)."""
    return page.evaluate("document.documentElement.scrollWidth - window.innerWidth")


def widest(page) -> list[str]:
    """The innermost elements reaching past the window's right edge, to say what is too wide."""
    return page.evaluate(
        """() => [...document.querySelectorAll('body *')]
        .filter(e => e.getBoundingClientRect().right > window.innerWidth + 1
                && ![...e.children].some(c => c.getBoundingClientRect().right > window.innerWidth + 1))
        .slice(0, 5)
        .map(e => `${e.tagName}#${e.id}.${e.className} ${Math.round(e.getBoundingClientRect().right)}`)"""
    )


def test_no_page_scrolls_sideways(page, live_server, broker, run_worker, settings, held_back_task):
    settings.RTQ = {
        **settings.RTQ,
        "PERIODIC": {
            LONG_SCHEDULE: {"task": "tests.testapp.tasks.record", "every": 3600, "args": [LONG_ARGUMENT]}
        },
        "QUEUE_LIMITS": {WIDE: {"rate_limit": "1000/h", "burst": 50, "max_concurrency": 20}},
    }
    ids = long_values(broker)  # after held_back_task, whose claim would take its pending task
    outbox_rows()
    job = Operations().start_bulk(Action.DELETE, "low", [S.ARCHIVED])
    FinishedTask.objects.create(
        task_id=LONG_ID[:255],
        task_name="tests.testapp.tasks.takes_anything",
        queue=WIDE,
        status=FinishedTask.Status.FAILED,
        args=[LONG_ARGUMENT],
        error_class="ValueError",
        error_message=LONG_ERROR,
        traceback="Traceback (most recent call last):\n    " + LONG_ERROR,
        finished_at=timezone.now(),
    )
    live = "/admin/django_rtq/livetask/"
    pages = [
        live,
        *(f"{live}tasks/{state}/?queue={WIDE}" for state in S),
        f"{live}task/{quote(LONG_ID, safe='')}/?queue={WIDE}",
        *(f"{live}task/{task_id}/?queue={WIDE}" for task_id in ids.values()),
        f"{live}task/{held_back_task}/?queue={WIDE}",
        f"{live}workers/",
        f"{live}periodic/",
        f"{live}outbox/",
        f"{live}bulk/low/{job.id}/",
        f"/admin/django_rtq/finishedtask/{quote(LONG_ID[:255], safe='')}/change/",
    ]
    testapp_tasks.block.enqueue("wide-" + "w" * 200)
    too_wide = []
    with run_worker():
        wait_for(lambda: any(w.get("active") for w in broker.workers()), message="a worker running a task")
        for width in WIDTHS:
            page.set_viewport_size({"width": width, "height": 900})
            for path in pages:
                page.goto(url(live_server, path))
                if excess := overflow(page):
                    too_wide.append((width, path[:120], excess, widest(page)))
            page.goto(url(live_server, f"{live}tasks/archived/?queue={WIDE}"))
            page.check("#rtq-select-all")
            page.click("button[name=scope][value=selected]")
            assert "Are you sure?" in page.inner_text("#content")
            if excess := overflow(page):
                too_wide.append((width, "the confirmation page", excess))
        broker.client.set(testapp_tasks.report_key("release:wide-" + "w" * 200), "1")
    assert too_wide == [], "\n".join(map(str, too_wide))


def test_select_all_and_the_selection_count(page, live_server, broker):
    ids = archived_records(3, "select")
    page.goto(url(live_server, "/admin/django_rtq/livetask/tasks/archived/?queue=default"))
    count = page.locator("#rtq-selected-count")
    assert count.inner_text() == "0 of 3 selected"

    page.check("#rtq-select-all")
    assert count.inner_text() == "3 of 3 selected"
    page.uncheck(f"tr[data-task-id='{ids[0]}'] input[name=ids]")
    assert count.inner_text() == "2 of 3 selected"
    assert page.evaluate("document.getElementById('rtq-select-all').indeterminate")
    page.check("#rtq-select-all")
    assert count.inner_text() == "3 of 3 selected"
    page.uncheck("#rtq-select-all")
    assert count.inner_text() == "0 of 3 selected"
    assert page.locator("input[name=ids]:checked").count() == 0


def test_a_row_button_acts_on_its_own_task(page, live_server, broker):
    kept, chosen = archived_records(2, "row")
    page.goto(url(live_server, "/admin/django_rtq/livetask/tasks/archived/?queue=default"))
    page.locator(f"tr[data-task-id='{chosen}'] button[name=row]", has_text="Delete").click()
    assert "Delete: 1 selected task of queue 'default'?" in page.inner_text("#content")
    page.click("input[type=submit][value='Yes, delete']")

    assert "1 task of queue 'default' deleted." in page.inner_text(".messagelist")
    assert ids_in(broker, "default", S.ARCHIVED) == [kept]


def test_auto_refresh_updates_counts_and_lists_in_place(page, live_server, broker):
    from playwright.sync_api import expect

    page.goto(url(live_server, "/admin/django_rtq/livetask/tasks/scheduled/?queue=default"))
    assert not page.is_checked("#rtq-auto-refresh")  # off by default
    page.check("#rtq-auto-refresh")
    page.evaluate("window.rtqNotReloaded = true")
    message = testapp_tasks.record.using(delay=600).enqueue("arrives")

    expect(page.locator(f"tr[data-task-id='{message.id}']")).to_have_count(1, timeout=15_000)
    expect(page.locator("#rtq-queue-filter")).to_contain_text("default (1)")
    assert page.evaluate("window.rtqNotReloaded === true")  # swapped in place, not reloaded
    page.reload()
    assert page.is_checked("#rtq-auto-refresh")  # remembered by the browser
    page.uncheck("#rtq-auto-refresh")


def test_copy_buttons_on_the_task_page(page, live_server, broker):
    from playwright.sync_api import expect

    message = testapp_tasks.record.using(delay=600).enqueue("copied", {"deep": [1, 2]})
    page.goto(url(live_server, f"/admin/django_rtq/livetask/task/{message.id}/?queue=default"))
    payload = page.locator("#rtq-payload pre").first
    assert payload.inner_text() == '[\n  "copied",\n  {\n    "deep": [\n      1,\n      2\n    ]\n  }\n]'
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    page.locator("#rtq-payload .rtq-copy").first.click()
    expect(page.locator("#rtq-payload .rtq-copy").first).to_have_text("Copied")
    assert page.evaluate("navigator.clipboard.readText()") == payload.inner_text()


def test_the_workers_and_periodic_pages(page, live_server, broker, run_worker, settings):
    settings.RTQ = {
        **settings.RTQ,
        "PERIODIC": {
            "nightly-report": {
                "task": "tests.testapp.tasks.record",
                "cron": "0 3 * * *",
                "args": ["nightly"],
            },
            "heartbeat": {"task": "tests.testapp.tasks.record", "every": 300, "args": ["beat"]},
        },
    }
    broker.client.hset(broker.queue("default").periodic, "heartbeat", int(time.time() // 300 * 300 * 1000))
    testapp_tasks.block.enqueue("on-the-workers-page")
    with run_worker(queues={"default": 3, "low": 1}, concurrency=4):
        wait_for(lambda: any(w.get("active") for w in broker.workers()), message="a worker running a task")
        page.goto(url(live_server, "/admin/django_rtq/livetask/"))
        page.click("#rtq-nav a:text('Workers')")
        assert "1 live worker, running 1 task of 4 at most." in page.inner_text("#rtq-worker-summary")
        assert "tests.testapp.tasks.block" in page.inner_text("#rtq-worker-list")
        screenshot(page, "workers")
        broker.client.set(testapp_tasks.report_key("release:on-the-workers-page"), "1")
    page.click("#rtq-nav a:text('Periodic tasks')")
    rows = page.locator("#rtq-periodic tr[data-schedule]")
    assert rows.count() == 2
    assert "cron 0 3 * * *" in page.inner_text("tr[data-schedule='nightly-report']")
    assert "every 5m 0s" in page.inner_text("tr[data-schedule='heartbeat']")
    screenshot(page, "periodic")


def test_a_list_on_a_phone(page, live_server, broker):
    archived_records(4, "phone")
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto(url(live_server, "/admin/django_rtq/livetask/tasks/archived/?queue=default"))
    assert overflow(page) <= 0
    screenshot(page, "archived-list-390")


def test_edit_an_archived_tasks_arguments_and_run_it_again(page, live_server, broker, run_worker):
    with run_worker():
        task_id = testapp_tasks.divide.enqueue(1, 0).id
        wait_for(lambda: Operations().live_task(task_id).state == S.ARCHIVED, message="the failed division")
    page.goto(url(live_server, f"/admin/django_rtq/livetask/task/{quote(task_id)}/?queue=default"))
    page.click("#rtq-edit-link")
    assert "divide(a, b, *, digits=None)" in page.inner_text("#rtq-edit-signature")

    page.fill("#rtq-args", "[9]")
    page.click("#rtq-edit-form input[type=submit]")
    assert "missing a required argument: 'b'" in page.inner_text("#rtq-edit-error")
    assert page.input_value("#rtq-args") == "[9]"  # what was typed stays, to correct it
    screenshot(page, "edit-arguments-refused")

    page.fill("#rtq-args", "[9, 4]")
    page.fill("#rtq-kwargs", '{"digits": 1}')
    page.click("#rtq-edit-form input[type=submit]")
    assert "Edit the arguments of task" in page.inner_text("#content")
    changes = page.inner_text("#rtq-confirm-changes")
    assert '"digits": 1' in changes
    screenshot(page, "confirm-edit-arguments")
    page.click("input[type=submit][value='Yes, edit and run again']")

    assert "edited and moved to pending." in page.inner_text(".messagelist")
    with run_worker():
        wait_for(lambda: Operations().live_task(task_id).state == S.COMPLETED, message="the edited run")
    page.reload()
    assert Operations().live_task(task_id).result == 2.2
    history = page.inner_text("#rtq-history")
    assert "admin" in history
    assert "archived" in history
    screenshot(page, "task-history")


def test_run_again_every_archived_task_of_a_type_and_an_error(page, live_server, broker, run_worker):
    with run_worker():
        zero = [testapp_tasks.divide.enqueue(n, 0).id for n in range(3)]
        other = testapp_tasks.divide.enqueue("a", 2).id  # a TypeError
        wait_for(lambda: Operations().count("default", S.ARCHIVED) == 4, message="four failed divisions")
    page.goto(url(live_server, "/admin/django_rtq/livetask/tasks/archived/?queue=default"))
    page.fill("#rtq-run-again input[name=task_name]", testapp_tasks.divide.name)
    page.fill("#rtq-run-again input[name=error_class]", "builtins.ZeroDivisionError")
    screenshot(page, "run-again-form")
    page.click("#rtq-run-again button[type=submit]")

    question = page.inner_text("#content")
    assert (
        f"all 3 archived tasks of type {testapp_tasks.divide.name} whose last error is a "
        "builtins.ZeroDivisionError of queue 'default'?"
    ) in question
    screenshot(page, "confirm-run-again")
    page.click("input[type=submit][value='Yes, run now']")

    # the request that started it works on it for a second: four tasks, finished at once
    assert page.get_attribute("#rtq-bulk", "data-finished") == "yes"
    assert page.inner_text("#rtq-bulk-done").startswith("3 of")
    screenshot(page, "run-again-progress")
    assert sorted(ids_in(broker, "default", S.PENDING)) == sorted(zero)
    assert ids_in(broker, "default", S.ARCHIVED) == [other]


def test_the_page_of_a_task_stopped_at_its_checkpoint(page, live_server, broker, run_worker, redis_client):
    message = testapp_tasks.counts_with_checkpoints.enqueue("browser", 100_000, pause=0.01)
    with run_worker(shutdown_timeout=60) as worker:
        wait_for(lambda: len(reports(redis_client, "browser")) >= 5, message="the task to count")
        worker.stop()  # it stops the handler at its next checkpoint, and gives the task back
    saved = reports(redis_client, "browser")[-1]
    page.goto(url(live_server, "/admin/django_rtq/livetask/tasks/pending/?queue=default"))
    page.click(f"a:text('{message.id}')")

    shown = page.inner_text("#rtq-checkpoint")
    assert f"Its next run resumes from {saved}, saved" in shown
    assert "0 retries" in page.inner_text("#content")
