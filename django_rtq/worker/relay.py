"""The relay sends the outbox's tasks that their sender could not (django_rtq/outbox.py)."""

from __future__ import annotations

import time

from django.db import DatabaseError, connections

from ..broker import Broker
from ..outbox import FORGET_INTERVAL, RELAY_BATCH, forget_sent, relay
from ..registry import announce_enqueued
from ..tables import migrate_hint, missing_table
from .component import Component


class Relay(Component):
    """Sends the rows due in the outbox to Redis, a batch at a time, each row once however many
    workers relay (leases, and `SKIP LOCKED` where the database has it); then forgets the ids
    of sent tasks whose rows are gone.

    While the database is unreachable, or the outbox's table is missing (then it says to run
    `migrate`), it logs it once and tries again on every pass.
    """

    name = "relay"

    def __init__(self, *, broker: Broker, interval: float, using: str = "default") -> None:
        super().__init__(interval=interval)
        self.broker = broker
        self.using = using
        self._database_down = False
        self._forgot_at = -FORGET_INTERVAL  # time.monotonic() of the last forget_sent()

    def run_once(self, *, max_batches: int | None = None) -> int:
        """Relay the rows due (or up to `max_batches` batches of them); return how many it took."""
        # The connection stays open between passes (a relay polls every second); it is closed
        # after an error, and opened again by the next pass.
        connection = connections[self.using]
        taken, batches = 0, 0
        try:
            while max_batches is None or batches < max_batches:
                batches += 1
                count = relay(self.broker, using=self.using, announce=announce_enqueued)
                taken += count
                if count < RELAY_BATCH or self._stop.is_set():
                    break
            if time.monotonic() - self._forgot_at >= FORGET_INTERVAL:
                forget_sent(self.broker, using=self.using)
                self._forgot_at = time.monotonic()
        except DatabaseError as exc:
            if not self._database_down:
                table = missing_table(exc)
                if table is not None:
                    hint = migrate_hint(table, self.using)
                    self.logger.error("cannot relay the outbox: %s (%s)", hint, exc)
                else:
                    self.logger.warning("cannot read the outbox (%s); it is relayed once it can be", exc)
            self._database_down = True
            connection.close()  # reconnect on the next pass
            return taken
        if self._database_down:
            self.logger.warning("the outbox can be read again; its tasks are being relayed")
            self._database_down = False
        return taken

    def _loop(self) -> None:
        try:
            super()._loop()
        finally:
            connections[self.using].close()
