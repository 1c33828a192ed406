"""Release B's receipts: release A's `deployapp.tasks.receipt`, moved and renamed; tasks queued
under the old name run here."""

from chaosapp.ledger import run, seconds_for

from django_rtq import task

RELEASE = "b"


@task(aliases=["deployapp.tasks.receipt"])
def send_receipt(i):
    return run(f"r{i}", RELEASE, seconds_for(i), {"i": i})
