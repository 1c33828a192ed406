"""Issue 24, deploys: two releases of a project side by side on one queue, and a message of a
format newer than the worker reads. A worker leaves what it cannot run for one that can
("parked"): it neither runs, archives nor charges an attempt for it.

Release A and release B of the chaos project's `deployapp` (tests/chaos/project/releases/) are
the same project (same settings, same secret key); a process runs one of them. B adds a task
type (`d`), adds an argument with a default to one (`c(i)` becomes `c(i, j=0)`), and moves one
(`deployapp.tasks.receipt` becomes `deployapp.receipts.send_receipt`, A's name kept as an alias).
"""

from __future__ import annotations

import json
import signal
import statistics
import time
import uuid
from collections import Counter

import pytest

from django_rtq.broker import Broker
from django_rtq.broker.claims import PARKED_BASE
from django_rtq.broker.versions import MESSAGE_FORMAT
from django_rtq.broker.waiting import waiting_for_worker
from django_rtq.defaults import DEFAULT_IDLE_WAIT_SECONDS, DEFAULT_SHUTDOWN_TIMEOUT_SECONDS
from django_rtq.worker.server import EXIT_GRACE_SECONDS
from tests.chaos.harness import KEY_PREFIX, QUEUE, Chaos, report
from tests.chaos.in_flight import SLACK_SECONDS, aborted_by, going
from tests.support.polling import wait_for

pytestmark = pytest.mark.chaos

C = "deployapp.tasks.c"
D = "deployapp.tasks.d"
RECEIPT = "deployapp.tasks.receipt"  # release A's name, release B's alias
SEND_RECEIPT = "deployapp.receipts.send_receipt"  # release B's name
#: Calls of each of A's two task types in the stream A's web sends through the deploy (numbered
#: below STREAM_END in chaosapp/ledger.py: runs of 0.2-0.5 s that keep a worker busy).
STREAM = 200
STREAM_INTERVAL = 0.05
#: Calls of each kind in a batch (numbered from 1000 on: runs of 10 ms).
BATCH = 200
#: Stream runs A's worker must end while B's tasks wait, to show it still works.
A_RUNS_WHILE_PARKED = 50
#: Seconds the queue may take to drain after the last enqueue: nothing waits for a lease (A's
#: worker finished its runs and gave back the rest at SIGTERM), so B, woken or after an idle
#: wait, runs the last stream run (0.5 s at most) and the batch of 10 ms runs on its 10 threads.
DRAIN_LIMIT = DEFAULT_IDLE_WAIT_SECONDS + 0.5 + BATCH * 0.01 / 10 + SLACK_SECONDS  # 3.7 s
#: A's worker exits within this many seconds of its SIGTERM: its runs of 0.5 s at most end
#: within the shutdown timeout, and it exits within EXIT_GRACE_SECONDS of stopping.
EXIT_LIMIT = DEFAULT_SHUTDOWN_TIMEOUT_SECONDS + EXIT_GRACE_SECONDS + SLACK_SECONDS
#: Seconds a parked task is watched for a claim that should not come (several idle waits).
WATCH_SECONDS = 3.0


def calls(name: str, task: str, numbers: range, **kwargs) -> list[tuple[str, str, list, dict]]:
    """`(key, task, args, kwargs)` of `task(i, **kwargs)` for each i; keys are `<name><i>`."""
    return [(f"{name}{i}", task, [i], dict(kwargs)) for i in numbers]


def interleave(*lists: list) -> list:
    return [call for group in zip(*lists, strict=True) for call in group]


def waiting_counts(broker: Broker) -> Counter[tuple[str, str]]:
    """How many tasks of each (type, why) wait for a worker that can run them."""
    counts: Counter[tuple[str, str]] = Counter()
    for kind in waiting_for_worker(broker, QUEUE):
        counts[kind.task, kind.why] += kind.count
    return counts


def parked(chaos: Chaos, task_ids: list[str]) -> int:
    """How many of these tasks are pending with a parked score."""
    scores = chaos.client.zmscore(chaos.keys.pending, task_ids)
    return sum(score is not None and score >= PARKED_BASE for score in scores)


