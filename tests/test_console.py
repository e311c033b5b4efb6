"""The console in a real browser: Debian's Chromium, headless, driven by Playwright.

Nothing downloads a browser: Playwright is given ``/usr/bin/chromium``
(``tests/browser.py``), and these tests are skipped, saying why, where it is
absent. The server is real (``field serve``'s app on uvicorn, on a loopback
port); the API calls that make things happen go through the SDK, and the page
must show them by itself, over its push streams.

Screenshots are written to ``$FIELD_ARTIFACTS`` (default: the test's
temporary directory) for CI to keep. With ``FIELD_UPDATE_SCREENSHOTS=1`` the
desktop one also replaces ``docs/console.png``, the README's.
"""

from __future__ import annotations

import os
import re
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from playwright.async_api import Browser, Page, async_playwright, expect

from field.client import AgentClient, FieldClient, Relation

from .browser import CHROMIUM, TIMEOUT_MS, needs_chromium
from .conftest import ThreadedServer

OPERATOR_TOKEN = "console-operator-token-0123456789"
README_SCREENSHOT = Path(__file__).resolve().parent.parent / "docs" / "console.png"
#: Milliseconds a page state may take to appear (snapshots come once a second).
WAIT_MS = TIMEOUT_MS

pytestmark = [pytest.mark.slow, needs_chromium]


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=str(CHROMIUM))
        try:
            yield launched
        finally:
            await launched.close()


@pytest.fixture
def artifacts(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("FIELD_ARTIFACTS") or tmp_path / "artifacts")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture
def server(server_factory: Callable[..., ThreadedServer]) -> ThreadedServer:
    return server_factory(operator_token=OPERATOR_TOKEN)


def watched(page: Page) -> list[str]:
    """What goes wrong in the page: its uncaught errors and failed loads (but the streams
    it aborts itself, on reload and signing out)."""
    problems: list[str] = []
    page.on("pageerror", lambda error: problems.append(f"error: {error}"))
    page.on(
        "requestfailed",
        lambda r: (
            None if r.failure == "net::ERR_ABORTED" else problems.append(f"{r.url} {r.failure}")
        ),
    )
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    return problems


async def sign_in(page: Page, url: str, token: str) -> None:
    await page.goto(url + "/console")
    await page.locator("#token").fill(token)
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.locator("#console")).to_be_visible(timeout=WAIT_MS)
    await expect(page.locator("#link-events")).to_have_text("events: live", timeout=WAIT_MS)


async def record(agent: AgentClient, content: str, **more: object) -> str:
    unit = await agent.record(
        "finding", content, purpose="Track churn", confidence=0.8, reasoning="From the data.",
        **more,  # type: ignore[arg-type]
    )  # fmt: skip
    return str(unit["memory_unit_id"])


async def fill_the_chart(page: Page, agent: AgentClient, seconds: int = 20) -> None:
    """Some work each second, more or less, so that the chart shows something (for the
    README's screenshot): each second's work is done once the page shows the last."""
    path = page.locator("#chart-ops path")
    for second in range(seconds):
        for n in range(1 + second % 5 + second % 3):
            await record(agent, f"Dashboard reading {second}.{n}: churn at {2 + n / 10:.1f}%.")
        shown = (await path.get_attribute("d") or "").count("M")
        more = re.compile(rf"^(?:M[^M]*){{{shown + 1},}}$")  # one more bar: a second passed
        await expect(path).to_have_attribute("d", more, timeout=WAIT_MS)


