"""The default of every setting, Django-free: the settings (`conf.py`) and the broker read them here."""

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
DEFAULT_KEY_PREFIX = "rtq"
DEFAULT_QUEUE = "default"
DEFAULT_CONCURRENCY = 10  # threads per worker process
DEFAULT_MAX_RETRIES = 5
DEFAULT_TIMEOUT_SECONDS = 1800.0  # asynq's default when neither timeout nor deadline is set
DEFAULT_RETENTION_SECONDS = 0.0  # completed tasks are deleted at once unless a task asks otherwise
DEFAULT_UNIQUE_TTL_SECONDS = 3600.0
# A dead worker's tasks run again within about LEASE + RECOVERY_GRACE + RECOVERER_INTERVAL
# seconds (7 s at these defaults). Leases are reckoned on the Redis server's clock.
DEFAULT_LEASE_SECONDS = 5.0
DEFAULT_RECOVERY_GRACE_SECONDS = 1.0  # past its expiry, for a renewal on its way to arrive
DEFAULT_HEARTBEAT_INTERVAL_SECONDS = 1.0  # leases are renewed this often
DEFAULT_MAX_SNOOZES = 100  # times a task may snooze (raise Snooze) before it is archived
DEFAULT_MAX_RECOVERIES = 5  # times a task may be taken back from a dead worker mid-run
DEFAULT_FORWARDER_INTERVAL_SECONDS = 1.0
DEFAULT_RECOVERER_INTERVAL_SECONDS = 1.0
DEFAULT_JANITOR_INTERVAL_SECONDS = 8.0
DEFAULT_HEALTHCHECK_INTERVAL_SECONDS = 15.0
DEFAULT_SYNCER_INTERVAL_SECONDS = 1.0
DEFAULT_SHUTDOWN_TIMEOUT_SECONDS = 8.0
DEFAULT_IDLE_WAIT_SECONDS = 1.0  # longest an idle worker waits before claiming again
DEFAULT_ARCHIVE_MAX_SIZE = 10_000
DEFAULT_ARCHIVE_MAX_AGE_SECONDS = 90 * 24 * 3600.0
# how long tasks no live worker can run wait (none taking them) before they are archived
DEFAULT_NO_WORKER_GRACE_SECONDS = 24 * 3600.0
DEFAULT_STATS_TTL_SECONDS = 90 * 24 * 3600.0  # how long per-day counters are kept
DEFAULT_MIRROR_INTERVAL_SECONDS = 1.0
DEFAULT_MIRROR_BATCH_SIZE = 500
DEFAULT_MIRROR_MAX_AGE_SECONDS = 30 * 24 * 3600.0  # rows older than this are pruned (by the workers)
DEFAULT_MIRROR_PRUNE_INTERVAL_SECONDS = 600.0  # the workers prune the mirror this often at most, together
DEFAULT_SCHEDULER_INTERVAL_SECONDS = 1.0
DEFAULT_COMMAND_INTERVAL_SECONDS = 0.5  # how often a worker looks for workflow commands left over
DEFAULT_OUTBOX_RELAY_AFTER_SECONDS = 5.0  # a row older than this is the relay's to send
DEFAULT_OUTBOX_RELAY_INTERVAL_SECONDS = 1.0
# how long a queue the project names nowhere stays listed once nothing uses it (the janitor forgets it)
DEFAULT_FORGET_EMPTY_QUEUES_AFTER_SECONDS = 24 * 3600.0
