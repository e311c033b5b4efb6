"""Build the labelled relevance evaluation set: ``benchmarks/data/relevance.json``.

    python benchmarks/relevance_set.py           # write the set and print its counts
    python benchmarks/relevance_set.py --check   # exit 1 if the committed file is not current

The set joins two sources:

* the hand-written units of ``data/relevance_handwritten.json``, validated here;
* generated units, 25 per topic, one topic per interest of the agents below, built from the
  topic vocabularies of this file (subjects, actions, objects, numbers, templates) with a
  random generator seeded per topic, so every run writes the same bytes.

Each unit carries an ``audience``, the agents that should be told about it, and a ``split``
(``train`` or ``test``) fixed by a checksum of its id. ``data/README.md`` describes the format
and how the labels were decided. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import zlib
from collections import Counter
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent / "data"
HANDWRITTEN = DATA / "relevance_handwritten.json"
OUTPUT = DATA / "relevance.json"

SEED = "relevance-set-1"
PER_TOPIC = 25
DISTRACTOR_SHARE = 0.2
TRAIN_BUCKETS = 6  # zlib.crc32(id) % 10 below this is train: 60% train, 40% test

AGENTS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("researcher", "market_researcher", ("market size", "competitors")),
    ("strategist", "strategist", ("market size", "pricing strategy")),
    ("facilities", "facilities", ("office",)),
    ("backend", "backend_engineer", ("api latency", "database migrations", "payment service")),
    ("frontend", "frontend_engineer", ("web performance", "design system", "accessibility")),
    ("sre", "site_reliability_engineer", ("outages", "alerts", "incident response")),
    ("security", "security_engineer", ("vulnerabilities", "access control", "leaked credentials")),
    ("data", "data_scientist", ("churn model", "experiment results", "data quality")),
    ("sales", "account_executive", ("enterprise deals", "renewals", "customer objections")),
    (
        "revops",
        "revenue_operations",
        ("pipeline forecast", "quota attainment", "discount approvals"),
    ),
    ("support", "support_lead", ("customer tickets", "bug reports", "onboarding problems")),
    ("ops", "operations_manager", ("vendor contracts", "budget", "hiring")),
    ("product", "product_manager", ("roadmap", "feature requests", "user feedback")),
    ("legal", "legal_counsel", ("contracts", "compliance", "gdpr")),
    ("finance", "finance_analyst", ("cloud costs", "invoices", "revenue")),
    ("recruiter", "recruiter", ("hiring pipeline", "candidates")),
)
AGENT_IDS = tuple(agent for agent, _, _ in AGENTS)

TYPES = (
    "decision",
    "contradiction",
    "human_directive",
    "constraint",
    "correction",
    "synthesis",
    "finding",
    "question",
    "intention",
    "assumption",
    "observation",
)
DOMAINS = (
    "research",
    "engineering",
    "operations",
    "sales",
    "incidents",
    "finance",
    "legal",
    "people",
    "product",
    "support",
    "facilities",
)
UNIT_KEYS = (
    "id",
    "source",
    "domain",
    "recorded_by",
    "type",
    "confidence",
    "content",
    "purpose",
    "question",
    "audience",
)
OPTIONAL_KEYS = ("purpose", "question")
MIN_WORDS, MAX_WORDS = 5, 60

# The types of generated units, weighted like the notes of a working team: mostly
# observations and findings, some decisions and syntheses, a few of the rest.
GENERATED_TYPES = (
    ["observation"] * 6
    + ["finding"] * 5
    + ["decision"] * 2
    + ["synthesis"] * 2
    + ["assumption", "intention", "correction", "constraint"]
)

# Incidental mentions of another topic's name that do not make a unit about it.
DISTRACTOR_FRAMES = (
    "Posted in the {lure} channel by mistake.",
    "Noted between two {lure} calls.",
    "Not related to {lure}.",
    "Written up while the {lure} review ran late.",
)


def _topic(domain: str, s: str, a: str, o: str, n: str, t: str, p: str) -> dict[str, Any]:
    """A topic vocabulary; each argument but ``domain`` is a ``|``-separated list."""
    return {
        "domain": domain,
        "subjects": s.split("|"),
        "actions": a.split("|"),
        "objects": o.split("|"),
        "numbers": n.split("|"),
        "templates": t.split("|"),
        "purposes": p.split("|"),
    }


# One vocabulary per interest. Templates fill {s} subject, {a} action, {o} object, {n} number.
# The vocabularies paraphrase: most units do not contain the words of the interest itself.
TOPICS: dict[str, dict[str, Any]] = {
    "market size": _topic(
        "research",
        "the SMB scheduling segment|the UK payroll software space|clinics in North America"
        "|the DACH HR software segment|hospitality employers with hourly staff",
        "is worth|grows at|adds up to|was estimated at",
        "according to the analyst report|in our bottom-up count|by 2028|in the IDC update"
        "|from the survey panel",
        "2.4B USD|11% a year|900M EUR|14,800 companies|1.3B GBP",
        "{s} {a} {n} {o}.|New sizing: {s} {a} {n} {o}.|Addressable spend check: {s} {a} {n}"
        " {o}, which changes our target count.",
        "size the opportunity|check the TAM slide|decide which segment to enter",
    ),
    "competitors": _topic(
        "research",
        "Rippling|Deputy|Personio|Gusto|Factorial|When I Work",
        "launched|cut the price of|started bundling|announced",
        "a free time-tracking tier|an automatic shift planner|a payroll add-on for Germany"
        "|a switching offer aimed at our customers|a mobile clock-in app",
        "30% off|two weeks ago|for Q2|at 4 USD per seat|this morning",
        "{s} {a} {o}, {n}.|Rival move: {s} {a} {o} ({n}).|Heard on a call: {s} {a} {o} {n}.",
        "keep the comparison sheet current|track rival moves|brief the team on rivals",
    ),
    "pricing strategy": _topic(
        "research",
        "the Team plan|the Pro tier|per-location pricing|the annual prepay option|the Starter plan",
        "should move to|tested well at|could be repackaged at|loses money below",
        "per seat per month|for accounts under 50 staff|with a 12-month price lock"
        "|if we fold in time tracking|for new logos only",
        "15 USD|9 EUR|a 20% uplift|2 USD more|6 USD",
        "{s} {a} {n} {o}.|Packaging idea: {s} {a} {n} {o}.|Price point note: {s} {a} {n}"
        " {o}; the survey supports it.",
        "settle next year's price list|test a new price point|simplify the packaging",
    ),
    "office": _topic(
        "facilities",
        "the third-floor kitchen|the big meeting room|the front door badge reader"
        "|the heating on floor 2|the bike storage",
        "is broken again|needs repair|was cleaned out|stopped working",
        "since Monday|after the weekend|according to reception|for the second time this month"
        "|since the renovation",
        "since 8:00|for two days|again today|for a week|since 10 am",
        "{s} {a} {o}, {n}.|Premises note: {s} {a} {o}.|Could someone look at it: {s} {a} {n}.",
        "get it repaired|keep the floor usable|warn the people who come in",
    ),
    "api latency": _topic(
        "engineering",
        "the checkout endpoint|GET /v2/shifts|the search API|the login call|POST /timesheets",
        "now answers in|slowed to|takes|climbed to",
        "at p99|at the median|for the largest accounts|during the morning peak"
        "|after the last deploy",
        "850 ms|1.4 s|620 ms|2.3 s|950 ms",
        "{s} {a} {n} {o}.|Response times: {s} {a} {n} {o}, up from 180 ms.|Clients wait"
        " longer: {s} {a} {n} {o}.",
        "find what slowed the endpoint|keep response times in budget|speed up the API",
    ),
    "database migrations": _topic(
        "engineering",
        "migration 0143|the schema change for multi-currency|the orders table rewrite"
        "|the new index on shifts|the column rename in payments",
        "locked the table for|needs a backfill of|will run for|was rolled back after",
        "in production|on the primary|during the Sunday window|on the replica first|in staging",
        "9 minutes|22M rows|40 minutes|3 hours|180M rows",
        "{s} {a} {n} {o}.|Schema work: {s} {a} {n} {o}.|Heads up: {s} {a} {n} {o}.",
        "check whether the rollout is safe|plan the schema change|avoid a long lock",
    ),
    "payment service": _topic(
        "engineering",
        "Stripe webhooks|card charges|the billing worker|Adyen refunds|payment retries",
        "failed for|were delayed by|double-processed|timed out on",
        "for Brazilian cards|after the SDK upgrade|in the EU region|for annual plans"
        "|during checkout",
        "37 charges|2% of transactions|45 minutes|120 customers|18,400 USD",
        "{s} {a} {n} {o}.|Charges problem: {s} {a} {n} {o}.|From the billing logs: {s} {a}"
        " {n} {o}.",
        "keep charges flowing|reconcile failed charges|fix the billing worker",
    ),
    "web performance": _topic(
        "engineering",
        "the pricing page|the signup form|the schedule view|the landing page|the dashboard",
        "renders its main content after|becomes interactive after|ships a bundle of"
        "|paints first after",
        "on a mid-range phone|on 3G|in the field data|in Lighthouse|for first-time visitors",
        "4.2 s|480 KB|3.1 s|6 s|1.9 s",
        "{s} {a} {n} {o}.|Page speed: {s} {a} {n} {o}.|Browser timings: {s} {a} {n} {o}.",
        "make the page load faster|shrink the bundle|improve page speed",
    ),
    "design system": _topic(
        "engineering",
        "the shared component library|the button component|the colour token set"
        "|the date picker|the spacing scale",
        "gets a new version|replaces|was renamed in|is out of sync with",
        "the Figma kit|the three custom variants|the mobile app|the settings pages"
        "|the reports module",
        "v3|version 2.4|this sprint|by end of quarter|on Thursday",
        "{s} {a} {o}, {n}.|UI kit update: {s} {a} {o} ({n}).|Components: {s} {a} {o} {n}.",
        "keep the UI consistent|roll out the new components|retire custom widgets",
    ),
    "accessibility": _topic(
        "engineering",
        "the timesheet form|the schedule grid|the signup flow|the navigation menu"
        "|the colour palette",
        "fails|cannot be used with|is missing labels for|breaks under",
        "screen readers|keyboard-only use|WCAG 2.1 AA|VoiceOver|the 4.5:1 contrast rule",
        "23 styles|for blind users|in the audit|on 12 pages|since the redesign",
        "{s} {a} {o}, {n}.|Audit result: {s} {a} {o} ({n}).|Reported by a user: {s} {a} {o}.",
        "meet WCAG AA|fix the audit findings|make the app usable for everyone",
    ),
    "outages": _topic(
        "incidents",
        "the web app|login|the mobile API|clock-in|the EU cluster",
        "was down for|returned 502s for|was unreachable for|failed completely for",
        "all customers|users in Europe|every mobile user|two regions|most accounts",
        "18 minutes|40 minutes|2 hours|25 minutes|an hour",
        "{s} {a} {n} for {o}.|Service down: {s} {a} {n} for {o}.|Customers could not work:"
        " {s} {a} {n} for {o}.",
        "restore the service|report the downtime|get the app back up",
    ),
    "alerts": _topic(
        "incidents",
        "the disk usage page|the error-rate monitor|the queue-age alarm|the CPU alarm on db-2"
        "|the heartbeat check",
        "fired|paged on-call|went off|stayed silent",
        "without a real problem|at 3 am|during the deploy|while the service was down"
        "|after the threshold change",
        "41 times this week|twice tonight|12 times|for 3 nights|every hour",
        "{s} {a} {n} {o}.|PagerDuty: {s} {a} {n} {o}.|Monitoring noise: {s} {a} {n} {o}.",
        "tune the paging rules|cut the noise at night|make sure pages reach someone",
    ),
    "incident response": _topic(
        "incidents",
        "the SEV-2 for exports|the login incident|the payment outage|last night's SEV-1"
        "|the DNS failure",
        "has a postmortem due|needs an incident commander|was closed after|gets a review in",
        "the war room|the status page update|the on-call handover|the runbook|the timeline",
        "5 days|2 hours|30 minutes|this week|tomorrow",
        "{s} {a} {n}; see {o}.|On-call: {s} {a} {n}, with {o}.|Coordination: {s} {a} {n};"
        " owner updates {o}.",
        "coordinate the response|close out the postmortem|fix the on-call process",
    ),
    "vulnerabilities": _topic(
        "engineering",
        "lodash in the admin app|OpenSSH on the bastion|the export endpoint|the image parser"
        "|an old OpenSSL",
        "is affected by|was flagged with|exposes|needs a patch for",
        "a remote code execution CVE|prototype pollution|a tenant data leak|a path traversal"
        "|a known exploit",
        "CVSS 7.4|CVSS 9.8|severity high|since Tuesday|in the pen test",
        "{s} {a} {o}, {n}.|Scanner result: {s} {a} {o} ({n}).|Patch needed: {s} {a} {o} ({n}).",
        "get the hole patched|triage the scanner results|close the pen test findings",
    ),
    "access control": _topic(
        "engineering",
        "a former contractor|the support role|manager accounts|the CI service user"
        "|the finance team",
        "still has|was given|should lose|now requires approval for",
        "admin rights in Stripe|write access to production|access to all locations"
        "|the billing console|SSH to the bastion",
        "since June|for 3 months|after offboarding|by Friday|since the reorg",
        "{s} {a} {o} {n}.|Permissions review: {s} {a} {o} {n}.|Role check: {s} {a} {o}, {n}.",
        "tighten who can do what|run the access review|remove stale permissions",
    ),
    "leaked credentials": _topic(
        "incidents",
        "a SendGrid key|an AWS access key|a customer's admin password|a database password"
        "|a Slack bot token",
        "was pushed to|showed up in|was pasted into|was exposed in",
        "a public gist|the mobile repo|a support ticket|a screenshot on Twitter|the CI logs",
        "2 hours ago|since Sunday|for 11 days|this morning|last week",
        "{s} {a} {o} {n}; rotate it.|Secret exposed: {s} {a} {o} {n}.|GitGuardian: {s} {a}"
        " {o} {n}.",
        "get the secret revoked|contain the exposure|rotate what was exposed",
    ),
    "churn model": _topic(
        "research",
        "the retention risk score|the model that predicts cancellations|the risk features"
        "|the cancellation predictor|the at-risk account list",
        "was retrained on|dropped in AUC to|now flags|misses",
        "the Q3 cohort|accounts with few admins|seat downgrades|the holdout set"
        "|enterprise accounts",
        "0.74|32 accounts|9 of 14 accounts|4x the risk|0.81",
        "{s} {a} {n}, {o}.|Leaver prediction: {s} {a} {n} on {o}.|Model update: {s} {a} {n}"
        " for {o}.",
        "predict which accounts leave|refresh the risk scores|explain the model drop",
    ),
    "experiment results": _topic(
        "research",
        "the onboarding checklist test|the pricing page A/B test|the 21-day trial variant"
        "|the new invite flow|the annual plan banner",
        "lifted|did not move|lowered|raised",
        "week-one activation|trial conversion|invites per admin|paid upgrades|seven-day retention",
        "by 2.1 points|from 31% to 37%|by 0.4 points, not significant|by 6%|from 1.8 to 2.6",
        "{s} {a} {o} {n}.|Readout: {s} {a} {o} {n}.|A/B result: {s} {a} {o} {n} (p=0.01).",
        "decide whether to ship the variant|read out the test|learn what moved conversion",
    ),
    "data quality": _topic(
        "research",
        "the events table|the CRM account list|the revenue dashboard|the warehouse load"
        "|the signup funnel data",
        "has|shows|is missing|contains",
        "null account ids|duplicate companies|double-counted upgrades|a weekend of rows"
        "|test accounts mixed with real ones",
        "8% of rows|1,900 duplicates|since March 4|4% too much|3 days",
        "{s} {a} {o}: {n}.|Bad numbers: {s} {a} {o} ({n}).|Warehouse check: {s} {a} {o}, {n}.",
        "trust the numbers again|fix the broken rows|clean the warehouse",
    ),
    "enterprise deals": _topic(
        "sales",
        "Globex|Umbrella|Stark Industries|Initech|Wayne Enterprises",
        "moved to procurement for|chose us for|asked for a proposal for|is close to signing for",
        "a three-year term|all their locations|the whole group|a company-wide rollout"
        "|their US and EU staff",
        "2,300 seats|4,000 seats|380k USD ACV|900 seats|1,200 seats",
        "{s} {a} {n}, {o}.|Big account: {s} {a} {n} on {o}.|Large opportunity: {s} {a} {n}, {o}.",
        "close the big accounts|move the large opportunity forward|win the group contract",
    ),
    "renewals": _topic(
        "sales",
        "Hooli|Acme|Oscorp|the Wayne account|Cyberdyne",
        "comes up for renewal in|may not extend in|wants fewer seats from|extended early in",
        "March|January|Q2|the same week as two others|next month",
        "at 40% fewer seats|for 640k USD ARR|for two more years|at the same price|at 15% less",
        "{s} {a} {o} {n}.|Contract end: {s} {a} {o}, {n}.|Up for extension: {s} {a} {o} {n}.",
        "keep the account|prepare the renewal call|protect the ARR",
    ),
    "customer objections": _topic(
        "sales",
        "prospects in healthcare|the Stark buyer|three prospects this week|the CFO at Oscorp"
        "|retail buyers",
        "pushed back on|hesitated because of|keep raising|are worried about",
        "EU data hosting|the missing DATEV integration|the per-seat price|our SSO setup"
        "|the length of the contract",
        "twice|on every call|this week|in the final meeting|again",
        "{s} {a} {o} {n}.|Pushback: {s} {a} {o}, {n}.|Blocking the deal: {s} {a} {o} {n}.",
        "answer what buyers push back on|prepare a rebuttal|unblock stalled deals",
    ),
    "pipeline forecast": _topic(
        "sales",
        "the Q1 commit|the Q4 number|best case for the quarter|the weighted opportunity total"
        "|coverage for next quarter",
        "dropped to|stands at|was revised to|rose to",
        "after Initech slipped|against a 3x target|with two big deals out|at current win rates"
        "|in Salesforce",
        "1.2M USD|2.1x|78% of target|3.4M USD|1.5M USD",
        "{s} {a} {n} {o}.|Forecast call: {s} {a} {n} {o}.|Projection: {s} {a} {n} {o}.",
        "keep the projection honest|prepare the forecast call|update the commit",
    ),
    "quota attainment": _topic(
        "sales",
        "the AE team|the new reps|the EMEA team|my own number|the mid-market team",
        "closed the quarter at|ramped to|reached|is tracking at",
        "of target|of plan|of the annual number|against last year's 92%|of the H1 goal",
        "87%|74%|112%|61%|95%",
        "{s} {a} {n} {o}.|Attainment: {s} {a} {n} {o}.|Against target: {s} {a} {n} {o}.",
        "explain the attainment|review rep performance|set next year's targets",
    ),
    "discount approvals": _topic(
        "sales",
        "the Stark proposal|a 900-seat deal|the Wayne renewal|a three-year contract"
        "|the Globex order",
        "needs sign-off for|asks for|was approved at|is waiting for approval of",
        "off list price|off the first year|off the renewal|with a price lock|above policy",
        "28%|35%|20%|15%|30%",
        "{s} {a} {n} {o}.|Price concession: {s} {a} {n} {o}.|Deal desk: {s} {a} {n} {o}.",
        "get the concession signed off|stay within policy|win on price",
    ),
    "customer tickets": _topic(
        "support",
        "the support queue|tickets about exports|first response time|the backlog"
        "|requests from paid plans",
        "tripled to|grew to|fell to|reached",
        "since 9 am|this week|after the release|over the weekend|in October",
        "340|212|60 a day|4 hours|1,100 open",
        "{s} {a} {n} {o}.|Help desk: {s} {a} {n} {o}.|Zendesk numbers: {s} {a} {n} {o}.",
        "keep the queue under control|staff the help desk|explain the ticket spike",
    ),
    "bug reports": _topic(
        "support",
        "the week view|shift times in Arizona|the CSV importer|the time-off balance"
        "|the push notifications",
        "shows|is off by|crashes on|duplicates",
        "Sunday twice|one hour|files with a BOM|half days|every reminder",
        "for 14 customers|since the release|in ticket 48890|on Android 14|reproduced twice",
        "Defect: {s} {a} {o} {n}.|Reproduced: {s} {a} {o} {n}.|Customers report that {s}"
        " {a} {o} {n}.",
        "get the defect fixed|reproduce the reported problem|track the defect",
    ),
    "onboarding problems": _topic(
        "support",
        "new admins|trial accounts|the Globex rollout|first-time managers|new customers",
        "get stuck at|abandon|need help with|give up on",
        "the CSV import step|inviting employees|adding locations|the first schedule"
        "|connecting payroll",
        "44% of trials|after two days|1,200 employees waiting|within a week|3 of 5",
        "{s} {a} {o}: {n}.|Setup trouble: {s} {a} {o} ({n}).|First weeks: {s} {a} {o}, {n}.",
        "help new customers get started|fix the setup flow|reduce early drop-off",
    ),
    "vendor contracts": _topic(
        "operations",
        "the Datadog order form|the Zendesk agreement|the cleaning company|the Slack renewal"
        "|the PagerDuty quote",
        "auto-renews|raises prices|ends|requires notice",
        "for three years|at the next term|unless we cancel|with a 5% cap|under the framework deal",
        "on March 1|by 18%|in 60 days|on the 30th|by 22%",
        "Supplier terms: {s} {a} {n} {o}.|{s} {a} {n} {o}.|Procurement: {s} {a} {n} {o}.",
        "avoid an unwanted renewal|negotiate supplier terms|review the supplier agreement",
    ),
    "budget": _topic(
        "operations",
        "operations spend|the travel line|the offsite|software spend|the facilities line",
        "is over plan by|has used|came in under by|needs another",
        "for the year|this quarter|against the approved amount|by September|so far",
        "40%|82%|12%|8,000 euros|38k euros",
        "{s} {a} {n} {o}.|Spend check: {s} {a} {n} {o}.|Against the plan: {s} {a} {n} {o}.",
        "keep spending within plan|explain the overrun|reallocate money",
    ),
    "hiring": _topic(
        "people",
        "engineering|the sales team|operations|the support team|finance",
        "gets approval for|asked for|must wait for|loses the funding for",
        "new headcount|two more SREs|a Lisbon analyst|a replacement lead|backfills",
        "in Q2|3 roles|until the Q1 numbers|by March|next quarter",
        "Headcount: {s} {a} {o} {n}.|{s} {a} {o}, {n}.|Staffing plan: {s} {a} {o} {n}.",
        "plan headcount|decide which roles to open|keep staffing within plan",
    ),
    "roadmap": _topic(
        "product",
        "shift swapping|the DATEV export|offline clock-in|reporting v2|the France launch",
        "moves to|is committed for|slips to|is planned for",
        "after the board review|in the new plan|behind payroll in Germany|as priority one"
        "|pending design",
        "Q2|Q3|2026|next quarter|this half",
        "{s} {a} {n} {o}.|Plan change: {s} {a} {n} {o}.|Priorities: {s} {a} {n} {o}.",
        "publish the priorities|set the plan for next quarter|sequence the launches",
    ),
    "feature requests": _topic(
        "product",
        "customers|three prospects|the Globex team|Pro plan users|eight accounts",
        "asked for|keep requesting|want|would pay for",
        "bulk editing of shifts|a Microsoft Teams integration|labour cost per shift"
        "|an export to DATEV|offline clock-in",
        "this week|212 times|in writing|again|on every call",
        "{s} {a} {o} {n}.|Wish list: {s} {a} {o}, {n}.|Asked for: {s} {a} {o} {n}.",
        "collect what customers ask for|decide what to build next|rank the asks",
    ),
    "user feedback": _topic(
        "product",
        "NPS comments|interviewed managers|app store reviews|survey answers|beta testers",
        "praise|complain about|are split on|keep mentioning",
        "the week view resetting|the mobile app|the new navigation|the time-off screen"
        "|the reporting page",
        "this month|in 40 reviews|in the survey|after the release|since June",
        "{s} {a} {o} {n}.|What users say: {s} {a} {o} {n}.|Voice of the user: {s} {a} {o} {n}.",
        "understand what users think|pass on what users say|decide what to fix",
    ),
    "contracts": _topic(
        "legal",
        "Initech's redlines|Stark's master agreement|the new order form|Umbrella's MSA"
        "|the Globex data annex",
        "ask for|remove|add|cap",
        "uncapped liability|termination for convenience|a 12-month fee cap|indemnity|a price lock",
        "on 90 days' notice|by Friday|in section 9|for two years|in the annex",
        "{s} {a} {o} {n}.|Redline review: {s} {a} {o} {n}.|Terms: {s} {a} {o} {n}.",
        "protect our terms|review the agreement|agree the redlines",
    ),
    "compliance": _topic(
        "legal",
        "the SOC 2 audit|the ISO 27001 review|the accessibility law|the quarterly access review"
        "|the vendor risk assessment",
        "requires|starts|found gaps in|asks for evidence of",
        "48 controls|our change process|the backup tests|the security training|the access reviews",
        "on April 1|in June 2025|this quarter|by the auditors|for 12 months",
        "{s} {a} {o} {n}.|Audit: {s} {a} {o} {n}.|Certification: {s} {a} {o} {n}.",
        "pass the audit|collect the evidence|close the audit gaps",
    ),
    "gdpr": _topic(
        "legal",
        "an erasure request from France|raw IP addresses of EU users|copies of EU customer data"
        "|the processing agreement with Personio|GPS locations of field workers",
        "falls under EU privacy law,|was flagged by the DPO,|needs a lawful basis,"
        "|must be dealt with,",
        "under article 17|with no retention period|for backups in the US|since the DPA expired"
        "|with no consent on record",
        "30 days|3 years|72 hours|since June|for analytics",
        "{s} {a} {o} ({n}).|Privacy: {s} {a} {o}, {n}.|Personal data: {s} {a} {o} ({n}).",
        "stay within EU privacy law|answer the data subject|close a privacy gap",
    ),
    "cloud costs": _topic(
        "finance",
        "the AWS bill|BigQuery spend|NAT gateway traffic|the warehouse cluster|S3 storage",
        "rose to|doubled to|could drop by|came to",
        "this month|in November|at night|since the log shipper|with tiering",
        "84k USD|22k USD|4,000 USD a month|3k USD a month|61k USD",
        "{s} {a} {n} {o}.|Hosting spend: {s} {a} {n} {o}.|Infra bill: {s} {a} {n} {o}.",
        "cut the hosting bill|explain the bill|find savings in infrastructure",
    ),
    "invoices": _topic(
        "finance",
        "Hooli's Q3 bill|INV-2291|the Globex bill|the Lumen bill|the Oscorp annual bill",
        "is overdue by|was sent twice, worth|is short by|was paid late by",
        "the PO number was missing|their AP team asked for a copy|it goes to the Dutch entity"
        " next time|a reminder went out|the amount does not match the order",
        "62 days|14,300 euros|3 weeks|1,200 euros|18 days",
        "{s} {a} {n}; {o}.|Billing: {s} {a} {n} ({o}).|Accounts receivable: {s} {a} {n}, {o}.",
        "collect what we are owed|avoid paying twice|fix the billing details",
    ),
    "revenue": _topic(
        "finance",
        "October bookings|new ARR|net retention|recurring revenue|the quarter's income",
        "came in at|beat the plan by|fell short by|grew by",
        "after the price change|from closed-won deals|against plan|year over year|in the ledger",
        "1.9M USD|12%|4%|108%|+4%",
        "{s} {a} {n} {o}.|Top line: {s} {a} {n} {o}.|Month close: {s} {a} {n} {o}.",
        "report the numbers|close the month|explain the top line",
    ),
    "hiring pipeline": _topic(
        "people",
        "the senior backend search|the SRE openings|the Lisbon analyst role|the AE backfills"
        "|the design lead search",
        "has|is stuck with|needs|moved forward with",
        "onsite interviews|offers out|applicants in screening|a second interviewer"
        "|agency submissions",
        "3|12|40|2 finalists|this week",
        "{s} {a} {n} {o}.|Recruiting: {s} {a} {n} {o}.|Search update: {s} {a} {n} {o}.",
        "fill the open roles|move the searches along|plan interviews",
    ),
    "candidates": _topic(
        "people",
        "the Berlin backend applicant|Thursday's SRE finalist|the data science applicant"
        "|the AE from Lisbon|the design lead finalist",
        "did well in|asked about|withdrew after|accepted",
        "the system design round|a relocation bonus|the take-home task|our offer"
        "|the final interview",
        "yesterday|5,000 euros|after 3 rounds|on Friday|this morning",
        "{s} {a} {o} {n}.|Interview note: {s} {a} {o}, {n}.|Applicant update: {s} {a} {o} {n}.",
        "give my interview verdict|close the applicant|keep the finalist warm",
    ),
}


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def agents_json() -> list[dict[str, Any]]:
    return [
        {"id": agent, "role": role, "interests": list(interests)}
        for agent, role, interests in AGENTS
    ]


def audience_of(topic: str) -> list[str]:
    """Every agent that has the topic among its interests, in table order."""
    return [agent for agent, _, interests in AGENTS if topic in interests]


def generated_units() -> list[dict[str, Any]]:
    """``PER_TOPIC`` units per topic, from its vocabulary, each for the topic's audience.

    Each topic has its own generator, seeded by its name, so editing one vocabulary leaves
    the other topics' units as they were. The recorder is never one of the topic's audience,
    so its role says nothing about the unit. A minority of units carry an incidental mention
    of another topic's name (a distractor): their label stays that of their own topic."""
    names = list(TOPICS)
    units = []
    for topic, words in TOPICS.items():
        rng = random.Random(f"{SEED}:{topic}")
        audience = audience_of(topic)
        outsiders = [agent for agent in AGENT_IDS if agent not in audience]
        others = [name for name in names if name != topic]
        seen: set[str] = set()
        for number in range(1, PER_TOPIC + 1):
            for _attempt in range(1000):
                content = rng.choice(words["templates"]).format(
                    s=rng.choice(words["subjects"]),
                    a=rng.choice(words["actions"]),
                    o=rng.choice(words["objects"]),
                    n=rng.choice(words["numbers"]),
                )
                content = content[0].upper() + content[1:]
                if rng.random() < DISTRACTOR_SHARE:
                    frame = rng.choice(DISTRACTOR_FRAMES)
                    content += " " + frame.format(lure=rng.choice(others))
                if content not in seen:
                    break
            else:
                raise SystemExit(f"topic {topic!r}: too few distinct units; widen its vocabulary")
            seen.add(content)
            units.append(
                {
                    "id": f"g-{slug(topic)}-{number:02d}",
                    "source": "generated",
                    "domain": words["domain"],
                    "recorded_by": rng.choice(outsiders),
                    "type": rng.choice(GENERATED_TYPES),
                    "confidence": round(rng.uniform(0.4, 0.95), 2),
                    "content": content,
                    "purpose": rng.choice(words["purposes"]) if rng.random() < 0.5 else None,
                    "question": None,
                    "audience": audience,
                }
            )
    return units


