"""One engine (issue 47): a message's guarantees are the same whether or not it shares a transaction.

Each test runs one scenario on DynamoDB Local behind the conflict emulation, through a consumer wired as the function
is, once with ``GROUP_COMMIT=false`` (each message alone) and once grouped, and holds both to what the message gets
alone. Each outcome is built, not raced for: the test's clock moves only when a handler moves it, and a handler that
waits for another message waits (bounded) for a state the message reaches alone, so the test ends either way.

1. A lock message is committed when its own handler ends, not after a slow neighbour's: its resend after its lease
   finds it done, and the downstream is called once.
2. A lock message's lease starts when its handler can start: each handler, waiting for the one thread or not, has
   its whole lease.
3. A failed lock message's claim and its guard's reservation are released when its handler fails.
4. A record this version cannot read fails only its own message ("unexpected error", retried); the messages beside
   it are applied, and no claim of theirs is left standing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import boto3
import pytest

from consumer.app import wire
from consumer.batch import BatchRunner
from consumer.errors import TransientError
from consumer.handler import MessageContext
from consumer.idempotency import IdempotencyStore
from consumer.idempotency.record import Attr
from consumer.outcome import Outcome
from testkit.lambda_sqs import sqs_record
from testkit.servers import LocalServers
from testkit.webhook import WebhookSink
from tests.core.handlers import (
    CALL_TABLE,
    HOLD_EVENT,
    HoldHandler,
    call_body,
    handlers_for_tests,
    hold_body,
    hold_key,
    recorded_call,
    tally_body,
)
from tests.kit import Clock, Remaining
from tests.utils import settings_on_local_servers

# Below the invocation's 30 s less LEASE_MARGIN_MS, so every claim's lease is exactly this.
LEASE_MS = 10_000
# How long a handler waits for a state its neighbour reaches alone: far more than it takes, and the test still ends.
WAIT_S = 5.0
LOG = logging.getLogger("tests.one_engine")


def within(reached: Callable[[], bool], seconds: float = WAIT_S) -> bool:
    """Whether ``reached`` holds within ``seconds`` (polled)."""
    deadline = time.monotonic() + seconds
    while not reached():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


class Engine:
    """The function's consumer on the local servers, grouping on or off, on the test's clock; its hold handler runs
    ``during`` inside ``handle``."""

    def __init__(
        self, servers: LocalServers, webhook: WebhookSink, clock: Clock, group_commit: bool, max_workers: int
    ) -> None:
        self.settings = settings_on_local_servers(
            servers, max_workers=max_workers, group_commit=group_commit, lease_max_ms=LEASE_MS
        )
        self.session = boto3.session.Session()
        self.dynamodb = self.session.client("dynamodb")
        self.store = IdempotencyStore(self.dynamodb, self.settings.idempotency_table_name, ttl_seconds=3600)
        self.webhook, self.clock = webhook, clock
        self.during: Callable[[MessageContext], None] = lambda _: None
        self.holds = HoldHandler(self.settings, self._during)
        self.consumer = self.wire()

    def _during(self, context: MessageContext) -> None:
        # Read at each call: a test sets ``during`` after wiring, as it needs the engine.
        self.during(context)

    def wire(self) -> BatchRunner:
        """A consumer of this deployment: the test's, or another one (a second Lambda environment)."""
        handlers = {**handlers_for_tests(self.settings, self.webhook.url), HOLD_EVENT: self.holds}
        return wire(self.settings, self.session, self.clock, handlers=handlers, logger=LOG)

    def process(self, batch: list[dict[str, Any]], consumer: BatchRunner | None = None) -> dict[str, Outcome]:
        results = (consumer or self.consumer).process(batch, Remaining()).results
        return {result.message_id: result.outcome for result in results}

    def status(self, record_id: str) -> str:
        record = self.store.get(record_id)
        return "absent" if record is None else record.status.value

    def hold(self, hold_id: str) -> dict[str, Any] | None:
        return recorded_call(self.dynamodb, self.settings.table_names[CALL_TABLE], hold_key(hold_id)["callId"])


