"""The Lua scripts as the Broker, the manual actions and bulk jobs call them: the KEYS and ARGV
each script's header declares, and every call within one cluster slot."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import pytest
from redis.crc import key_slot
from redis.exceptions import ClusterCrossSlotError, RedisClusterException

from django_rtq.broker import Broker, TaskState, bulk, forgetting, manual, snoozing, workflow
from django_rtq.broker.checkpoint import save_checkpoint
from django_rtq.broker.keys import Keyspace
from django_rtq.broker.scripts import LuaScript, key_pattern, load_scripts
from django_rtq.broker.states import Action
from django_rtq.broker.waiting import UNKNOWN_TYPE, kind_of
from tests.support.clock import FakeClock
from tests.support.cluster import Cluster
from tests.support.factories import (
    BILLING,
    EMAILS,
    QUEUES,
    SEARCH,
    WORKER,
    claim_ids,
    done,
    fail,
    make_tasks,
    message,
)
from tests.support.reading import ids_in
from tests.support.sent_commands import record_commands

SCRIPTS = load_scripts()
#: "-- ARGV[4..] -> five per task: ..." gives the size of each task's group of arguments.
_PER_TASK = re.compile(r"^-- ARGV\[\d+\.\.\] -> (?:the n allowed states, then )?(\w+) per task", re.MULTILINE)
#: "-- ARGV[5] -> n, the number of allowed states": the scripts of manual actions take the states
#: they may move tasks from (ACTION_STATES), their sorted sets first among the variadic KEYS.
_STATE_COUNT = re.compile(r"^-- ARGV\[(\d+)\] -> n, the number of allowed states", re.MULTILINE)
_NUMBERS = {"two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7}


@dataclass(frozen=True)
class Call:
    script: LuaScript
    keys: tuple[str, ...]
    args: tuple[Any, ...]


def record_script_calls(broker: Broker, monkeypatch: pytest.MonkeyPatch) -> list[Call]:
    """Record every EVALSHA of our scripts the broker's client sends, directly or in a pipeline
    (not those of redis-py's own locks, which bulk jobs use)."""
    by_sha = {script.sha: script for script in SCRIPTS.values()}
    calls: list[Call] = []

    def record(command):
        if str(command[0]).upper() == "EVALSHA" and command[1] in by_sha:
            sha, numkeys, *rest = command[1:]
            calls.append(Call(by_sha[sha], tuple(rest[:numkeys]), tuple(rest[numkeys:])))

    def recording(execute_command):
        def wrapper(*command, **options):
            record(command)
            return execute_command(*command, **options)

        return wrapper

    client = broker.client
    make_pipeline = client.pipeline

    def pipeline(*args, **kwargs):
        pipe = make_pipeline(*args, **kwargs)
        pipe.execute_command = recording(pipe.execute_command)
        return pipe

    record_commands(broker, monkeypatch, record)
    monkeypatch.setattr(client, "pipeline", pipeline)
    return calls


def exercise_every_operation(broker: Broker, clock: FakeClock) -> None:
    """Call each Broker operation, manual action and bulk job that runs a script, with and without
    uniqueness locks, on several queues."""
    broker.mirror = True
    broker.enqueue(
        [message(queue, unique_key=f"{queue}-lock", unique_ttl=60) for queue in QUEUES]
        + [message(EMAILS) for _ in range(4)]
        + [message(BILLING, process_at=clock.now + 10) for _ in range(2)]
    )

    locked, *plain = claim_ids(broker, EMAILS)
    broker.extend_leases(EMAILS, [(task_id, True) for task_id in plain], worker_id=WORKER)
    save_checkpoint(broker, EMAILS, plain[1], worker_id=WORKER, run="1", value_json="41")
    broker.complete(
        EMAILS, [done(locked, unique_key="emails-lock"), done(plain[0], retention=5)], worker_id=WORKER
    )
    fail(broker, EMAILS, plain[1], TaskState.RETRY, retry_at_ms=clock.ms(5))
    fail(broker, EMAILS, plain[2], TaskState.ARCHIVED)
    broker.requeue(EMAILS, plain[3:], worker_id=WORKER)
    kind = kind_of("tests.nowhere", UNKNOWN_TYPE)
    left = broker.claim(EMAILS, worker_id=WORKER, limit=10)
    broker.park(EMAILS, worker_id=WORKER, entries=[(task.id, task.run, kind, "unknown") for task in left])
    broker.forget_parked(EMAILS)

    records = broker.take_finished(EMAILS, worker_id=WORKER, lock_ms=1000, limit=10)
    broker.ack_finished(EMAILS, records, worker_id=WORKER, release=True)

    [searching] = claim_ids(broker, SEARCH, limit=1)
    fail(broker, SEARCH, searching, TaskState.ARCHIVED, unique_key="search-lock")
    claim_ids(broker, BILLING, limit=1, lease=1)  # its worker dies: the lock of a poison pill
    clock.advance(10)
    broker.recover(BILLING, grace_ms=0, max_recoveries=0)
    claim_ids(broker, EMAILS, limit=10, lease=1)
    clock.advance(10)
    broker.recover(EMAILS, grace_ms=0, max_recoveries=5)
    broker.forward(EMAILS)
    broker.forward(BILLING)

    manual.run_now(broker, SEARCH, [searching])
    manual.archive(broker, BILLING, ids_in(broker, BILLING, TaskState.PENDING))
    manual.delete(broker, SEARCH, [searching])
    for action, state in [
        (Action.RUN, TaskState.ARCHIVED),
        (Action.ARCHIVE, TaskState.PENDING),
        (Action.DELETE, TaskState.ARCHIVED),
    ]:
        job = bulk.start(broker, BILLING, action, [state])
        assert bulk.carry_on(broker, BILLING, job.id, budget=10).finished
    make_tasks(broker, TaskState.COMPLETED, SEARCH)
    # the outbox: tasks of two queues, one with a lock, and one sent before
    outboxed = [message(EMAILS, unique_key="outbox-lock", unique_ttl=60), message(BILLING)]
    broker.send_outboxed(outboxed)
    broker.send_outboxed([outboxed[0], message(BILLING)])
    exercise_workflows(broker, clock)
    forgetting.forget_now(broker, SEARCH)  # in use
    forgetting.forget_now(broker, "forgettable")  # unused: forgotten
    forgetting.look_again(broker)
    broker.enqueue([message(SEARCH, id="napping")])
    [napping] = broker.claim(SEARCH, worker_id=WORKER, limit=1)
    snoozing.snooze(
        broker, SEARCH, napping.id, worker_id=WORKER, run=napping.run, delay_ms=1000, info={}, hold_task="t"
    )


def exercise_workflows(broker: Broker, clock: FakeClock) -> None:
    """Create two workflows with a task beside them, settle one's child, cancel the other,
    and take and remove the commands that wrote."""
    fields = {"kind": "group", "n": 2, "done": 0, "queue": BILLING, "on_error": "fail"}
    fields |= {"created": clock.ms(), "retention": 0, "queue:0": EMAILS, "queue:1": SEARCH}
    workflow.activate(
        broker,
        BILLING,
        cmd_id="activate:test",
        tasks=[["wf-task", message(BILLING, id="wf-task").to_json(), 0, 0]],
        workflows=[
            {"id": name, "msg": message(BILLING, id=name).to_json(), "fields": fields, "commands": []}
            for name in ("wf-1", "wf-2")
        ],
    )
    workflow.child_outcome(broker, BILLING, "wf-1", cmd_id="child:a", position=0, ok=True, payload_json="1")
    workflow.cancel_workflow(broker, BILLING, "wf-2", error_type="Cancelled", message="cancelled")
    workflow.start_postponed(broker, BILLING, "wf-2", cmd_id="start:wf-2")  # cancelled: not started
    workflow.commands_done(broker, BILLING, workflow.take_commands(broker, BILLING))
    clock.advance(3600)
    broker.trim(EMAILS, archive_max_age_ms=1000, archive_max_size=10)
    broker.trim(SEARCH, archive_max_age_ms=1000, archive_max_size=10)
    for tick_ms in (0, 1000):  # the first call arms the schedule, the second enqueues
        periodic = message(BILLING, id=f"periodic:nightly:{tick_ms}", unique_key="nightly-lock")
        broker.enqueue_periodic(periodic, schedule="nightly", tick_ms=tick_ms)


@pytest.fixture
def recorded(any_broker: Broker, clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> list[Call]:
    calls = record_script_calls(any_broker, monkeypatch)
    exercise_every_operation(any_broker, clock)
    return calls


def per_task(script: LuaScript) -> int:
    """How many arguments each task adds past the fixed ones (1 unless the header says)."""
    found = _PER_TASK.search(script.source)
    return _NUMBERS[found.group(1)] if found else 1


def allowed_states(script: LuaScript, call: Call) -> list[str]:
    """The states a call of a manual action's script allows (none for other scripts)."""
    found = _STATE_COUNT.search(script.source)
    if not found:
        return []
    at = int(found.group(1))  # ARGV[at] is n; the n states follow it
    return list(call.args[at : at + int(call.args[at - 1])])


def check_count(what: str, passed: int, fixed: int, variadic: bool, group: int = 1) -> None:
    if variadic:
        assert passed >= fixed, f"{what}: {passed} passed, at least {fixed} declared"
        assert (passed - fixed) % group == 0, f"{what}: {passed - fixed} extra, not in groups of {group}"
    else:
        assert passed == fixed, f"{what}: {passed} passed, {fixed} declared"


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_every_call_passes_the_keys_and_arguments_its_header_declares(recorded: list[Call], name: str):
    script = SCRIPTS[name]
    calls = [call for call in recorded if call.script is script]
    assert calls, f"no operation ran {name}"
    for call in calls:
        check_count(f"{name} KEYS", len(call.keys), script.fixed_keys, script.variadic_keys)
        states = allowed_states(script, call)
        passed = len(call.args) - len(states)
        check_count(f"{name} ARGV", passed, script.fixed_args, script.variadic_args, per_task(script))


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_every_call_passes_each_key_its_header_names_at_that_position(recorded: list[Call], name: str):
    """KEYS checked by name: each key a call passes is the key its header's line names at that
    position ("KEYS[4] -> rtq:{<queue>}:pending"), all of one queue; the variadic keys past the
    allowed states' sorted sets are those the KEYS[n..] line names."""
    script = SCRIPTS[name]
    fixed = [key_pattern(text) for text in script.keys]
    more = key_pattern(script.more_keys) if "rtq:" in script.more_keys else None
    calls = [call for call in recorded if call.script is script]
    assert calls, f"no operation ran {name}"
    for call in calls:
        queues = set()
        for position, (key, pattern) in enumerate(zip(call.keys, fixed, strict=False), start=1):
            found = pattern.fullmatch(key)
            assert found, f"{name} KEYS[{position}] is {key!r}, not {script.keys[position - 1]!r}"
            queues.add(found["queue"])
        rest = call.keys[script.fixed_keys + len(allowed_states(script, call)) :]
        for position, key in enumerate(rest, start=len(call.keys) - len(rest) + 1):
            found = more and more.fullmatch(key)
            assert found, f"{name} KEYS[{position}] is {key!r}, not one of {script.more_keys!r}"
            queues.add(found["queue"])
        assert len(queues) == 1, f"{name} passes keys of queues {queues}"


def test_a_key_matches_the_name_of_its_own_header_line_only():
    qk = Keyspace("rtq-test").queue("emails")
    extend = SCRIPTS["extend_leases"]
    passed = [qk.active, qk.owner, qk.unstarted, qk.runs, qk.began]
    assert all(key_pattern(name).fullmatch(key) for name, key in zip(extend.keys, passed, strict=True))
    assert not key_pattern(extend.keys[0]).fullmatch(qk.owner)  # KEYS[1] is active
    assert (
        key_pattern("rtq:{<queue>}:processed:<day>").fullmatch(qk.processed("2026-11-25"))["queue"]
        == "emails"
    )
    forward = key_pattern(SCRIPTS["forward"].keys[0])  # "rtq:{<queue>}:scheduled or rtq:{<queue>}:retry"
    assert (
        forward.fullmatch(qk.scheduled) and forward.fullmatch(qk.retry) and not forward.fullmatch(qk.pending)
    )


@pytest.mark.parametrize("name", ["run_now", "archive", "delete"])
def test_a_manual_action_passes_its_allowed_states_and_their_sorted_sets(recorded: list[Call], name: str):
    script = SCRIPTS[name]
    calls = [call for call in recorded if call.script is script]
    assert calls, f"no operation ran {name}"
    for call in calls:
        states = allowed_states(script, call)
        assert states and set(states) <= set(TaskState), f"{name}: {states}"
        sets = call.keys[script.fixed_keys : script.fixed_keys + len(states)]
        assert [key.rsplit(":", 1)[1] for key in sets] == states, f"{name}: {sets} for {states}"


def test_every_call_touches_one_cluster_slot(recorded: list[Call]):
    assert recorded
    for call in recorded:
        slots = {key_slot(key.encode()) for key in call.keys}
        assert len(slots) == 1, f"{call.script.name} touches slots {slots}: {call.keys}"


def test_some_calls_carry_uniqueness_locks(recorded: list[Call]):
    """The scenario above does reach the scripts' variadic lock keys."""
    with_locks = {call.script.name for call in recorded if any(":unique:" in key for key in call.keys)}
    assert with_locks == {
        "enqueue",
        "enqueue_periodic",
        "send_outboxed",
        "complete",
        "fail",
        "recover",
        "archive",
        "delete",
    }


def test_a_script_over_two_queues_fails_with_crossslot(redis_cluster: Cluster, cluster_broker: Broker):
    emails, search = cluster_broker.queue(EMAILS), cluster_broker.queue(SEARCH)
    keys = [emails.active, emails.owner, emails.state, emails.priority, search.pending, search.seq]
    args = [WORKER, search.wake_channel, "task-1"]
    source = SCRIPTS["requeue"].source

    for port in redis_cluster.ports:
        with redis_cluster.node_client(port) as node, pytest.raises(ClusterCrossSlotError):
            node.eval(source, len(keys), *keys, *args)
    with pytest.raises(RedisClusterException, match="same key slot"):
        cluster_broker.run_script("requeue", keys, args)


def test_one_task_enqueued_alone_passes_what_the_header_declares_in_one_slot(
    any_broker: Broker, monkeypatch: pytest.MonkeyPatch
):
    calls = record_script_calls(any_broker, monkeypatch)
    any_broker.enqueue([message(EMAILS)])
    any_broker.enqueue([message(EMAILS, unique_key="alone", unique_ttl=60)])

    script = SCRIPTS["enqueue"]
    assert [call.script for call in calls] == [script, script]
    for call in calls:
        check_count("enqueue KEYS", len(call.keys), script.fixed_keys, script.variadic_keys)
        check_count("enqueue ARGV", len(call.args), script.fixed_args, script.variadic_args, per_task(script))
        assert len({key_slot(key.encode()) for key in call.keys}) == 1
    assert calls[1].keys[-1] == any_broker.queue(EMAILS).unique("alone")


def code_of(lua: str) -> str:
    """Lua source without its comments: what is run."""
    return re.sub(r"--[^\n]*", "", lua)


def test_each_script_carries_the_helpers_its_code_uses_and_no_others():
    from django_rtq.broker.scripts import LUA_DIR, _helpers

    helpers = dict(_helpers((LUA_DIR / "_lib.lua").read_text()))
    scripts = load_scripts()
    for name, script in scripts.items():
        body = (LUA_DIR / f"{name}.lua").read_text()
        defined = {helper for helper in helpers if helper and helpers[helper] in script.source}
        used = set()
        for helper in defined | {""}:
            text = code_of(body if helper == "" else helpers[helper])
            for other in helpers:
                if other and re.search(rf"\b{other}\b", text):
                    assert other in defined, f"{name}.lua uses {other} but lacks it"
                    used.add(other)
        assert defined <= used, f"{name}.lua defines {sorted(defined - used)}, which its code never uses"
    assert "local function archive_task" not in scripts["claim"].source
    assert "local function take_for_settling" in scripts["fail"].source
    assert "local function hand_off" in scripts["enqueue"].source
    # named in comments of helpers complete.lua uses, never called by them
    assert "local function archive_task" not in scripts["complete"].source
    assert "local function drop_task" not in scripts["enqueue"].source


def test_no_script_has_a_long_comment_or_a_dash_pair_in_a_string():
    """What lets the loader find the code by cutting every line at its "--"."""
    from django_rtq.broker.scripts import LUA_DIR

    for path in LUA_DIR.glob("*.lua"):
        lua = path.read_text()
        assert "--[[" not in lua and "--[=" not in lua, path.name
        for line in lua.splitlines():
            assert not dash_pair_in_a_string(line), f"{path.name}: {line!r}"


def dash_pair_in_a_string(line: str) -> bool:
    """Whether a line of Lua has "--" inside a quoted string before its comment starts."""
    quote, i = None, 0
    while i < len(line):
        char = line[i]
        if quote is None:
            if line.startswith("--", i):
                return False  # the comment: the rest of the line
            if char in "'\"":
                quote = char
        elif char == "\\":
            i += 1  # an escaped character
        elif char == quote:
            quote = None
        elif line.startswith("--", i):
            return True
        i += 1
    return False


def test_a_dash_pair_is_found_in_a_string_only():
    assert dash_pair_in_a_string("local x = 'a--b'")
    assert dash_pair_in_a_string('return "\\"--" .. x')
    assert not dash_pair_in_a_string("local x = 'a' -- it's a 'comment' with -- in it")
    assert not dash_pair_in_a_string('return "\'" .. text -- note')


def test_a_script_declares_its_flags_to_redis_on_its_first_line_before_the_helpers():
    leases = SCRIPTS["extend_leases"]
    assert leases.flags == ("allow-oom",)  # renewals run on a full Redis
    assert leases.source.startswith("#!lua flags=allow-oom\n-- Helpers shared by the scripts")
    assert "local function clock_now" in leases.source
    for script in SCRIPTS.values():
        assert "#!lua" not in script.source[1:]
        assert script.source.startswith("#!lua") == bool(script.flags)
