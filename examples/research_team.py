"""Two agents disagree on a number; a lead resolves it; they hear the outcome.

A researcher records a finding, an analyst records one that contradicts it
(the Field makes a conflict), a lead that subscribes to conflicts resolves it
with MERGE, and the researcher, subscribed to resolutions, hears how it ended.
Run it as often as you like: the agents' tokens and stream cursors are kept in
``FIELD_AGENT_DIR`` (``.field-agents`` by default), so every run is the same
three agents with the same two subscriptions, and each run handles its own
conflict once.

MERGE needs authority 6, which only the operator grants, so start the Field
with an operator token and give the script the same one::

    FIELD_OPERATOR_TOKEN=change-me-to-a-long-secret field serve
    FIELD_OPERATOR_TOKEN=change-me-to-a-long-secret python examples/research_team.py

Without ``FIELD_OPERATOR_TOKEN`` the script says so and stops; a token the
Field refuses stops it with the Field's message and suggested action, before
any agent is registered; a URL where no Field answers, with that. The Field's
URL is the first argument, or ``FIELD_URL`` (default
``http://127.0.0.1:8765``).
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from field.client import (
    AgentClient,
    FieldClient,
    FieldClientError,
    Relation,
    StoredTokenRefused,
    Subscription,
)

URL = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("FIELD_URL", "http://127.0.0.1:8765")
AGENTS = Path(os.environ.get("FIELD_AGENT_DIR", ".field-agents"))
OPERATOR_TOKEN = os.environ.get("FIELD_OPERATOR_TOKEN")
NO_OPERATOR_TOKEN = """FIELD_OPERATOR_TOKEN is not set.
The lead resolves conflicts with MERGE, which needs authority 6, which only the operator grants.
Start the Field with an operator token, and run this script with the same one:
    FIELD_OPERATOR_TOKEN=change-me-to-a-long-secret field serve
    FIELD_OPERATOR_TOKEN=change-me-to-a-long-secret python examples/research_team.py"""


async def lead_resolves(
    lead: AgentClient, disputes: Subscription, ours: asyncio.Future[str]
) -> None:
    """The lead's loop: resolve each conflict it is told of, until this run's is resolved."""
    async with lead.notifications(disputes, cursor_file=AGENTS / "lead.cursors") as stream:
        async for notification in stream:
            conflict_id = notification.conflict_id
            assert conflict_id is not None
            try:
                merged = await lead.merge(
                    conflict_id,
                    "confidence_weighted",
                    rationale="The better-supported figure stands.",
                )
            except FieldClientError as error:
                if error.code != "INVALID_TRANSITION":  # resolved already, by an earlier run
                    raise
            else:
                winner = merged["conflict"]["resolution"]["winner_id"]
                print(f"lead: resolved {conflict_id}: {winner} stands")
            if conflict_id == await ours:
                return


async def run(operator_token: str) -> None:
    async with FieldClient(URL) as field:
        # registered on the first run; the same agents (their tokens kept 0600) on the next.
        # The lead first: a Field that refuses the operator token has registered no one.
        lead = await field.connect(
            "lead",
            role="research_lead",
            authority=6,
            operator_token=operator_token,
            token_file=AGENTS / "lead.token",
        )
        researcher = await field.connect(
            "researcher",
            role="market_researcher",
            interests=["market size"],
            token_file=AGENTS / "researcher.token",
        )
        analyst = await field.connect(
            "analyst",
            role="financial_analyst",
            interests=["market size"],
            token_file=AGENTS / "analyst.token",
        )
        print("agents:", "reused" if researcher.reused else "registered")

        # named: the same subscriptions on every run, not one more each time
        disputes = await lead.subscribe(["conflict.detected"], name="disputes")
        outcomes = await researcher.subscribe(["conflict.resolved"], name="outcomes")
        print("subscriptions:", "created" if disputes.created else "reused")

        ours: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        resolving = asyncio.create_task(lead_resolves(lead, disputes, ours))

        finding = await researcher.record(
            "finding",
            "The EU market for SMB HR software grows 23% a year.",
            purpose="Size the market",
            confidence=0.85,
            reasoning="Three analyst reports agree.",
        )
        challenge = await analyst.record(
            "finding",
            "The EU market for SMB HR software grows 9% a year.",
            purpose="Check the market size",
            confidence=0.6,
            reasoning="One survey of 40 firms.",
            relations=[Relation("contradicts", finding["memory_unit_id"], "the survey disagrees")],
        )
        (conflict_id,) = challenge["conflicts_detected"]
        ours.set_result(conflict_id)
        print(f"analyst: contradicted {finding['memory_unit_id']}: {conflict_id}")

        async with researcher.notifications(
            outcomes, cursor_file=AGENTS / "researcher.cursors"
        ) as stream:
            async for notification in stream:
                if notification.conflict_id == conflict_id:
                    print(f"researcher: told {notification.event} for {conflict_id}")
                    break
        await resolving

        context = await analyst.attune(context_hint="market size", max_units=1, include_own=True)
        best = context["record"][0]["memory_unit"]
        print(f"analyst: the Field now says: {best['content']}")


def main() -> None:
    if not OPERATOR_TOKEN:
        sys.exit(NO_OPERATOR_TOKEN)
    try:
        asyncio.run(run(OPERATOR_TOKEN))
    except StoredTokenRefused as error:  # a kept token: the message says what to do
        sys.exit(str(error))
    except FieldClientError as error:  # the Field's error response, and what it suggests
        sys.exit(f"{error}\n{error.body.get('suggested_action', '')}".rstrip())
    except ConnectionError as error:  # no Field at the URL
        sys.exit(str(error))


if __name__ == "__main__":
    main()
