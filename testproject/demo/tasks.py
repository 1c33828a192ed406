"""The demo's task types, written the way a project's own `tasks.py` would be.

django-rtq imports the `tasks` module of every installed app, so the worker knows these.
"""

import asyncio
import logging
import time
from datetime import UTC, datetime

from django.conf import settings
from django.contrib.auth import get_user_model

from django_rtq import get_broker, task

logger = logging.getLogger(__name__)

#: Seconds a finished demo task stays in Redis. With the default (0) a completed task is
#: deleted at once; the demo keeps them so that `rtq_demo` can show their final state.
KEEP_SECONDS = 300


@task(queue="critical", retention=KEEP_SECONDS)
def send_welcome_email(user_id: int) -> str:
    """Pretend to send a new user their welcome email."""
    user = get_user_model().objects.get(pk=user_id)
    time.sleep(0.3)  # the mail server is slow
    logger.info("sent the welcome email to %s", user.email)
    return f"welcome email sent to {user.email}"


@task(queue="default", max_retries=3, retention=KEEP_SECONDS)
def generate_report(report_id: str, month: str | None = None) -> dict:
    """Build a monthly report. Its first attempt fails (a flaky database); the retry succeeds.

    Handlers run at least once, so a real one should be idempotent: this one keeps its
    attempt count in Redis, keyed by the report, to know which attempt it is.
    """
    month = month or datetime.now(UTC).strftime("%Y-%m")
    client = get_broker().client
    key = f"{settings.RTQ['KEY_PREFIX']}:demo:report-attempts:{report_id}"
    attempt = client.incr(key)
    client.expire(key, KEEP_SECONDS)
    if attempt == 1:
        logger.warning("report %s: attempt %d failed, it will be retried", report_id, attempt)
        raise TimeoutError("the reporting database did not answer within 30 s")
    logger.info("report %s for %s done on attempt %d", report_id, month, attempt)
    return {"report": report_id, "month": month, "rows": 1284, "attempts": attempt}


@task(queue="low", max_retries=1, retention=KEEP_SECONDS)
def import_legacy_data() -> int:
    """Import a legacy export that is broken: every attempt fails, so the task ends archived."""
    time.sleep(0.1)
    raise ValueError("legacy export is corrupt: unexpected end of file at row 5120")


@task(queue="default", retention=KEEP_SECONDS)
async def fetch_exchange_rates(base: str) -> dict:
    """An async handler: the worker runs it on an event loop of its own."""
    await asyncio.sleep(0.2)  # an HTTP call with httpx or aiohttp, say
    rates = {"EUR": 0.92, "GBP": 0.79, "JPY": 151.2}
    logger.info("fetched %d exchange rates for %s", len(rates), base)
    return {"base": base, "rates": rates}


@task(queue="low", retention=KEEP_SECONDS)
def send_trial_reminder(user_id: int) -> str:
    """Remind a user that their trial ends soon; the demo enqueues it with a delay."""
    user = get_user_model().objects.get(pk=user_id)
    logger.info("reminded %s that their trial ends soon", user.email)
    return f"trial reminder sent to {user.email}"