@pytest.mark.timeout(180)
def test_rolling_deploy(redis_servers, chaos_project):
    """A's worker runs A's web's stream; B's web sends what only B can run (a new type, a new
    argument, a moved type under its new name): A's worker claims those and leaves them
    waiting, and goes on with its stream. B's worker starts; A's worker gets SIGTERM with runs in
    flight; A's web, still up, sends A's old name: B runs it under its alias. Every task runs
    once, with its own arguments, none archived, no attempt charged."""
    chaos = chaos_project(redis_servers().url)
    broker = Broker(chaos.client, prefix=KEY_PREFIX)
    worker_a = chaos.start_worker(name="release-a", release="a")
    stream = interleave(calls("c", C, range(STREAM)), calls("r", RECEIPT, range(STREAM)))
    web_a = chaos.call(stream, name="web-a", release="a", interval=STREAM_INTERVAL)
    chaos.wait_started(1)

    # B's web is deployed first: it sends tasks of B's code, each kind 200 times.
    numbers = range(1000, 1000 + BATCH)
    only_b = interleave(
        calls("d", D, numbers), calls("c", C, numbers, j=1), calls("r", SEND_RECEIPT, numbers)
    )
    web_b = chaos.call(only_b, name="web-b", release="b")
    wait_for(lambda: web_b.poll() is not None, timeout=60, message="B's web to send its tasks")
    assert web_b.returncode == 0 and not chaos.refused(), (chaos.dir / "web-b.log").read_text()
    acked = chaos.acknowledged()
    only_b_ids = [acked[key] for key, *_ in only_b]
    expected_waiting = {(D, "type"): BATCH, (C, "args"): BATCH, (SEND_RECEIPT, "type"): BATCH}
    wait_for(
        lambda: waiting_counts(broker) == expected_waiting,
        timeout=30,
        message=f"A's worker to leave B's tasks waiting: {expected_waiting}",
    )
    claims_parked = chaos.claims(only_b_ids)
    parked_by_a = parked(chaos, only_b_ids)

    # A's worker goes on with its stream meanwhile, and claims none of B's tasks again.
    ended_by_a = chaos.runlog.refresh().ended.total()
    chaos.wait_ended(ended_by_a + A_RUNS_WHILE_PARKED, timeout=30)
    claims_later = chaos.claims(only_b_ids)
    waiting_later = waiting_counts(broker)

    worker_b = chaos.start_worker(name="release-b", release="b")
    wait_for(
        lambda: any(entry["ran_by"] == "b" for entry in chaos.ledger()),
        timeout=30,
        message="B's worker to run a task",
    )
    wait_for(
        lambda: chaos.running_at(time.time(), worker_a.pid),
        timeout=10,
        message="A's worker to have a run going",
        interval=0.005,
    )
    worker_a.process.send_signal(signal.SIGTERM)
    sigterm_at = time.time()
    streaming = web_a.poll() is None  # the work goes on past the SIGTERM
    wait_for(lambda: worker_a.process.poll() is not None, timeout=EXIT_LIMIT, message="A's worker to exit")
    exited_after = time.time() - sigterm_at

    # A's web is still up after A's workers are gone: it sends A's old name.
    late = calls("r", RECEIPT, range(2000, 2000 + BATCH))
    chaos.call(late, name="web-a-late", release="a")
    chaos.wait_clients(timeout=60)
    enqueued_at = time.time()
    drained_at = chaos.wait_drained(3 * DRAIN_LIMIT)

    ledger = chaos.ledger()
    runs = Counter(entry["key"] for entry in ledger)
    by_release = Counter(entry["ran_by"] for entry in ledger)
    b_only_keys = {key for key, *_ in only_b + late}
    old_name_keys = {key for key, task, *_ in stream + late if task == RECEIPT}
    pids = {"a": worker_a.pid, "b": worker_b.pid}
    problems = []
    # A claim takes a task of a kind new to A's worker, and the worker parks it (park.lua); once
    # the worker knows the kind, its claims park the kind's tasks without taking them (claim.lua).
    claimed_then_parked = sum(claims_parked)
    if parked_by_a != len(only_b_ids) or max(claims_parked) > 1 or not claimed_then_parked:
        problems.append(
            f"A's worker parked {parked_by_a} of B's {len(only_b_ids)} tasks, claims {Counter(claims_parked)}"
        )
    if claims_later != claims_parked:
        problems.append(
            f"B's tasks claimed again while waiting: {Counter(claims_later)} from {Counter(claims_parked)}"
        )
    if waiting_later != expected_waiting:
        problems.append(f"the waiting tasks changed while A ran its stream: {dict(waiting_later)}")
    if worker_a.process.returncode:
        problems.append(f"A's worker exited {worker_a.process.returncode} after SIGTERM")
    running = chaos.running_at(sigterm_at, worker_a.pid)
    if not running:
        problems.append("A's worker had no run going at SIGTERM")
    if not streaming:
        problems.append("A's web had sent its whole stream before the SIGTERM")
    # The runs A had going at its SIGTERM end in A (none stopped, none left open at its exit).
    cut_in_a = len(aborted_by(chaos, worker_a.pid)) + going(chaos)[worker_a.pid]
    if cut_in_a:
        problems.append(f"{cut_in_a} run(s) of A's worker did not end though the shutdown timeout let them")
    problems += ledger_problems(ledger, runs, pids)
    wrong_release = sorted(
        entry["key"] for entry in ledger if entry["key"] in b_only_keys and entry["ran_by"] != "b"
    )
    if wrong_release:
        problems.append(f"{len(wrong_release)} task(s) only B can run ran elsewhere: {wrong_release[:5]}")
    alias_runs = sum(1 for entry in ledger if entry["key"] in old_name_keys and entry["ran_by"] == "b")
    if alias_runs < len(late):
        problems.append(
            f"B ran {alias_runs} task(s) under A's old name, fewer than A's web sent late ({len(late)})"
        )
    if drained_at is not None and drained_at - enqueued_at > DRAIN_LIMIT:
        problems.append(
            f"drained {drained_at - enqueued_at:.1f}s after the last enqueue, over {DRAIN_LIMIT}s"
        )
    claims = [entry["claims"] for entry in ledger]
    chaos.verify(
        "rolling-deploy",
        f"parked={parked_by_a} claimed_then_parked={claimed_then_parked} "
        f"claimed_while_parked={sum(claims_later) - claimed_then_parked} runs_at_sigterm={running} "
        f"runs_cut_at_sigterm={cut_in_a} exit_after_sigterm={exited_after:.1f}s "
        f"ran_by_a={by_release['a']} ran_by_b={by_release['b']} alias_runs={alias_runs} "
        f"claims_per_task=max:{max(claims, default=0)},mean:{statistics.fmean(claims or [0]):.2f} "
        f"drain_after_last_enqueue={'never' if drained_at is None else f'{drained_at - enqueued_at:.1f}s'}",
        last_fault=sigterm_at,
        drained_at=drained_at,
        problems=problems,
    )


