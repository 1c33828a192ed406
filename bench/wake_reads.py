"""How soon an idle listener has a message, by the way it reads: a script, not a test.

Run from the repository root, against a Redis of its own:

    .venv-test/django6/bin/python bench/wake_reads.py [--messages 1000] [--gap 0.002]
                                                      [--redis-url redis://127.0.0.1:6391/0]

One process sends a message every `--gap` seconds to each of four listeners in processes of
their own, taking turns, and each listener notes when it has the message parsed. The message
carries the time it was sent (the monotonic clock the machine's processes share); the figure is
the median of the differences, with the 10th and 90th percentiles. The sends are alike (a
`PUBLISH`; for huey's way an `LPUSH`), so the differences between the lines are the reads':

- redis-py's `PubSub.get_message(timeout)`;
- `can_read(timeout)` then `read_response()` on the subscribed connection (django-rtq's
  subscriber until issue 29's fifth session): a poll, a look whether the socket was closed, the
  socket's timeout set back, then the read;
- django-rtq's `Subscriber.listen(timeout)` (django_rtq/worker/subscriber.py): one read that
  blocks until the message comes or the timeout passes;
- huey's way: `BRPOP` on a list, the message sent by `LPUSH`;
- `Subscriber.listen` again, its message published after a `PING` in the same pipeline.

Redis writes its replies once it has run what it read, the client it had a reply for last
written first. A `PUBLISH` (or a script that publishes, as the enqueue that hands a task to an
idle worker does) is answered after the listener was given the message, so the sender is
written first, then the listener; a `BRPOP` is served after the `LPUSH` that it waited for is
answered, so the listener is written first. The last line turns the order around for a publish:
the `PING`'s reply makes the sender a client with a reply before the message. The sender's own
round trip is printed beside each line: what is gained on the one side is paid on the other.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import sys
import time
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PAYLOAD = "x" * 300  # about a small task's message
READS = (
    "get_message",
    "can_read + read_response",
    "Subscriber.listen",
    "BRPOP (huey)",
    "Subscriber.listen, PING first",
)
WAIT = 0.25  # the subscriber's own wait (POLL_SECONDS)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1000, help="messages to each listener")
    parser.add_argument("--gap", type=float, default=0.002, help="seconds between messages")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6391/0")
    return parser.parse_args()


def sent_at(data: str) -> int:
    return int(data.partition("|")[0])


def listen(read: str, url: str, key: str, count: int, ready, results) -> None:
    """In a process of its own: read `count` messages the `read` way; put the delays (ns)."""
    client = redis.Redis.from_url(url, decode_responses=True)
    delays: list[int] = []
    if read == "BRPOP (huey)":
        ready.set()
        while len(delays) < count:
            popped = client.brpop([key], timeout=WAIT)
            if popped:
                delays.append(time.monotonic_ns() - sent_at(popped[1]))
    elif read.startswith("Subscriber.listen"):
        from django_rtq.broker import Broker
        from django_rtq.worker.subscriber import Subscriber

        def arrived(channel: str, data: str) -> None:
            delays.append(time.monotonic_ns() - sent_at(data))

        subscriber = Subscriber(broker=Broker(client), channels=[key], on_message=arrived, name="bench")
        subscriber.listen(0)
        ready.set()
        while len(delays) < count:
            subscriber.listen(WAIT)
    else:
        pubsub = client.pubsub(ignore_subscribe_messages=True)
        pubsub.subscribe(key)
        pubsub.get_message(timeout=1)
        connection = pubsub.connection
        ready.set()
        while len(delays) < count:
            if read == "get_message":
                message = pubsub.get_message(timeout=WAIT)
                data = message["data"] if message else None
            elif connection.can_read(timeout=WAIT):
                reply = connection.read_response(disconnect_on_error=False, push_request=True)
                data = reply[2] if isinstance(reply, list) and reply[0] == "message" else None
            else:
                data = None
            if data is not None:
                delays.append(time.monotonic_ns() - sent_at(data))
    results.put((read, delays))


def main() -> int:
    args = parse_args()
    client = redis.Redis.from_url(args.redis_url)
    keys = {read: f"bench:wake-reads:{i}" for i, read in enumerate(READS)}
    client.delete(*keys.values())
    results = multiprocessing.Queue()
    listeners = []
    for read, key in keys.items():
        ready = multiprocessing.Event()
        process = multiprocessing.Process(
            target=listen, args=(read, args.redis_url, key, args.messages, ready, results)
        )
        process.start()
        if not ready.wait(30):
            raise SystemExit(f"the {read} listener did not start")
        listeners.append(process)
    channels = [key for read, key in keys.items() if read != "BRPOP (huey)"]
    while any(n < 1 for _, n in client.pubsub_numsub(*channels)):
        time.sleep(0.01)
    round_trips: dict[str, list[int]] = {read: [] for read in READS}
    for _ in range(args.messages):
        for read, key in keys.items():
            time.sleep(args.gap)
            sent = time.monotonic_ns()
            data = f"{sent}|{PAYLOAD}"
            if read == "BRPOP (huey)":
                client.lpush(key, data)
            elif read.endswith("PING first"):
                pipe = client.pipeline(transaction=False)
                pipe.ping()
                pipe.publish(key, data)
                pipe.execute()
            else:
                client.publish(key, data)
            round_trips[read].append(time.monotonic_ns() - sent)
    delays = dict(results.get(timeout=60) for _ in listeners)
    for process in listeners:
        process.join()
    client.delete(*keys.values())
    print(
        f"bench: from the send to the message parsed, at an idle listener, {args.messages} messages "
        f"{args.gap * 1000:g} ms apart, the listeners taking turns; median (10th-90th percentile), µs; "
        "the sender's round trip, median"
    )
    for read in READS:
        got = sorted(delays[read])
        tenth, ninetieth = got[len(got) // 10], got[len(got) * 9 // 10]
        print(
            f"{read:30s} {statistics.median(got) / 1000:6.0f} ({tenth / 1000:.0f}-{ninetieth / 1000:.0f})"
            f"   sender {statistics.median(round_trips[read]) / 1000:.0f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
