"""Fair partitions in the broker (docs/partitions.md): claims take partitions in turn, weighted
where asked, and a type's partition limits hold each partition to its own, on the standalone
Redis and the 3-master cluster."""

from __future__ import annotations

from collections import Counter

import pytest
from django.core.exceptions import ImproperlyConfigured

from django_rtq import task
from django_rtq.broker import Broker, TaskState, manual
from django_rtq.broker.limits import FlowLimits, Limit, PartitionLimits, partition_scope
from django_rtq.exceptions import InvalidTask
from django_rtq.registry import TaskType
from tests.support.factories import EMAILS, WORKER, done, enqueue, forget

SYNC = "crm.tasks.sync"
OTHER = "crm.tasks.other"


def add(broker: Broker, count: int = 1, partition: str | None = None, **fields) -> list[str]:
    fields.setdefault("task", SYNC)
    return enqueue(broker, EMAILS, count, partition=partition, **fields)


def claim(broker: Broker, limit: int = 10, **options) -> list[str]:
    return [task.id for task in broker.claim(EMAILS, worker_id=WORKER, limit=limit, **options)]


def partitions_of(task_ids: list[str], by_id: dict[str, str | None]) -> list[str | None]:
    return [by_id[task_id] for task_id in task_ids]


def use(broker: Broker, each: Limit | None = None, named: dict[str, Limit] | None = None) -> None:
    flow = FlowLimits(types={}, queues={}, partitions={SYNC: PartitionLimits(each=each, named=named or {})})
    broker.limits = lambda: flow


def test_a_partition_that_comes_after_a_big_one_is_served_in_turn(any_broker):
    big = add(any_broker, 200, "big")
    assert claim(any_broker, 10) == big[:10]
    small = add(any_broker, 5, "small")
    by_id = dict.fromkeys(big, "big") | dict.fromkeys(small, "small")

    taken = claim(any_broker, 10)

    # taken in turn, a task of each partition after the other, from the claims' place on
    assert Counter(partitions_of(taken, by_id)) == {"big": 5, "small": 5}
    assert set(small) <= set(taken)
    assert [t for t in taken if by_id[t] == "big"] == big[10:15]


def test_the_tasks_without_a_partition_are_one_more_lane(any_broker):
    big = add(any_broker, 100, "big")
    assert claim(any_broker, 4) == big[:4]
    plain = add(any_broker, 3, None, task=OTHER)
    late = add(any_broker, 3, "late")

    taken = claim(any_broker, 9)

    assert set(plain) | set(late) <= set(taken)
    assert len(set(taken) & set(big)) == 3


def test_a_backlog_without_a_partition_does_not_hold_back_a_partition(any_broker):
    plain = add(any_broker, 100, None)
    assert claim(any_broker, 4) == plain[:4]
    tenant = add(any_broker, 3, "acme")  # the clock starts at the head of pending: turns 6, 7, 8

    taken = claim(any_broker, 7)

    assert set(tenant) <= set(taken)
    assert [t for t in taken if t in plain] == plain[4:8]


def test_a_partition_starts_at_the_place_claims_reached_whatever_its_ids(any_broker):
    # Tasks at the same place in pending go by id: the partition's ids sort after the plain
    # tasks', so a first turn one place past the head of pending would leave its last task out.
    plain = [add(any_broker, 1, None, id=f"a-{n:03}")[0] for n in range(100)]
    assert claim(any_broker, 4) == plain[:4]
    tenant = [add(any_broker, 1, "acme", id=f"z-{n}")[0] for n in range(3)]

    # acme's turns are beside the plain lane's places 6, 7 and 8 (the clock starts at the head's
    # place, 5): a task of each lane per place, in the order of their ids within it
    taken = claim(any_broker, 7)

    assert set(tenant) <= set(taken)
    assert [t for t in taken if t in plain] == plain[4:8]


def test_a_partition_starts_at_the_place_claims_reached_behind_tasks_given_back(any_broker):
    # A worker that stops gives its claimed tasks back to the front of pending (place 0), as a
    # deploy that brings the first partitioned type does: the clock still starts where claims are.
    plain = add(any_broker, 100, None)
    assert claim(any_broker, 4) == plain[:4]
    assert any_broker.requeue(EMAILS, plain[:2], worker_id=WORKER) == 2
    tenant = add(any_broker, 3, "acme")

    taken = claim(any_broker, 8)

    assert set(taken) == set(plain[:2]) | set(tenant) | set(plain[4:7])