def _check_unit(unit: Any, where: str, errors: list[str]) -> None:
    if not isinstance(unit, dict):
        errors.append(f"{where}: a unit must be an object")
        return
    missing = [key for key in UNIT_KEYS if key not in unit and key not in OPTIONAL_KEYS]
    unknown = sorted(set(unit) - set(UNIT_KEYS))
    if missing:
        errors.append(f"{where}: missing {', '.join(missing)}")
    if unknown:
        errors.append(f"{where}: unknown field(s) {', '.join(unknown)}")
    if unit.get("source") != "handwritten":
        errors.append(f"{where}: source must be 'handwritten', not {unit.get('source')!r}")
    if unit.get("domain") not in DOMAINS:
        errors.append(f"{where}: unknown domain {unit.get('domain')!r}")
    recorder = unit.get("recorded_by")
    if recorder not in AGENT_IDS:
        errors.append(f"{where}: recorded_by is an unknown agent id {recorder!r}")
    if unit.get("type") not in TYPES:
        errors.append(f"{where}: type {unit.get('type')!r} is not one of {', '.join(TYPES)}")
    confidence = unit.get("confidence")
    if (
        isinstance(confidence, bool)
        or not isinstance(confidence, int | float)
        or not 0 <= confidence <= 1
    ):
        errors.append(f"{where}: confidence must be a number from 0 to 1, not {confidence!r}")
    content = unit.get("content")
    if not isinstance(content, str) or not content.strip():
        errors.append(f"{where}: content is empty or not a string")
    elif not MIN_WORDS <= len(content.split()) <= MAX_WORDS:
        words = len(content.split())
        errors.append(f"{where}: content has {words} words, not {MIN_WORDS} to {MAX_WORDS}")
    for key in OPTIONAL_KEYS:
        value = unit.get(key)
        if value is not None and (not isinstance(value, str) or not value.strip()):
            errors.append(f"{where}: {key} must be null or a non-empty string, not {value!r}")
    audience = unit.get("audience")
    if not isinstance(audience, list) or not all(isinstance(a, str) for a in audience):
        errors.append(f"{where}: audience must be a list of agent ids")
        return
    for agent in audience:
        if agent not in AGENT_IDS:
            errors.append(f"{where}: audience has an unknown agent id {agent!r}")
    if len(set(audience)) != len(audience):
        errors.append(f"{where}: audience lists an agent twice")
    if recorder in audience:
        errors.append(f"{where}: the recorder {recorder!r} is in its own unit's audience")