async def test_the_operator_watches_and_resolves_a_conflict(
    server: ThreadedServer, browser: Browser, artifacts: Path
) -> None:
    page = await browser.new_page(viewport={"width": 1280, "height": 900})
    problems = watched(page)
    await sign_in(page, server.url, OPERATOR_TOKEN)
    await expect(page.locator("#who")).to_contain_text("operator")
    stored = await page.evaluate(
        "[sessionStorage.getItem('field.console.token'), localStorage.length, document.cookie]"
    )
    assert stored == [OPERATOR_TOKEN, 0, ""]

    async with FieldClient(server.url) as field:
        alice = await field.register("alice", "researcher", interests=["churn"])
        bob = await field.register("bob", "strategist", interests=["pricing"])
        first = await record(alice, "Churn fell to 2% in March.")

        # the unit appears in the event stream, linked to its author; the operator, who
        # has no role, interests or task, is shown no relevance
        recorded = page.locator('#events li[data-event="memory.recorded"]')
        await expect(recorded).to_have_count(1, timeout=WAIT_MS)
        await expect(recorded).to_contain_text("Churn fell to 2% in March.")
        await expect(recorded.locator('a.ref[data-kind="agent"]')).to_have_text("alice")
        await expect(recorded.locator(".score")).to_have_count(0)
        await expect(recorded).not_to_contain_text("general relevance")
        rows = page.locator("#agents tr[data-agent]")
        await expect(rows).to_have_count(2, timeout=WAIT_MS)
        await expect(page.locator('#agents tr[data-agent="alice"]')).to_contain_text("researcher")

        # a contradiction makes a conflict, which the operator resolves from the page
        answer = await bob.record(
            "finding", "Churn rose to 5% in March.", purpose="Track churn", confidence=0.6,
            reasoning="From the CRM.", relations=[Relation("contradicts", first)],
        )  # fmt: skip
        (conflict_id,) = answer["conflicts_detected"]
        conflict = page.locator(f'#conflicts li[data-conflict="{conflict_id}"]')
        await expect(conflict).to_be_visible(timeout=WAIT_MS)
        await expect(conflict).to_contain_text("Churn rose to 5% in March.")
        await expect(page.locator("#s-conflicts")).to_have_text("1 of 1", timeout=WAIT_MS)
        # a second has been sampled: the chart has its first bar, the figure its number
        await expect(page.locator("#chart-ops path")).to_have_count(1, timeout=WAIT_MS)
        await expect(page.locator("#c-ops")).to_have_text(re.compile(r"^\d+\.\d ops/s$"))
        await expect(page.locator("#chart-ops-max")).to_have_text(re.compile(r"^[\d.,]+ ops/s$"))
        # a longer window: its axis says so, and the page says how much of it it has seen
        await expect(page.locator("#chart-ops-x")).to_have_text("−2 min−1 minnow")
        await page.locator("#chart-window").select_option("3600")
        await expect(page.locator("#chart-ops-x")).to_have_text("−60 min−30 minnow")
        await expect(page.locator("#chart-span")).to_contain_text("since it started")
        await expect(page.locator("#chart-ops path")).to_have_count(1)
        await page.locator("#chart-window").select_option("300")
        await expect(page.locator("#chart-latency-x")).to_have_text("−5 min−2.5 minnow")
        if os.environ.get("FIELD_UPDATE_SCREENSHOTS") == "1":
            await fill_the_chart(page, await field.register("carol", "analyst"))
            README_SCREENSHOT.parent.mkdir(exist_ok=True)
            await page.screenshot(path=README_SCREENSHOT, full_page=True)
        await page.screenshot(path=artifacts / "console-desktop.png", full_page=True)

        await page.locator("#rationale").fill("The billing export is the source of truth.")
        await conflict.get_by_role("button", name="Keep A").click()
        await expect(conflict).to_have_count(0, timeout=WAIT_MS)
        await expect(page.locator("#conflicts")).to_contain_text("No open conflict.")
        await expect(page.locator("#s-conflicts")).to_have_text("0 of 1", timeout=WAIT_MS)
        resolved = page.locator('#events li[data-event="conflict.resolved"]')
        await expect(resolved).to_have_count(1, timeout=WAIT_MS)
        listed = await alice.send("DETECT", {"mode": "list", "filter": {"status": ["resolved"]}})
        (done,) = listed["conflicts"]
        assert done["resolution"]["winner_id"] == first
        assert done["resolution"]["rationale"] == "The billing export is the source of truth."

    # filtering by event name
    units = await page.locator('#events li[data-event="memory.recorded"]').count()
    assert units >= 2
    await page.locator("#event-filter").select_option("memory.recorded")
    await expect(page.locator("#events li")).to_have_count(units)
    await expect(page.locator('#events li:not([data-event="memory.recorded"])')).to_have_count(0)
    await page.locator("#event-filter").select_option("")
    await expect(page.locator('#events li[data-event="conflict.detected"]')).to_have_count(1)

    # a reload keeps the tab signed in; signing out forgets the token
    await page.reload()
    await expect(page.locator("#console")).to_be_visible(timeout=WAIT_MS)
    await page.get_by_role("button", name="Sign out").click()
    await expect(page.locator("#signin")).to_be_visible()
    stored = await page.evaluate("[sessionStorage.length, localStorage.length, document.cookie]")
    assert stored == [0, 0, ""]
    assert problems == []


async def test_an_agent_on_a_phone(
    server_factory: Callable[..., ThreadedServer], browser: Browser, artifacts: Path
) -> None:
    # agents are failed one second after their last request
    server = server_factory(operator_token=OPERATOR_TOKEN, heartbeat_timeout=1.0)
    context = await browser.new_context(
        viewport={"width": 390, "height": 844}, device_scale_factor=2, is_mobile=True,
        has_touch=True,
    )  # fmt: skip
    page = await context.new_page()
    problems = watched(page)
    async with FieldClient(server.url) as field:
        alice = await field.register("alice", "researcher", interests=["churn"])
        bob = await field.register("bob-with-a-rather-long-agent-identifier", "strategist")
        first = await record(alice, "Churn fell to 2% in March.")
        await record(bob, "Churn rose to 5% in March.", relations=[Relation("contradicts", first)])
        await sign_in(page, server.url, alice.token)
        await expect(page.locator("#who")).to_contain_text("signed in as alice")
        # the agent sees the conflict, but may not merge it (authority 4)
        await expect(page.locator("#conflicts li.conflict")).to_have_count(1, timeout=WAIT_MS)
        await expect(page.locator("#conflicts button")).to_have_count(0)
        await expect(page.locator("#rationale")).to_be_hidden()
        await expect(page.locator("#merge-help")).to_contain_text("needs authority 6")
        # its own subscription, read by the page itself
        subscription = page.locator("#subscriptions tr[data-subscription]")
        await expect(subscription).to_contain_text("console", timeout=WAIT_MS)
        await expect(subscription).to_contain_text("SSE 1")
        # bob is heard from once the page reads its events (recovering, if signing in
        # took longer than a second), then goes silent: failed, and the page says why
        await bob.attune()
        failed = page.locator('#agents tr[data-agent^="bob"]')
        await expect(failed.locator(".badge")).to_have_text("failed", timeout=WAIT_MS)
        await expect(failed.locator(".reason")).to_contain_text("not heard from")
        # an agent is shown how relevant each event is to it, and why
        failure = page.locator('#events li[data-event="agent.failed"]').first
        await expect(failure.locator(".score")).to_have_text(
            re.compile(r"^ \d\.\d\d$"), timeout=WAIT_MS
        )
        await expect(failure.locator(".why").first).to_contain_text("agent.failed:")
    width = await page.evaluate(
        "[document.documentElement.scrollWidth, document.documentElement.clientWidth]"
    )
    assert width[0] <= width[1], f"the page is wider than the phone: {width}"
    await page.screenshot(path=artifacts / "console-phone.png", full_page=True)
    await context.close()
    assert problems == []