def test_a_weighted_partition_takes_that_many_turns_per_round(any_broker):
    light = add(any_broker, 40, "light")
    heavy = add(any_broker, 40, "heavy", partition_weight=3)
    by_id = dict.fromkeys(light, "light") | dict.fromkeys(heavy, "heavy")

    taken = claim(any_broker, 20)

    assert Counter(partitions_of(taken, by_id)) == {"heavy": 15, "light": 5}
    assert [t for t in taken if by_id[t] == "light"] == light[:5]  # each partition in its order


def test_priority_still_comes_first(any_broker):
    big = add(any_broker, 20, "big")
    urgent = add(any_broker, 2, "big", priority=10)
    assert claim(any_broker, 2) == urgent
    assert claim(any_broker, 1) == big[:1]


def test_the_lanes_the_claims_passed_are_forgotten(any_broker):
    qk = any_broker.queue(EMAILS)
    tasks = add(any_broker, 1, "a") + add(any_broker, 1, "b")
    assert any_broker.client.zcard(qk.lanes) == 2
    assert sorted(claim(any_broker, 10)) == sorted(tasks)
    assert any_broker.client.zcard(qk.lanes) == 0
    clock = int(any_broker.client.get(qk.vclock))
    assert int(any_broker.client.get(qk.seq)) >= clock  # the lane without a partition starts there too
    again = add(any_broker, 1, "a") + add(any_broker, 1, None)
    assert sorted(claim(any_broker, 10)) == sorted(again)


def test_a_delayed_task_and_a_retry_take_their_partition_turn_when_due(any_broker, clock):
    big = add(any_broker, 50, "big")
    assert claim(any_broker, 4) == big[:4]
    later = add(any_broker, 1, "later", process_at=clock.now + 10)
    clock.advance(11)
    assert any_broker.forward(EMAILS) == 1
    assert later[0] in claim(any_broker, 2)


def test_a_task_run_again_by_hand_takes_its_partition_turn(any_broker):
    again = add(any_broker, 1, "again")
    assert claim(any_broker, 1) == again
    any_broker.fail(EMAILS, again[0], to=TaskState.ARCHIVED, worker_id=WORKER, run="1", info={"error": "x"})
    big = add(any_broker, 50, "big")
    assert claim(any_broker, 2) == big[:2]

    assert manual.run_now(any_broker, EMAILS, again) == 1

    assert again[0] in claim(any_broker, 2)  # not behind the 48 left of "big"


def test_each_partition_is_held_to_its_concurrency_limit(any_broker):
    use(any_broker, each=Limit(max_concurrency=2))
    a = add(any_broker, 10, "a")
    b = add(any_broker, 10, "b")

    taken = claim(any_broker, 10)

    assert sorted(taken) == sorted(a[:2] + b[:2])
    assert claim(any_broker, 10) == []
    any_broker.complete(EMAILS, [done(a[0])], worker_id=WORKER)
    assert claim(any_broker, 10) == [a[2]]
    running = any_broker.client.hgetall(any_broker.queue(EMAILS).running)
    assert running == {partition_scope(SYNC, "a"): "2", partition_scope(SYNC, "b"): "2"}


def test_a_partition_named_has_limits_of_its_own(any_broker):
    use(any_broker, each=Limit(max_concurrency=1), named={"premium": Limit(max_concurrency=3)})
    premium = add(any_broker, 5, "premium")
    basic = add(any_broker, 5, "basic")

    taken = claim(any_broker, 10)

    assert sorted(taken) == sorted(premium[:3] + basic[:1])


def test_each_partition_has_a_rate_limit_of_its_own(any_broker, clock):
    use(any_broker, each=Limit(rate=1, period=1.0))
    a = add(any_broker, 3, "a")
    b = add(any_broker, 3, "b")
    first = any_broker.claim(EMAILS, worker_id=WORKER, limit=10)
    assert sorted(t.id for t in first) == sorted([a[0], b[0]])
    assert first.wait == pytest.approx(1.0, abs=0.01)
    assert claim(any_broker, 10) == []
    clock.advance(1)
    assert sorted(claim(any_broker, 10)) == sorted([a[1], b[1]])