def load_handwritten(path: Path = HANDWRITTEN) -> list[dict[str, Any]]:
    """The hand-written units of ``path``, validated; exits with every problem found."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise SystemExit(f"{path.name}: cannot read it: {error}") from None
    if not isinstance(document, dict) or not isinstance(document.get("units"), list):
        raise SystemExit(f"{path.name}: expected an object with a list of 'units'")
    errors = []
    if document.get("agents") != agents_json():
        errors.append(f"{path.name}: 'agents' differs from the table in relevance_set.py")
    seen: set[str] = set()
    for index, unit in enumerate(document["units"]):
        uid = unit.get("id") if isinstance(unit, dict) else None
        where = f"{path.name}: unit {uid!r}" if isinstance(uid, str) else f"unit #{index}"
        if not isinstance(uid, str) or not re.fullmatch(r"h\d{3,}", uid):
            errors.append(f"{where}: id must be 'h' and three or more digits")
        elif uid in seen:
            errors.append(f"{where}: duplicate id")
        else:
            seen.add(uid)
        _check_unit(unit, where, errors)
    if errors:
        raise SystemExit("invalid hand-written units:\n  " + "\n  ".join(errors))
    return [{key: unit.get(key) for key in UNIT_KEYS} for unit in document["units"]]


def split_of(uid: str) -> str:
    return "train" if zlib.crc32(uid.encode()) % 10 < TRAIN_BUCKETS else "test"


def build(path: Path = HANDWRITTEN) -> dict[str, Any]:
    """The whole set: the agents, then hand-written and generated units, each with a split."""
    units = load_handwritten(path) + generated_units()
    return {"agents": agents_json(), "units": [{**u, "split": split_of(u["id"])} for u in units]}


def render(document: dict[str, Any]) -> str:
    return json.dumps(document, sort_keys=True, indent=1, ensure_ascii=False) + "\n"


def counts(document: dict[str, Any]) -> str:
    units = document["units"]
    lines = [f"{len(units)} units, {len(document['agents'])} agents"]
    for field in ("source", "split", "domain"):
        tally = Counter(unit[field] for unit in units)
        lines.append(f"by {field}: " + ", ".join(f"{k} {v}" for k, v in sorted(tally.items())))
    for split in ("train", "test", None):
        chosen = [unit for unit in units if split is None or unit["split"] == split]
        pairs = sum(len(AGENT_IDS) - 1 for _ in chosen)
        relevant = sum(len(unit["audience"]) for unit in chosen)
        lines.append(
            f"pairs ({split or 'all'}): {relevant} relevant, {pairs - relevant} not relevant"
            " (recorder pairs excluded)"
        )
    nobody = sum(1 for unit in units if not unit["audience"])
    several = sum(1 for unit in units if len(unit["audience"]) > 1)
    lines.append(f"units for nobody: {nobody}, for several agents: {several}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--check",
        action="store_true",
        help="exit 1 if the committed relevance.json differs from what would be written",
    )
    args = parser.parse_args()
    text = render(build())
    if args.check:
        current = OUTPUT.read_text(encoding="utf-8") if OUTPUT.exists() else None
        if current != text:
            print(
                f"{OUTPUT.name} is not current: run python benchmarks/relevance_set.py",
                file=sys.stderr,
            )
            raise SystemExit(1)
        print(f"{OUTPUT.name} is current")
        return
    OUTPUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUTPUT.relative_to(DATA.parent.parent)}")
    print(counts(json.loads(text)))


if __name__ == "__main__":
    main()
