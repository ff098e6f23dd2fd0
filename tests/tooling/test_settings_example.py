"""docs/settings.md's "A setting of your own", copied as shown into a copy of the project: a required setting
(``billing_url``) from a parameter without a Default, a secret's parameter under a name of its own, their variables
and grant.

The copy passes make test's static stage and the generic contract on the local stack (whose secret for that parameter
signs what the sink verifies); the one part the page leaves to the reader, what ``...`` stands for in its handler, is
written here: an optimistic handler that records a renewal in the examples' ledger.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from local.replace_examples import register
from testkit import application
from tests.tooling.template_copies import pytest_in
from tests.tooling.test_existing_table import (
    _ON_THE_STACK,
    _STATIC,
    METADATA,
    PARAMETERS,
    VARIABLES,
    _copy,
    _failures,
    into_template,
)
from tests.utils import page_blocks

_HANDLER_HEAD = '''"""docs/settings.md's settings example around a handler of this test's."""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field, PositiveInt

from consumer.api import (
    ID_PATTERN, ApiUrl, Effect, HandlerSettings, MessageContext, MessageHandler, Mode, Put, SecretArn, Settings,
    SigningKey, WebhookClient,
)


class Renewal(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    renewalId: str = Field(pattern=ID_PATTERN)
    accountId: str = Field(pattern=ID_PATTERN)


'''  # fmt: skip
# What the page's ``...`` stands for.
_HANDLER_BODY = """    event_type: ClassVar[str] = "RenewalDue"
    mode: ClassVar[Mode] = Mode.OPTIMISTIC
    payload_model: ClassVar[type[BaseModel]] = Renewal
    tables: ClassVar[tuple[str, ...]] = ("LedgerTable",)

    def handle(self, payload: Renewal, context: MessageContext) -> Effect:
        entry = {"accountId": payload.accountId, "entryId": f"RENEWAL#{payload.renewalId}"}
        put = Put(table=self.table_names["LedgerTable"], item=entry, condition="attribute_not_exists(entryId)")
        return Effect(result={"renewed": payload.renewalId}, writes=(put,))
"""
_CODE, _LOCAL_VALUES = 0, 2


def _follow(project: Path, skip: int | None = None) -> None:
    blocks = page_blocks("settings.md", "### A setting of your own")
    assert len(blocks) == 6, "docs/settings.md's settings example changed shape: update this test"
    code = blocks[_CODE].replace("    ...\n", _HANDLER_BODY, 1)
    (application.handlers_folder(project) / "renewal_due.py").write_text(_HANDLER_HEAD + code)
    register(
        application.registry_file(project),
        application.handler_import("renewal_due", "RenewalHandler") + "HANDLERS: T = (..., RenewalHandler)",
    )
    places = [PARAMETERS, METADATA, VARIABLES, ("\nConditions:\n", True), ("  ConsumerFunction:\n", False)]
    into_template(project / "template.yaml", blocks[1:], places, None if skip is None else skip - 1)


@pytest.mark.long(60)
@pytest.mark.timeout(600)
def test_the_settings_example_copied_as_shown_passes_the_static_stage_and_the_contract(tmp_path: Path) -> None:
    _copy(tmp_path)
    _follow(tmp_path)

    done = pytest_in(tmp_path, _STATIC, "-p", "no:xdist", *_ON_THE_STACK, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]

    done = pytest_in(
        tmp_path, ["tests/app/test_handler_contract.py", "-k", "RenewalDue"], "-p", "no:xdist", timeout=400
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert re.search(r"\b\d+ passed", done.stdout), done.stdout[-2000:]


@pytest.mark.long(20)
def test_the_url_without_its_local_value_is_one_failure_saying_where_to_put_it(tmp_path: Path) -> None:
    _copy(tmp_path)
    _follow(tmp_path, skip=_LOCAL_VALUES)

    done = pytest_in(tmp_path, _STATIC, "-p", "no:xdist", *_ON_THE_STACK, timeout=300)

    assert _failures(done.stdout) == [
        "tests/deployment/test_outputs_and_config.py::test_every_parameter_has_a_value_for_the_checks"
    ], done.stdout[-4000:]
    assert '"BillingUrl: <value>" under LocalParameters:' in done.stdout, done.stdout[-4000:]
