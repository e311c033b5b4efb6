"""The operator's console in a real browser: the recent past, drill-down views and actions.

Debian's Chromium, headless, driven by Playwright (``tests/test_console.py`` says
how; skipped without it). Each test runs at desktop and at phone width. The
server is real; what the page does is checked through the API as well as on the
page: an action the page confirmed is an operation the Field performed.
Screenshots go to ``$FIELD_ARTIFACTS`` (default: the test's temporary directory).
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Browser, Page, expect

from field.client import FieldClient, Relation

from .browser import needs_chromium
from .conftest import ThreadedServer
from .test_console import (
    OPERATOR_TOKEN,
    WAIT_MS,
    artifacts,
    browser,
    record,
    sign_in,
    watched,
)
from .test_webhooks import FAST_RETRIES, Receiver

__all__ = ["artifacts", "browser"]  # the fixtures, shared with tests/test_console.py

pytestmark = [pytest.mark.slow, needs_chromium]

#: Events one page of the past holds (``HISTORY_PAGE`` in console.js).
HISTORY_PAGE = 50

VIEWPORTS = {
    "desktop": {"viewport": {"width": 1280, "height": 900}},
    "phone": {
        "viewport": {"width": 390, "height": 844},
        "device_scale_factor": 2,
        "is_mobile": True,
        "has_touch": True,
    },
}


@pytest.fixture(params=sorted(VIEWPORTS))
def width(request: pytest.FixtureRequest) -> str:
    """The screen the page is shown on: ``desktop`` or ``phone``."""
    return str(request.param)


@pytest.fixture
async def page(width: str, browser: Browser) -> AsyncIterator[Page]:
    context = await browser.new_context(**VIEWPORTS[width])
    yield await context.new_page()
    await context.close()


@pytest.fixture
def server(server_factory: Callable[..., ThreadedServer]) -> ThreadedServer:
    return server_factory(
        operator_token=OPERATOR_TOKEN, webhook_allow_net=("127.0.0.0/8",), **FAST_RETRIES
    )


async def as_operator(field: FieldClient, operation: str, payload: dict[str, Any]) -> Any:
    body = field.envelope(operation, "operator", payload)
    return await field.request("POST", f"/v1/{operation.lower()}", body=body, token=OPERATOR_TOKEN)


async def cursors(page: Page) -> list[str]:
    return list(
        await page.evaluate(
            "[...document.querySelectorAll('#events li')].map(e => e.dataset.cursor)"
        )
    )


async def confirm(page: Page, button_name: str) -> None:
    """Answer the confirmation dialog the last click opened."""
    dialog = page.locator("#confirm")
    await expect(dialog).to_be_visible()
    await dialog.get_by_role("button", name=button_name, exact=True).click()
    await expect(dialog).to_be_hidden()


async def fits(page: Page) -> None:
    width = await page.evaluate(
        "[document.documentElement.scrollWidth, document.documentElement.clientWidth]"
    )
    assert width[0] <= width[1], f"the page is wider than the screen: {width}"


async def test_history_after_a_reload_and_paging_back(
    server: ThreadedServer, page: Page, width: str, artifacts: Path
) -> None:
    problems = watched(page)
    await sign_in(page, server.url, OPERATOR_TOKEN)  # the console's subscription begins
    async with FieldClient(server.url) as field:
        alice = await field.register("alice", "researcher", interests=["churn"])
        for n in range(HISTORY_PAGE + 9):
            await record(alice, f"Churn reading {n}: {2 + n / 100:.2f}%.")
        total = HISTORY_PAGE + 10  # agent.joined and the units
        await expect(page.locator("#events li")).to_have_count(total, timeout=WAIT_MS)

        # a reload shows the recent past, read from the log: the newest page of it
        await page.reload()
        await expect(page.locator("#console")).to_be_visible(timeout=WAIT_MS)
        events = page.locator("#events li")
        await expect(events).to_have_count(HISTORY_PAGE, timeout=WAIT_MS)
        await expect(events.first).to_contain_text(f"Churn reading {HISTORY_PAGE + 8}:")
        await expect(page.locator("#events li .from-log")).to_have_count(HISTORY_PAGE)
        older = page.get_by_role("button", name="Older events")
        await expect(older).to_be_visible()

        # what happens now comes live, above the past, and nothing is shown twice
        await expect(page.locator("#link-events")).to_have_text("events: live")
        await record(alice, "Churn reading live: 1.90%.")
        await expect(events).to_have_count(HISTORY_PAGE + 1, timeout=WAIT_MS)
        await expect(events.first).to_contain_text("Churn reading live")
        await expect(events.first.locator("time")).to_have_count(1)

        # paging back reads the rest, down to the subscription's beginning
        await older.click()
        await expect(events).to_have_count(total + 1, timeout=WAIT_MS)
        await expect(events.last).to_have_attribute("data-event", "agent.joined")
        await expect(older).to_be_hidden()
        await expect(page.locator("#history-note")).to_contain_text("everything since")
        shown = await cursors(page)
        assert len(set(shown)) == len(shown) == total + 1
        positions = [int(c.rsplit("-", 1)[1]) for c in shown]
        assert positions == sorted(positions, reverse=True), "newest first, in log order"
        await fits(page)
        await page.screenshot(
            path=artifacts / f"console-history-{width}.png",
            full_page=True,
        )
    assert problems == []


async def test_drill_down_from_an_event_to_an_agent_a_unit_and_a_conflict(
    server: ThreadedServer, page: Page, width: str, artifacts: Path
) -> None:
    problems = watched(page)
    await sign_in(page, server.url, OPERATOR_TOKEN)
    async with FieldClient(server.url) as field:
        alice = await field.register("alice", "researcher", interests=["churn"])
        bob = await field.register("bob", "strategist")
        first = await record(alice, "Churn fell to 2% in March.")
        answer = await bob.record(
            "finding", "Churn rose to 5% in March.", purpose="Track churn", confidence=0.6,
            reasoning="From the CRM.", relations=[Relation("contradicts", first)],
        )  # fmt: skip
        (conflict_id,) = answer["conflicts_detected"]
        recorded = page.locator('#events li[data-event="memory.recorded"]')
        await expect(recorded).to_have_count(2, timeout=WAIT_MS)

        # an agent's id in an event opens the agent: its record, units, conflicts
        await recorded.last.locator('a.ref[data-kind="agent"]').click()
        detail = page.locator("#detail")
        await expect(detail).to_be_visible()
        await expect(page.locator("#detail-title")).to_be_focused()
        await expect(page.locator("#detail-title")).to_have_text("Agent alice")
        await expect(detail).to_contain_text("researcher", timeout=WAIT_MS)
        await expect(detail).to_contain_text("Churn fell to 2% in March.")
        await expect(detail.locator(f'a.ref[data-id="{conflict_id}"]')).to_have_count(1)
        await page.screenshot(
            path=artifacts / f"console-agent-{width}.png",
        )

        # from there to its unit: the unit's timeline, read by REPLAY, and its conflict
        await detail.locator(f'a.ref[data-kind="unit"][data-id="{first}"]').first.click()
        await expect(page.locator("#detail-title")).to_have_text(f"Memory unit {first}")
        timeline = detail.locator("table.timeline tbody tr")
        await expect(timeline.first).to_be_visible(timeout=WAIT_MS)
        await expect(detail.locator("table.timeline")).to_contain_text("memory.recorded")
        await expect(detail.locator("table.timeline")).to_contain_text("conflict.detected")

        # and to the conflict, with both units
        await detail.locator(f'a.ref[data-kind="conflict"][data-id="{conflict_id}"]').first.click()
        await expect(page.locator("#detail-title")).to_have_text(f"Conflict {conflict_id}")
        await expect(detail).to_contain_text("detected", timeout=WAIT_MS)
        await expect(detail.locator('a.ref[data-kind="unit"]').first).to_be_visible()
        await fits(page)
        await page.screenshot(
            path=artifacts / f"console-conflict-{width}.png",
        )
        # the view is in the address: a reload opens it again
        await page.reload()
        await expect(page.locator("#detail-title")).to_have_text(
            f"Conflict {conflict_id}", timeout=WAIT_MS
        )
        await expect(detail).to_contain_text("detected", timeout=WAIT_MS)
        await page.keyboard.press("Escape")
        await expect(detail).to_be_hidden()
        # the dialog's close event, which clears the address, comes a task after it hides
        await expect(page).to_have_url(re.compile(r"^[^#]*$"))

        # the node, from the status page
        await page.locator('#nodes a.ref[data-kind="node"]').click()
        await expect(detail).to_contain_text("Delivery term", timeout=WAIT_MS)
        await page.get_by_role("button", name="Close").click()
        await expect(detail).to_be_hidden()
    assert problems == []


async def test_the_operators_actions(
    server: ThreadedServer, page: Page, width: str, artifacts: Path
) -> None:
    problems = watched(page)
    await sign_in(page, server.url, OPERATOR_TOKEN)
    result = page.locator("#operator-result")
    async with FieldClient(server.url) as field:
        # a registration token: dismissed once, then issued; its secret shown once
        await page.locator("#token-note").fill("pilot <b>team</b>")
        await page.get_by_role("button", name="Issue token").click()
        await confirm(page, "Cancel")
        listed = await field.request("GET", "/v1/registration-tokens", token=OPERATOR_TOKEN)
        assert listed["registration_tokens"] == []
        await page.get_by_role("button", name="Issue token").click()
        await confirm(page, "Issue")
        await expect(page.locator("#token-secret code")).to_have_text(re.compile("^fieldreg_"))
        token = page.locator("#tokens li.token")
        await expect(token).to_contain_text("pilot <b>team</b>")  # as text, never as HTML
        (issued,) = (await field.request("GET", "/v1/registration-tokens", token=OPERATOR_TOKEN))[
            "registration_tokens"
        ]
        assert issued["note"] == "pilot <b>team</b>"

        # a source: defined, then removed
        await page.locator("#source-name").fill("github")
        await page.locator("#source-content").fill("PR #{payload.number}")
        await page.locator("#source-filter").fill("payload.action == 'opened'")
        await page.get_by_role("button", name="Define source").click()
        await confirm(page, "Define")
        await expect(page.locator("#source-secret code")).to_have_text(
            re.compile(r"^[0-9a-f]{64}$")
        )
        source = page.locator('#sources li[data-source="github"]')
        await expect(source).to_contain_text("0 accepted")
        (defined,) = (await field.request("GET", "/v1/sources", token=OPERATOR_TOKEN))["sources"]
        assert defined["filter"] == "payload.action == 'opened'"
        await page.screenshot(
            path=artifacts / f"console-operator-{width}.png",
            full_page=True,
        )

        await token.get_by_role("button", name="Revoke").click()
        await confirm(page, "Revoke")
        await expect(result).to_have_text(f"{issued['id']}: revoked.")
        await expect(page.locator("#tokens")).to_contain_text("No registration token is held.")
        await source.get_by_role("button", name="Remove").click()
        await confirm(page, "Remove")
        await expect(page.locator("#sources")).to_contain_text("No source is defined.")
        assert (await field.request("GET", "/v1/registration-tokens", token=OPERATOR_TOKEN))[
            "registration_tokens"
        ] == []
        assert (await field.request("GET", "/v1/sources", token=OPERATOR_TOKEN))["sources"] == []

        # a webhook of the operator's whose receiver refuses: failing, resumed from the page
        answers = {"status": 400}
        receiver = await Receiver(answer=lambda n: answers["status"]).start()
        try:
            created = await as_operator(
                field, "SUBSCRIBE", {"action": "subscribe", "subscription": {
                    "name": "audit-hook", "events": ["memory.recorded"],
                    "delivery": {"type": "webhook", "url": receiver.url},
                }},
            )  # fmt: skip
            subscription_id = created["subscription_id"]
            alice = await field.register("alice", "researcher")
            await record(alice, "Churn fell to 2% in March.")
            row = page.locator(f'#subscriptions tr[data-subscription="{subscription_id}"]')
            await expect(row.locator(".badge")).to_have_text("failing", timeout=WAIT_MS)
            answers["status"] = 200
            await row.get_by_role("button", name="Resume delivery").click()
            await confirm(page, "Resume")
            await expect(page.locator("#subscription-result")).to_have_text(
                "audit-hook: delivery resumed."
            )
            await receiver.until(lambda: bool(receiver.delivered), "the resumed delivery")
            await expect(row.locator(".badge")).to_have_text("active", timeout=WAIT_MS)

            # the subscription's view shows its delivery; cancelling it ends it
            await row.locator('a.ref[data-kind="subscription"]').click()
            detail = page.locator("#detail")
            await expect(detail).to_contain_text(receiver.url, timeout=WAIT_MS)
            await detail.get_by_role("button", name="Cancel").click()
            await confirm(page, "Cancel subscription")
            await expect(detail).to_be_hidden()
            await expect(row).to_have_count(0, timeout=WAIT_MS)
            mine = await as_operator(field, "SUBSCRIBE", {"action": "list"})
            assert subscription_id not in [s["id"] for s in mine["subscriptions"]]
        finally:
            await receiver.stop()
        await fits(page)
    assert problems == []


async def test_the_operator_acts_on_other_agents_and_reads_the_past_before_it_signed_in(
    server: ThreadedServer, page: Page, width: str, artifacts: Path
) -> None:
    problems = watched(page)
    async with FieldClient(server.url) as field:
        # all this happens before the operator ever opens the console
        alice = await field.register("alice", "researcher", interests=["churn"])
        bob = await field.register("bob", "strategist")
        for n in range(3):
            await record(alice, f"Churn reading {n}: {2 + n / 10:.1f}%.")
        watching = await bob.send("SUBSCRIBE", {"action": "subscribe", "subscription": {
            "name": "bob-watch", "events": ["memory.recorded"]}})  # fmt: skip
        await sign_in(page, server.url, OPERATOR_TOKEN)

        # the past is read from the log: it begins before the console's first sign-in
        recorded = page.locator('#events li[data-event="memory.recorded"]')
        await expect(recorded).to_have_count(3, timeout=WAIT_MS)
        await expect(recorded.first).to_contain_text("Churn reading 2:")
        await expect(page.locator('#events li[data-event="agent.joined"]')).to_have_count(2)
        await expect(page.locator("#events li .from-log")).to_have_count(5)
        await expect(page.locator("#history-note")).to_contain_text("since the log began")
        shown = await cursors(page)
        assert len(set(shown)) == len(shown) == 5

        # another agent's subscription: the operator cancels it
        row = page.locator(f'#subscriptions tr[data-subscription="{watching["subscription_id"]}"]')
        await row.get_by_role("button", name="Cancel").click()
        await confirm(page, "Cancel subscription")
        await expect(page.locator("#subscription-result")).to_have_text("bob-watch: cancelled.")
        await expect(row).to_have_count(0, timeout=WAIT_MS)
        assert (await bob.send("SUBSCRIBE", {"action": "list"}))["subscriptions"] == []

        # alice's view: declared failed, then deregistered, each after its confirmation
        await recorded.first.locator('a.ref[data-kind="agent"]').click()
        detail = page.locator("#detail")
        await expect(page.locator("#detail-title")).to_have_text("Agent alice")
        await detail.get_by_role("button", name="Declare failed").click()
        await confirm(page, "Cancel")
        assert (await field.request("GET", "/v1/agents?id=alice", token=OPERATOR_TOKEN))["agents"][
            0
        ]["status"] != "failed"
        await detail.get_by_role("button", name="Declare failed").click()
        await confirm(page, "Declare failed")
        await expect(page.locator("#agent-result")).to_have_text("alice: declared failed.")
        (failed,) = (await field.request("GET", "/v1/agents?id=alice", token=OPERATOR_TOKEN))[
            "agents"
        ]
        assert failed["failure_reason"] == "declared failed by the operator"
        # the failure is an event like liveness's, and comes live
        live = page.locator('#events li[data-event="agent.failed"]')
        await expect(live).to_have_count(1, timeout=WAIT_MS)
        await expect(live).to_contain_text("declared failed by the operator")
        await fits(page)
        await page.screenshot(path=artifacts / f"console-agent-actions-{width}.png")

        await detail.get_by_role("button", name="Deregister").click()
        await confirm(page, "Deregister")
        await expect(page.locator("#agent-result")).to_have_text("alice: deregistered.")
        listed = await field.request("GET", "/v1/agents?id=alice", token=OPERATOR_TOKEN)
        assert listed["agents"] == []
    assert problems == []


async def test_the_nodes_of_a_cluster(
    server_factory: Callable[..., ThreadedServer], page: Page, width: str, artifacts: Path
) -> None:
    """Two servers on one PostgreSQL log: the console of one lists both nodes, with their
    positions and which one sends the deliveries, and opens the other's view."""
    psycopg = pytest.importorskip("psycopg", reason="SKIPPED PostgreSQL tests: psycopg missing")
    del psycopg
    from .postgres_util import fresh_database

    problems = watched(page)
    with fresh_database() as database:
        shared = {"log": database, "cluster_interval": 0.2, "operator_token": OPERATOR_TOKEN}
        here = server_factory(node_id="node-here", **shared)
        server_factory(node_id="node-there", **shared)
        await sign_in(page, here.url, OPERATOR_TOKEN)
        rows = page.locator("#nodes tr[data-node]")
        await expect(rows).to_have_count(2, timeout=WAIT_MS)
        await expect(page.locator('#nodes tr[data-node="node-here"]')).to_contain_text(
            "this server"
        )
        there = page.locator('#nodes tr[data-node="node-there"]')
        await expect(there).to_contain_text("ago", timeout=WAIT_MS)
        # exactly one of the two sends the deliveries, whichever claimed them first
        await expect(page.locator("#nodes td", has_text="not held")).to_have_count(
            1, timeout=WAIT_MS
        )
        await page.screenshot(path=artifacts / f"console-nodes-{width}.png")
        await there.locator('a.ref[data-kind="node"]').click()
        detail = page.locator("#detail")
        await expect(page.locator("#detail-title")).to_have_text("Node node-there")
        await expect(detail).to_contain_text("as it last said", timeout=WAIT_MS)
        await page.get_by_role("button", name="Close").click()
    assert problems == []