@pytest.fixture(params=[False, True], ids=["alone", "grouped"])
def group_commit(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


@pytest.fixture
def make(local_aws: LocalServers, webhook: WebhookSink, clock: Clock, group_commit: bool) -> Callable[[int], Engine]:
    return lambda max_workers: Engine(local_aws, webhook, clock, group_commit, max_workers)


def test_a_quick_lock_message_is_committed_when_its_own_handler_ends(
    make: Callable[[int], Engine], webhook: WebhookSink, clock: Clock
) -> None:
    engine = make(2)
    second = engine.wire()
    resent: dict[str, Outcome] = {}

    def slow(context: MessageContext) -> None:
        # Alone, the quick message is committed while this handler still runs.
        within(lambda: engine.status("CallRequested#quick") == "COMPLETED")
        # Then its lease ends, and its producer's resend reaches another consumer.
        clock.advance(LEASE_MS / 1000 + 1)
        resent.update(engine.process([sqs_record("resend", call_body("c-quick", key="quick"))], second))

    engine.during = slow
    outcomes = engine.process(
        [sqs_record("quick", call_body("c-quick", key="quick")), sqs_record("slow", hold_body("slow"))]
    )
    calls = webhook.keys().count("quick")
    assert calls == 1, "the resend called the downstream again"
    assert resent == {"resend": Outcome.DUPLICATE}
    assert outcomes["quick"] is Outcome.APPLIED


def test_a_lock_messages_lease_starts_when_its_handler_can_start(make: Callable[[int], Engine], clock: Clock) -> None:
    # One thread: the messages' handlers run one after another, each spending part of its lease.
    engine = make(1)
    engine.during = lambda _: clock.advance(LEASE_MS / 1000 * 0.4)
    batch = [sqs_record(f"m-{n}", hold_body(f"h-{n}")) for n in range(1, 4)]
    outcomes = engine.process(batch)
    at_start = [ms for which, ms in engine.holds.seen if which == "handle"]
    assert at_start == pytest.approx([LEASE_MS] * 3, abs=50), "a handler started with part of its lease spent"
    assert outcomes == dict.fromkeys(["m-1", "m-2", "m-3"], Outcome.APPLIED)


def test_a_failed_lock_message_is_released_when_its_own_handler_fails(make: Callable[[int], Engine]) -> None:
    engine = make(2)
    failed = threading.Event()
    released: list[bool] = []

    def during(context: MessageContext) -> None:
        if context.idempotency_key == "hold-fail":
            failed.set()
            raise TransientError("the downstream is unavailable")
        # Its handler ran, so it was claimed: from then on, its record and its hold gone means released.
        released.append(
            failed.wait(WAIT_S)
            and within(lambda: engine.status("HoldRequested#hold-fail") == "absent" and engine.hold("fail") is None)
        )

    engine.during = during
    outcomes = engine.process([sqs_record("fail", hold_body("fail")), sqs_record("slow", hold_body("slow"))])
    assert released == [True], "the failed message's claim and hold stood while its neighbour's handler ran"
    assert outcomes == {"fail": Outcome.RETRIED, "slow": Outcome.APPLIED}


# A tally's part of a transaction is three items and a hold's two: this many healthy messages fill a transaction of
# 100 items, so a grouped odd message shares a second one, after the first has landed.
HEALTHY = {"optimistic": 34, "lock": 51}


@pytest.mark.parametrize("mode", ["optimistic", "lock"])
def test_a_record_of_an_unknown_status_fails_only_its_own_message(
    make: Callable[[int], Engine], clock: Clock, caplog: pytest.LogCaptureFixture, mode: str
) -> None:
    engine = make(4)
    if mode == "optimistic":
        healthy = {
            f"TallyAdded#k-{n}": tally_body(f"e-{n}", tally_id=f"t-{n}", key=f"k-{n}") for n in range(HEALTHY[mode])
        }
        odd_id, odd = "TallyAdded#odd", tally_body("e-odd", tally_id="t-odd", key="odd")
    else:
        healthy = {f"HoldRequested#hold-h-{n}": hold_body(f"h-{n}") for n in range(HEALTHY[mode])}
        odd_id, odd = "HoldRequested#odd", hold_body("h-odd", key="odd")
    # Written by hand, or by a newer version during a rolling deploy: a status this version does not know.
    engine.dynamodb.put_item(
        TableName=engine.settings.idempotency_table_name,
        Item={
            Attr.ID: {"S": odd_id},
            Attr.STATUS: {"S": "ARCHIVED"},
            Attr.EXPIRES_AT: {"N": str(int(clock()) + 3600)},
            Attr.OWNER_TOKEN: {"S": "a-newer-version"},
            Attr.PAYLOAD_HASH: {"S": "another"},
        },
    )
    batch = [sqs_record(record_id, body) for record_id, body in healthy.items()] + [sqs_record("odd", odd)]
    with caplog.at_level(logging.ERROR, logger=LOG.name):
        outcomes = engine.process(batch)
    logged = [
        r for r in caplog.records if r.getMessage() == "unexpected error" and getattr(r, "message_id", "") == "odd"
    ]
    seen = {
        "odd": outcomes.pop("odd"),
        "odd logged": len(logged),
        "others": Counter(outcomes.values()),
        "their records": Counter(engine.status(record_id) for record_id in healthy),
    }
    assert seen == {
        "odd": Outcome.RETRIED,
        "odd logged": 1,
        "others": Counter({Outcome.APPLIED: len(healthy)}),
        "their records": Counter({"COMPLETED": len(healthy)}),
    }