def ledger_problems(ledger: list[dict], runs: Counter[str], pids: dict[str, int]) -> list[str]:
    """What is wrong in the ledger of the deploy: a task run twice, with arguments other than its
    own, in another process than its release's worker, or charged an attempt."""
    problems = []
    twice = sorted(key for key, count in runs.items() if count > 1)
    if twice:
        problems.append(f"{len(twice)} task(s) ran more than once: {twice[:5]}")
    wrong_args, wrong_pid, charged = [], [], []
    for entry in ledger:
        key, args = entry["key"], entry["args"]
        number = int(key[1:])
        j = 1 if key[0] == "c" and 1000 <= number < 2000 else 0
        if args.get("i") != number or args.get("j", 0) != j:
            wrong_args.append((key, args))
        if entry["pid"] != pids[entry["ran_by"]]:
            wrong_pid.append((key, entry["ran_by"], entry["pid"]))
        if entry["retried"] or entry["recovered"] or entry["requeued"]:
            charged.append({k: entry[k] for k in ("key", "retried", "recovered", "requeued")})
    if wrong_args:
        problems.append(f"{len(wrong_args)} task(s) ran with other arguments: {wrong_args[:5]}")
    if wrong_pid:
        problems.append(f"{len(wrong_pid)} task(s) ran outside their release's worker: {wrong_pid[:5]}")
    if charged:
        problems.append(f"{len(charged)} task(s) were charged an attempt or taken back: {charged[:5]}")
    return problems