def test_many_partitions_at_their_limit_are_each_released_in_a_few_claims(any_broker):
    use(any_broker, each=Limit(max_concurrency=1))
    names = [f"tenant-{n:03}" for n in range(250)]
    first = {name: add(any_broker, 2, name) for name in names}
    started = claim(any_broker, 250)
    assert sorted(started) == sorted(ids[0] for ids in first.values())
    assert claim(any_broker, 250) == []  # the seconds held back, 250 scopes in `held`
    assert any_broker.client.zcard(any_broker.queue(EMAILS).held) == 250
    any_broker.complete(EMAILS, [done(task_id) for task_id in started], worker_id=WORKER)

    # each claim looks at 100 held scopes at most, from one picked at random, and comes round
    taken = claim(any_broker, 250)
    assert 0 < len(taken) <= 100
    for _ in range(20):
        if len(taken) == 250:
            break
        taken += claim(any_broker, 250)
    assert sorted(taken) == sorted(ids[1] for ids in first.values())


def test_tasks_without_a_partition_are_not_held_by_partition_limits(any_broker):
    use(any_broker, each=Limit(max_concurrency=1))
    plain = add(any_broker, 5, None)
    assert sorted(claim(any_broker, 10)) == sorted(plain)


# The options: how a call's partition is found, and what is refused


@pytest.fixture
def define():
    """Register task types for one test (forgotten after it): define(name, func, **options)."""
    names = []

    def register(name, func, **options):
        names.append(name)
        return task(name=name, **options)(func)

    yield register
    for name in names:
        forget(name)


def sync_customer(customer_id, full=False):
    return customer_id


def test_partition_by_names_the_argument_whose_value_is_the_partition(define):
    sync = define("tests.partitions.sync", sync_customer, partition_by="customer_id")

    assert sync.prepare(42).partition == "42"
    assert sync.prepare(customer_id="acme").partition == "acme"
    assert sync.prepare(None).partition is None  # no partition: the lane of the others
    assert sync.using(partition="override").prepare(42).partition == "override"


def test_partition_by_may_be_a_function_of_the_arguments(define):
    sync = define(
        "tests.partitions.sync_by_function",
        sync_customer,
        partition_by=lambda customer_id, **_: f"tenant-{customer_id}",
    )
    message = sync.prepare(7, full=True)
    assert (message.partition, message.version()) == ("tenant-7", 4)
    assert (
        sync.prepare(7)
        .to_json()
        .startswith('{"task":"tests.partitions.sync_by_function","v":4,"partition":"tenant-7",')
    )


def test_a_named_partition_gets_its_weight_in_the_message(define):
    sync = define(
        "tests.partitions.weighted",
        sync_customer,
        partition_by="customer_id",
        partition_max_concurrency=2,
        partition_limits={"premium": {"max_concurrency": 6, "weight": 3}},
    )
    assert (sync.prepare("premium").partition_weight, sync.prepare("basic").partition_weight) == (3, 1)
    assert sync.partition_limits == PartitionLimits(
        each=Limit(max_concurrency=2), named={"premium": Limit(max_concurrency=6)}
    )


def test_a_message_without_a_partition_keeps_its_older_format(define):
    sync = define("tests.partitions.plain", sync_customer, partition_by="customer_id")
    assert sync.prepare(None).version() == 1


@pytest.mark.parametrize(
    "value", ["", "x" * 201, "tab\there", "new\nline", "\x02", True, 1.5, ["a"]], ids=repr
)
def test_a_partition_that_is_not_a_name_is_refused_at_enqueue(define, value):
    sync = define(
        f"tests.partitions.refused_{abs(hash(repr(value)))}", sync_customer, partition_by="customer_id"
    )
    with pytest.raises(InvalidTask, match="must be a partition name"):
        sync.prepare(value)


