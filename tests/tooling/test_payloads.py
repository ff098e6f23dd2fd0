"""testkit.payloads on a handler of this test's own: draws the model accepts, defects it refuses, samples by event
type, and seed items found by event type."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

import boto3
import pytest
from moto import mock_aws
from pydantic import BaseModel, ConfigDict, Field, StrictInt

from consumer.handler import Effect, MessageContext, MessageHandler, Mode
from local.event_files import sample_bodies
from testkit import payloads
from testkit.payloads import GeneratorError
from tests.tooling.template_copies import on_the_cores_own_application

test_on_the_cores_own_application = on_the_cores_own_application(__name__, seconds=15)


class ParcelShipped(BaseModel):
    model_config = ConfigDict(extra="forbid")

    parcelId: str = Field(pattern=r"^[a-z0-9-]{3,20}$")
    grams: StrictInt = Field(gt=0, le=50_000)
    note: str | None = None


class ParcelShippedHandler(MessageHandler[ParcelShipped]):
    event_type: ClassVar[str] = "ParcelShipped"
    mode: ClassVar[Mode] = Mode.OPTIMISTIC
    payload_model: ClassVar[type[BaseModel]] = ParcelShipped
    tables: ClassVar[tuple[str, ...]] = ("ParcelTable",)

    def handle(self, payload: ParcelShipped, context: MessageContext) -> Effect:
        return Effect()


class Lenient(BaseModel):  # a model that refuses nothing a generator could send as a defect
    anything: Any = None


class LenientHandler(ParcelShippedHandler):
    event_type: ClassVar[str] = "Lenient"
    payload_model: ClassVar[type[BaseModel]] = Lenient


def test_valid_draws_are_accepted_by_the_model_and_deterministic_from_the_seed() -> None:
    drawn = payloads.valid_payloads(ParcelShippedHandler, 20, seed=7)
    assert len(drawn) == 20
    assert all(ParcelShipped.model_validate_json(json.dumps(p)) for p in drawn)
    assert payloads.valid_payloads(ParcelShippedHandler, 20, seed=7) == drawn
    assert payloads.valid_payloads(ParcelShippedHandler, 20, seed=8) != drawn
    assert len({p["parcelId"] for p in drawn}) > 1


def test_a_draw_the_model_refuses_is_the_generators_bug_said_clearly(monkeypatch: pytest.MonkeyPatch) -> None:
    # The factory draws from the model; a validator the factory cannot see makes its draws refused.
    monkeypatch.setattr(payloads, "refusal", lambda model, payload: "grams: too heavy")
    with pytest.raises(GeneratorError, match=r"ParcelShipped: polyfactory drew .* ParcelShipped refuses it"):
        payloads.valid_payloads(ParcelShippedHandler, 1)


def test_invalid_payloads_drop_each_required_field_mistype_each_field_and_add_an_extra() -> None:
    made = payloads.invalid_payloads(ParcelShippedHandler, seed=3)
    defects = [invalid.defect for invalid in made]
    assert "parcelId dropped" in defects and "grams dropped" in defects
    assert "note dropped" not in defects  # optional: dropping it is no defect
    assert {d.split(" given ")[0] for d in defects if " given " in d} == {"parcelId", "grams", "note"}
    assert "extra field unexpectedField" in defects
    for invalid in made:
        assert payloads.refusal(ParcelShipped, invalid.payload) is not None, invalid.defect


def test_no_extra_field_defect_where_the_model_allows_extras_and_none_that_it_would_accept() -> None:
    assert payloads.invalid_payloads(LenientHandler) == []


def test_an_invalid_payload_the_model_accepts_is_the_generators_bug(monkeypatch: pytest.MonkeyPatch) -> None:
    # A model that refuses a payload once and accepts it when asked again: the final check catches the defect.
    asked: set[str] = set()

    def refuses_once(model: type[BaseModel], payload: Any) -> str | None:
        seen = json.dumps(payload, sort_keys=True) in asked
        asked.add(json.dumps(payload, sort_keys=True))
        return None if seen or payload == VALID else "refused"

    monkeypatch.setattr(payloads, "refusal", refuses_once)
    monkeypatch.setattr(payloads, "valid_payloads", lambda handler, count, seed=0: [VALID])
    with pytest.raises(GeneratorError, match=r"ParcelShipped: parcelId given .* is accepted by the model"):
        payloads.invalid_payloads(ParcelShippedHandler)


VALID = {"parcelId": "abc", "grams": 1}


def _event_file(path: Path, *bodies: str) -> None:
    path.write_text(json.dumps({"Records": [{"messageId": str(i), "body": b} for i, b in enumerate(bodies)]}))


def test_sample_bodies_are_matched_by_the_event_type_in_the_body(tmp_path: Path) -> None:
    parcel = json.dumps({"eventType": "ParcelShipped", "payload": {"parcelId": "p-1", "grams": 5}})
    other = json.dumps({"eventType": "Other", "payload": {}})
    _event_file(tmp_path / "a.json", other, parcel, "{not json")
    _event_file(tmp_path / "b.json", parcel.replace("p-1", "p-2"), "[1]")
    assert sample_bodies("ParcelShipped", tmp_path) == [parcel, parcel.replace("p-1", "p-2")]
    assert sample_bodies("Nothing", tmp_path) == []


def _seeds(root: Path, where: str, source: str) -> None:
    path = root / "tests" / where / "parcel_shipped_seeds.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source)


def test_seed_items_are_found_by_event_type_and_written_to_the_deployed_tables(tmp_path: Path) -> None:
    source = "def seed_items(payload):\n    return [('ParcelTable', {'id': payload['parcelId'], 'n': 1})]\n"
    _seeds(tmp_path, "mine", source)
    items = payloads.seed_items(ParcelShippedHandler, {"parcelId": "p-9", "grams": 1}, tmp_path)
    assert items == [("ParcelTable", {"id": "p-9", "n": 1})]
    assert payloads.seed_items(LenientHandler, {}, tmp_path) == []  # no seeds file: no seed items
    with mock_aws():
        dynamodb = boto3.client("dynamodb", region_name="us-east-1")
        dynamodb.create_table(
            TableName="t",
            AttributeDefinitions=[{"AttributeName": "id", "AttributeType": "S"}],
            KeySchema=[{"AttributeName": "id", "KeyType": "HASH"}],
            BillingMode="PAY_PER_REQUEST",
        )
        payloads.put_seeds(dynamodb, {"ParcelTable": "t"}, items)
        assert dynamodb.get_item(TableName="t", Key={"id": {"S": "p-9"}})["Item"] == {
            "id": {"S": "p-9"},
            "n": {"N": "1"},
        }


def test_seed_items_for_an_undeclared_table_or_two_seeds_files_are_refused(tmp_path: Path) -> None:
    _seeds(tmp_path, "mine", "def seed_items(payload):\n    return [('OtherTable', {'id': 'x'})]\n")
    with pytest.raises(GeneratorError, match=r"seeds \['OtherTable'\], not among ParcelShipped's tables"):
        payloads.seed_items(ParcelShippedHandler, {}, tmp_path)
    _seeds(tmp_path, "theirs", "def seed_items(payload):\n    return []\n")
    with pytest.raises(GeneratorError, match="more than one seeds file"):
        payloads.seeds_file("ParcelShipped", tmp_path)


@pytest.mark.cores_own_application
def test_every_registered_handler_draws_valid_and_invalid_payloads() -> None:
    # Whatever is registered: the generator's own checks raise on a draw its model would not take.
    for handler in payloads.registered():
        assert len(payloads.valid_payloads(handler, 5)) == 5
        assert payloads.invalid_payloads(handler), handler.event_type