@pytest.mark.timeout(120)
def test_newer_message_format(redis_servers, chaos_project):
    """Messages of MESSAGE_FORMAT + 1, written as a newer release would (with a field this one
    does not know), one handed to an idle worker and one among a burst: the worker of this
    release leaves them waiting, claims them once, archives none, and runs the rest."""
    chaos = chaos_project(redis_servers().url)
    broker = Broker(chaos.client, prefix=KEY_PREFIX)
    qk = broker.queue(QUEUE)
    chaos.start_worker(name="current", release="a")
    chaos.call(calls("c", C, range(1000, 1050)), name="web-1", release="a")
    chaos.wait_clients(timeout=60)
    assert chaos.wait_ran([f"c{i}" for i in range(1000, 1050)], timeout=30)

    def send_newer(i: int) -> str:
        """Enqueue `c(i)` as a message of the next format, through enqueue.lua as any release does."""
        task_id = str(uuid.uuid4())
        fields = {"task": C, "v": MESSAGE_FORMAT + 1, "args": [i], "region": "eu", "enqueued_at": time.time()}
        arguments = [broker.clock_arg(), qk.wake_channel, broker.handoff_prefix(qk, [C]), broker.lease_ms]
        assert broker.run_script(
            "enqueue", qk.enqueue_keys, [*arguments, task_id, json.dumps(fields), 0, 0, 0, 0]
        ) == [0]
        return task_id

    # The worker is idle: the first goes straight to it if it listens for hand-offs.
    newer = [send_newer(5000)]
    chaos.call(calls("c", C, range(1050, 1150)), name="web-2", release="a")
    chaos.wait_started(51)
    newer.append(send_newer(5001))
    chaos.wait_clients(timeout=60)
    # Wait until each is parked or archived (the outcome the checks below refuse).
    wait_for(
        lambda: (
            parked(chaos, newer) + len(set(newer) & set(chaos.client.zrange(chaos.keys.archived, 0, -1)))
            == len(newer)
        ),
        timeout=30,
        message="the worker to deal with the newer messages",
    )
    ran = chaos.wait_ran([f"c{i}" for i in range(1050, 1150)], timeout=30)
    claims = chaos.claims(newer)
    claimed_again = wait_for(lambda: chaos.claims(newer) != claims, timeout=WATCH_SECONDS, fail=False)
    states = chaos.client.hmget(chaos.keys.state, newer)
    sizes = chaos.sizes() or {}
    report(
        f"chaos newer-message-format: tasks={len(chaos.acknowledged()) + len(newer)} newer={len(newer)} "
        f"parked={parked(chaos, newer)} "
        f"claims={chaos.claims(newer)} states={states} archived={sizes.get('archived', '?')} "
        f"ran_after={'all' if ran else 'not all'}"
    )
    errors = [chaos.task_facts(task_id).get("error") for task_id in newer]
    assert sizes.get("archived") == 0, f"archived: {errors}"
    assert waiting_counts(broker) == {(C, "format"): len(newer)}
    assert claims == [1, 1], f"each newer message is claimed once, not {claims}"
    assert not claimed_again, f"a newer message was claimed again: {chaos.claims(newer)}"
    assert states == ["pending", "pending"]
    assert parked(chaos, newer) == len(newer)
    assert ran, "the worker did not run the tasks sent with and after the newer messages"