def test_partition_by_must_name_an_argument_of_the_handler():
    with pytest.raises(ImproperlyConfigured, match="names no argument of the handler"):
        task(name="tests.partitions.typo", partition_by="customer")(sync_customer)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"partition_max_concurrency": 0}, "max_concurrency must be a positive whole number"),
        ({"partition_rate_limit": "fast"}, "rate_limit must be a string like"),
        ({"partition_limits": {"acme": {"concurrency": 2}}}, "must be a dict of some of"),
        ({"partition_limits": {"acme": {"weight": 0}}}, "weight must be a whole number from 1 to 100"),
        ({"partition_limits": {"": {"weight": 2}}}, "must be a partition name"),
        ({"partition_limits": ["acme"]}, "must be a dict of partition -> limits"),
    ],
)
def test_wrong_partition_limits_are_refused_at_registration(options, match):
    with pytest.raises(ImproperlyConfigured, match=match):
        task(name="tests.partitions.wrong", partition_by="customer_id", **options)(sync_customer)


def test_a_call_cannot_change_the_partition_limits():
    task_type = TaskType(func=sync_customer, name="tests.partitions.unregistered")
    with pytest.raises(InvalidTask, match="Unknown option"):
        task_type.using(partition_max_concurrency=3)


def test_a_workflows_children_take_their_partitions_turns(broker, inspector):
    from django_rtq.workflows import group
    from tests.testapp.wf_tasks import mark

    children = [mark.s("big", n).using(partition="big") for n in range(6)]
    children += [mark.s("small", n).using(partition="small") for n in range(2)]
    workflow_id = group(children).enqueue()
    ids = [f"{workflow_id}.{n}" for n in range(8)]

    taken = [task.id for task in broker.claim("default", worker_id=WORKER, limit=4)]

    assert set(ids[6:]) <= set(taken)  # the two of "small" before the last four of "big"
    assert inspector.get_task(ids[6]).message.partition == "small"


def test_check_warns_of_partition_limits_without_a_way_to_name_partitions(define):
    from django.core import checks

    define("tests.partitions.unnamed", sync_customer, partition_max_concurrency=2)
    define("tests.partitions.named", sync_customer, partition_by="customer_id", partition_max_concurrency=2)

    warned = [m.obj for m in checks.run_checks(tags=["django_rtq"]) if m.id == "django_rtq.W015"]

    assert warned == ["tests.partitions.unnamed"]


def test_weights_alone_put_no_limit_on_the_claims(define):
    from django_rtq.flow_control import project_limits

    sync = define(
        "tests.partitions.weights_only",
        sync_customer,
        partition_by="customer_id",
        partition_limits={"gold": {"weight": 4}},
    )

    assert sync.partition_limits is None
    assert sync.prepare("gold").partition_weight == 4
    assert "tests.partitions.weights_only" not in project_limits().partitions


def test_the_claims_drop_the_full_buckets_of_partitions_gone_quiet(any_broker, clock):
    use(any_broker, each=Limit(rate=1, period=1.0))
    buckets = any_broker.queue(EMAILS).buckets
    started = [add(any_broker, 1, f"tenant-{n}")[0] for n in range(30)]
    assert sorted(claim(any_broker, 30)) == sorted(started)
    assert any_broker.client.hlen(buckets) == 30  # each partition took its token
    waiting = add(any_broker, 1, "tenant-0")  # its bucket is empty: it must wait its second
    assert claim(any_broker, 10) == []

    clock.advance(2)  # every bucket full again: the same as none
    claims = 0
    while any_broker.client.hlen(buckets) > 1 and claims < 60:
        claim(any_broker, 10)
        claims += 1

    assert any_broker.client.hlen(buckets) <= 1, claims  # at most tenant-0's, spent again
    assert waiting[0] in any_broker.client.zrange(any_broker.queue(EMAILS).active, 0, -1)


def test_partition_limits_run_on_fakeredis_too():
    """The testing helpers run the scripts on fakeredis, which answers HRANDFIELD and
    ZRANDMEMBER of a missing key with nil (Redis: an empty list)."""
    import fakeredis

    broker = Broker(fakeredis.FakeRedis(decode_responses=True), prefix="rtqfake")
    use(broker, each=Limit(rate=1, period=1.0, max_concurrency=1))
    tasks = {name: add(broker, 2, name) for name in ("a", "b")}

    assert sorted(claim(broker, 10)) == sorted([tasks["a"][0], tasks["b"][0]])
    assert claim(broker, 10) == []  # each partition at its limit: its second held
