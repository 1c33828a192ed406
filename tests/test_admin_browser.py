"""The admin in a real browser: headless Chromium (Debian's) driven by Playwright, on a live server.

Each test saves a screenshot of the page it ends on, in $RTQ_SCREENSHOTS_DIR or else a
temporary directory: `RTQ_SCREENSHOTS_DIR=docs/screenshots scripts/test -- tests/test_admin_browser.py`
refreshes the ones docs/admin.md shows.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from django_rtq.broker import TaskState
from django_rtq.broker.states import Action
from django_rtq.operations import Operations
from tests.conftest import wait_for
from tests.test_broker import ids_in
from tests.testapp import tasks as testapp_tasks

# Playwright's sync API runs an event loop in this thread; Django refuses database access from a
# thread with a running loop unless told that it is safe (it is: the loop is Playwright's own).
os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"

CHROMIUM = "/usr/bin/chromium"
ROOT = Path(__file__).resolve().parent.parent
SCREENSHOTS = Path(os.environ.get("RTQ_SCREENSHOTS_DIR") or Path(tempfile.gettempdir()) / "rtq-screenshots")

pytestmark = pytest.mark.django_db(transaction=True)
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
    context = browser.new_context(viewport={"width": 1440, "height": 900})
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
