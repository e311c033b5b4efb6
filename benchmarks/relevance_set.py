"""Build the labelled relevance evaluation set: ``benchmarks/data/relevance.json``.

    python benchmarks/relevance_set.py           # write the set and print its counts
    python benchmarks/relevance_set.py --check   # exit 1 if the committed file is not current

The set joins two sources:

* the hand-written units of ``data/relevance_handwritten.json``, validated here;
* generated units, 25 per topic, one topic per interest of the agents below, built from the
  topic vocabularies of this file (subjects, objects, templates with choices) with a
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

# A template fills {s} with one of its topic's subjects, {o} with one of its objects, and each
# [x; y; z] with one of its options, innermost brackets first (options may nest). Options are
# written to fit their own template, so every fill reads as a sentence.
CHOICE = re.compile(r"\[([^\[\]]*)\]")
# A subject, object, option or template may end in tags, "@finance @support": a unit whose
# text holds that choice is also for those agents (a secondary audience, see secondary_of).
TAG = re.compile(r" ?@([a-z]+)")


def _topic(domain: str, s: str, o: str, t: str, p: str, also: str = "") -> dict[str, Any]:
    """A topic vocabulary: ``s`` subjects, ``o`` objects, ``t`` templates and ``p`` purposes,
    each a ``|``-separated list (``s`` and ``o`` may be empty when no template uses them).
    ``also`` names, space-separated, the agents that should be told about every unit of the
    topic besides the agents that have it among their interests; a choice's ``@agent`` tags
    add agents for the units that make that choice only."""
    return {
        "domain": domain,
        "subjects": s.split("|"),
        "objects": o.split("|"),
        "templates": t.split("|"),
        "purposes": p.split("|"),
        "also": also.split(),
    }


# One vocabulary per interest. The vocabularies paraphrase: most units do not contain the words
# of the interest itself. Secondary audiences (``also`` and ``@`` tags) follow the rule of
# data/README.md: the other agents a competent colleague would tell, decided by what the unit
# is about and kept strict (a production credential leak is for sre as well as security; an
# incident is not for everyone).
TOPICS: dict[str, dict[str, Any]] = {
    "market size": _topic(
        "research",
        "the SMB scheduling segment|the UK payroll software market|the North American clinic"
        " segment|the DACH HR software market|the hospitality segment",
        "",
        "{s} is worth [2.4B USD; 900M EUR; 1.3B GBP] a year [according to the analyst report;"
        " in the IDC update; in our bottom-up count].|New sizing: {s} grows at [11%; 7%; 14%] a"
        " year [to 2028; in the IDC update; according to the analyst report].|Bottom-up count:"
        " {s} holds [14,800; 9,200; 31,000] companies [with 20 to 250 staff; that fit our target"
        " profile], which changes our target count.|Addressable spend check: {s} [adds up to;"
        " comes to] [2.4B USD; 900M EUR; 1.3B GBP] a year [from the survey panel; by our own"
        " count].",
        "size the opportunity|check the TAM slide|decide which segment to enter",
    ),
    "competitors": _topic(
        "research",
        "Rippling|Deputy|Personio|Gusto|Factorial|When I Work",
        "",
        "Rival move: {s} [launched; announced] [an automatic shift planner; a payroll add-on for"
        " Germany; a mobile clock-in app; a labour cost report] [this morning; two weeks ago;"
        " for Q2]. @product|{s} cut its per-seat price [by 30%; to 4 USD; for companies under 50"
        " staff] [this morning; two weeks ago; from Q2]. @strategist|Heard on a call: {s} [offers;"
        " is advertising] [a 30% first-year discount; three free months] to anyone switching"
        " from us. @strategist @sales|{s} now bundles [time tracking; payroll; shift planning]"
        " into its base plan at no extra cost. @strategist",
        "keep the comparison sheet current|track rival moves|brief the team on rivals",
    ),
    "pricing strategy": _topic(
        "research",
        "the Team plan|the Pro tier|the Starter plan|the Business plan",
        "",
        "Packaging idea: {s} [could move to; could be repackaged at] [15; 9; 12; 6] USD per seat"
        " per month [if we fold in time tracking; for new customers only; for accounts under 50"
        " staff].|Price test: {s} at [2; 3] USD more per seat [converted as well as the current"
        " price; lost 8% of trials; tested well with accounts under 50 staff].|Survey readout:"
        " buyers would pay [20% more; 2 USD more] for {s} [with a 12-month price lock; if it"
        " included time tracking].|Margin check: {s} loses money below [6; 9] USD per seat [once"
        " support costs are included; for accounts under 20 staff].|Decided: {s} moves to [15;"
        " 12; 9] USD per seat [on February 1; from next quarter], and current customers keep"
        " their price for twelve months. @sales @revops @finance",
        "settle next year's price list|test a new price point|simplify the packaging",
    ),
    "office": _topic(
        "facilities",
        "the dishwasher in the third-floor kitchen|the screen in the big meeting room|the"
        " heating on floor 2|the front door badge reader|the coffee machine|the lift to the"
        " fourth floor",
        "",
        "{s} [stopped working; broke down] [on Monday; after the weekend; for the second time"
        " this month].|{s} needs a repair: it [has not worked; keeps failing] [since Monday; for"
        " two days].|Premises note: {s} [has been out of order; has not"
        " worked] [for two days; since 8:00; for a week], says reception.|Could someone look at"
        " {s}? It [stopped working; broke again] [this morning; after the weekend].",
        "get it repaired|keep the floor usable|warn the people who come in",
    ),
    "api latency": _topic(
        "engineering",
        "the checkout endpoint|GET /v2/shifts|the search API|the login call|POST /timesheets",
        "",
        "{s} [now answers in; slowed to; takes] [850 ms; 1.4 s; 620 ms; 2.3 s] [at p99; at the"
        " median; for the largest accounts; during the morning peak; after the last deploy]."
        "|Response times: {s} is at [850 ms; 1.4 s; 2.3 s] [at p99; for the largest accounts],"
        " up from 180 ms.|Clients wait longer: {s} [takes; climbed to] [950 ms; 1.4 s] [during"
        " the morning peak; after the last deploy].",
        "find what slowed the endpoint|keep response times in budget|speed up the API",
    ),
    "database migrations": _topic(
        "engineering",
        "migration 0143|the schema change for multi-currency|the orders table rewrite|the new"
        " index on shifts|the column rename in payments @data",
        "",
        "Heads up: {s} locked the table for [9; 22; 40] minutes [in production; on the primary]"
        " [on Sunday; last night]. @sre|Schema work: {s} needs a backfill of [22M; 180M] rows,"
        " [about 3 hours; overnight in batches].|{s} [will run for; should take] [40 minutes; 3"
        " hours] [during the Sunday window; on the replica first].|{s} was rolled back after [9;"
        " 40] minutes [in staging; in production].",
        "check whether the rollout is safe|plan the schema change|avoid a long lock",
    ),
    "payment service": _topic(
        "engineering",
        "",
        "",
        "Charges problem: [37; 120; 64] card charges failed [for Brazilian cards; after the SDK"
        " upgrade; in the EU region] [this morning; overnight]. @finance|From the billing logs:"
        " [37; 120; 5] customers were charged twice for [their annual plan; their monthly"
        " invoice] [after the SDK upgrade; during checkout]. @finance @support|Adyen refunds"
        " [were delayed by two days; failed] for [18; 45] customers [in the EU region; after the"
        " SDK upgrade]. @finance @support|Stripe webhooks [were delayed by; backed up for] [45"
        " minutes; 2 hours] [after the SDK upgrade; during the morning peak], so subscriptions"
        " started late.|The billing worker [timed out on; skipped] [2%; 5%] of payment retries"
        " [after the SDK upgrade; in the EU region]. @finance",
        "keep charges flowing|reconcile failed charges|fix the billing worker",
    ),
    "web performance": _topic(
        "engineering",
        "the pricing page|the signup form|the schedule view|the landing page|the dashboard",
        "",
        "Page speed: {s} [renders its main content after; becomes interactive after; paints"
        " first after] [4.2 s; 3.1 s; 6 s; 1.9 s] [on a mid-range phone; on 3G; in the field"
        " data; in Lighthouse].|Bundle size: {s} ships [480 KB; 1.2 MB; 820 KB] of JavaScript"
        " [to first-time visitors; since the charting upgrade].|Browser timings: {s} takes [4.2"
        " s; 6 s] to become usable [on a mid-range phone; on 3G].",
        "make the page load faster|shrink the bundle|improve page speed",
    ),
    "design system": _topic(
        "engineering",
        "the button component|the date picker|the colour token set|the spacing scale|the shared"
        " component library",
        "",
        "UI kit update: {s} [gets a new version; moves to v3; is renamed in v3] [this sprint; on"
        " Thursday; by end of quarter].|Components: {s} is out of sync with [the Figma kit; the"
        " mobile app; the settings pages].|The shared [date picker; button; dropdown] replaces"
        " the custom ones in [the settings pages; the reports module; the mobile app] [this"
        " sprint; by end of quarter].",
        "keep the UI consistent|roll out the new components|retire custom widgets",
    ),
    "accessibility": _topic(
        "engineering",
        "the timesheet form|the schedule grid|the signup flow|the navigation menu|the date picker",
        "",
        "Audit result: {s} fails WCAG 2.1 AA: [its text does not meet the 4.5:1 contrast rule; it"
        " cannot be used with the keyboard alone; its fields have no labels for screen"
        " readers].|{s} cannot be used with [VoiceOver; NVDA; the keyboard alone] [since the"
        " redesign; on 12 pages].|Reported by a blind user: {s} [reads out no labels in"
        " VoiceOver; traps the keyboard focus], so they cannot [submit their timesheets; finish"
        " the task]. @support",
        "meet WCAG AA|fix the audit findings|make the app usable for everyone",
    ),
    "outages": _topic(
        "incidents",
        "the web app|login|the mobile API|clock-in|the EU cluster",
        "",
        "{s} [was down; returned 502s; was unreachable] for [18; 40; 25] minutes for [all"
        " customers; users in Europe; most accounts].|Service down: {s} failed for [2 hours; an"
        " hour; 40 minutes] [this morning; overnight] and customers could not work.|Customers"
        " could not work: {s} was unavailable for [18; 25] minutes [in two regions; across"
        " Europe].",
        "restore the service|report the downtime|get the app back up",
        also="support",
    ),
    "alerts": _topic(
        "incidents",
        "the disk usage alert|the error-rate monitor|the queue-age alarm|the CPU alarm on"
        " db-2|the heartbeat check",
        "",
        "Monitoring noise: {s} [fired; paged on-call] [41 times this week; twice tonight; every"
        " hour] without a real problem.|PagerDuty: {s} went off [at 3 am; during the deploy]"
        " again, [after the threshold change; with nothing wrong].|{s} stayed silent while the"
        " service was down [for 20 minutes; last night], so nobody was paged.",
        "tune the paging rules|cut the noise at night|make sure pages reach someone",
    ),
    "incident response": _topic(
        "incidents",
        "the SEV-2 for exports|the login incident|the payment outage @backend|last night's"
        " SEV-1|the DNS failure",
        "",
        "{s} has a postmortem due in [5 days; a week], with [the timeline; the action items]"
        " still open.|On-call: {s} needs an incident commander [now; before the handover]; the"
        " status page [has not been updated for an hour; still says all is well].|Coordination:"
        " {s} was closed after [2 hours; 30 minutes; 5 days]; [the timeline; the runbook"
        " update] is due [tomorrow; this week].|{s} gets a review [tomorrow; this week] with the"
        " on-call team.",
        "coordinate the response|close out the postmortem|fix the on-call process",
    ),
    "vulnerabilities": _topic(
        "engineering",
        "a prototype pollution flaw in lodash in the admin app @frontend|a remote code execution"
        " bug in OpenSSH on the bastion @sre|a tenant data leak in the export endpoint @backend"
        " @legal|a path traversal in the image parser @backend|a known exploit for the old"
        " OpenSSL in our base image",
        "",
        "Scanner result: {s}, [CVSS 7.4; CVSS 9.8; severity high].|Patch needed: {s}, [found in"
        " the pen test; open since Tuesday; confirmed this morning].|{s} is still unpatched"
        " [after 5 days; a week after the report]; the fix is due [Friday; this week].|Triage:"
        " {s} [is exploitable from the internet; needs a login to exploit], so it is [priority"
        " one; next in line].",
        "get the hole patched|triage the scanner results|close the pen test findings",
    ),
    "access control": _topic(
        "engineering",
        "a former contractor|the support role|every manager account|the CI service user|the"
        " finance team",
        "",
        "Permissions review: {s} still has [admin rights in Stripe; write access to production;"
        " SSH access to the bastion], [unused since June; left over from the reorg].|Role check:"
        " {s} should lose [admin rights in Stripe; write access to production; access to the"
        " billing console] by Friday.|From Monday {s} needs approval for [write access to"
        " production; the billing console; SSH to the bastion].",
        "tighten who can do what|run the access review|remove stale permissions",
    ),
    "leaked credentials": _topic(
        "incidents",
        "a SendGrid key @sre|an AWS access key @sre|a Stripe secret key @sre @backend|a database"
        " password @sre|a Slack bot token",
        "",
        "{s} was [pushed to a public gist; pasted into a support ticket; printed in the CI logs;"
        " visible in a screenshot on Twitter] [2 hours ago; on Sunday; 11 days ago]; rotate"
        " it.|Secret exposed: {s} [showed up in; was committed to] the mobile repo [last week;"
        " this morning].|GitGuardian: {s} was found in [the CI logs; a public gist] [this"
        " morning; 2 hours ago] and has not been revoked yet.",
        "get the secret revoked|contain the exposure|rotate what was exposed",
    ),
    "churn model": _topic(
        "research",
        "the churn model|the cancellation predictor|the retention risk score",
        "",
        "Model update: {s} was retrained on [the Q3 cohort; a year of usage data] and its AUC"
        " [went from 0.74 to 0.81; fell from 0.81 to 0.74] on the holdout set.|Leaver"
        " prediction: {s} now flags [32; 14; 9] accounts [up for renewal in January; on the"
        " enterprise plan] as likely to leave. @sales @revops|{s} misses [seat downgrades;"
        " accounts with few active admins; most enterprise cancellations], [so its recall is"
        " low; which explains the drop].|Risk features: in {s}, accounts with [few active"
        " admins; seat downgrades] are [4; 3] times as likely to leave. @sales",
        "predict which accounts leave|refresh the risk scores|explain the model drop",
    ),
    "experiment results": _topic(
        "research",
        "the onboarding checklist test|the new invite flow|the 21-day trial variant"
        " @strategist|the pricing page test @strategist|the annual plan banner @strategist",
        "",
        "Readout: {s} lifted [week-one activation; trial conversion; paid upgrades] [by 2.1"
        " points; by 6%; from 31% to 37%] (p=0.01).|A/B result: {s} did not move [trial"
        " conversion; seven-day retention; paid upgrades]; the difference was [0.4; 0.2] points,"
        " not significant.|{s} lowered [invites per admin; seven-day retention] by [4%; 1.5"
        " points], so we are rolling it back.",
        "decide whether to ship the variant|read out the test|learn what moved conversion",
        also="product",
    ),
    "data quality": _topic(
        "research",
        "the events table|the CRM account list @revops|the revenue dashboard @finance|the"
        " nightly warehouse load|the signup funnel data",
        "",
        "Warehouse check: {s} has [null account ids in 8% of rows; 1,900 duplicate companies;"
        " test accounts mixed with real ones].|Bad numbers: {s} [double-counts mid-month"
        " upgrades; is missing a weekend of rows; counts test accounts as customers] [since March"
        " 4; since the billing migration].|{s} is [4% too high; 3 days behind] [because of a"
        " broken join; after the schema change].",
        "trust the numbers again|fix the broken rows|clean the warehouse",
    ),
    "enterprise deals": _topic(
        "sales",
        "Globex|Umbrella|Stark Industries|Initech|Wayne Enterprises",
        "",
        "Big account: {s} moved to procurement for [2,300; 4,000; 900] seats, [380k USD ACV; on"
        " a three-year term].|{s} chose us for [all their locations; the whole group; their US"
        " and EU staff]: [2,300; 1,200] seats, signature expected Friday. @finance|Large"
        " opportunity: {s} asked for a proposal for [a company-wide rollout; 1,200 seats across"
        " the US and EU], due [next week; by the 15th].|{s} is close to signing for [900; 4,000]"
        " seats on a three-year term.",
        "close the big accounts|move the large opportunity forward|win the group contract",
        also="revops",
    ),
    "renewals": _topic(
        "sales",
        "Hooli|Acme|Oscorp|Wayne Enterprises|Cyberdyne",
        "",
        "{s} comes up for renewal in [March; January; Q2], [640k USD ARR; 210k USD ARR].|Renewal"
        " risk: {s} may not renew in [March; Q2] [unless the SSO bug is fixed; after their"
        " champion left].|{s} wants [40%; 25%] fewer seats at renewal [in March; next month]."
        "|Up for extension: {s} extended early for [two more years; three years] at [the same"
        " price; 15% less].",
        "keep the account|prepare the renewal call|protect the ARR",
        also="revops",
    ),
    "customer objections": _topic(
        "sales",
        "prospects in healthcare|three prospects this week|retail buyers|the Stark buyer|the CFO"
        " at Oscorp",
        "EU data hosting @legal|the missing DATEV integration @product|the per-seat price"
        " @strategist|the lack of single sign-on @product|the price of the payroll add-on"
        " @strategist",
        "Pushback: {s} [pushed back on; hesitated because of; raised] {o} [on the last call; in"
        " the final meeting].|Blocking the deal: {s} [raised; asked again about] {o}"
        " [this week; on every call].|Sales call notes: {s} worried about {o}.",
        "answer what buyers push back on|prepare a rebuttal|unblock stalled deals",
    ),
    "pipeline forecast": _topic(
        "sales",
        "the Q1 commit|the Q4 forecast|best case for the quarter|the weighted pipeline total",
        "",
        "Forecast call: {s} [dropped to; stands at; was revised to] [1.2M USD; 3.4M USD; 1.5M"
        " USD] [after Initech slipped to Q1 @sales; with two big deals out @sales; in"
        " Salesforce].|Projection: at current win rates we land at [78%; 86%; 104%] of the"
        " number this quarter.|Pipeline coverage for next quarter is [2.1x; 2.6x; 1.8x] against"
        " a 3x target.",
        "keep the projection honest|prepare the forecast call|update the commit",
        also="finance",
    ),
    "quota attainment": _topic(
        "sales",
        "the AE team|the EMEA team|the mid-market team|the enterprise team",
        "",
        "Attainment: {s} closed the quarter at [87%; 74%; 112%; 61%] of target.|Against target:"
        " {s} is tracking at [87%; 61%; 95%] of [the H1 goal; the annual number], [against 92%"
        " last year; with six weeks to go].|The new reps ramped to [74%; 50%] of quota [in their"
        " first quarter; by month four], slower than the plan assumed.",
        "explain the attainment|review rep performance|set next year's targets",
        also="sales",
    ),
    "discount approvals": _topic(
        "sales",
        "the Stark proposal|a 900-seat deal|the Wayne renewal|a three-year contract with"
        " Initech|the Globex order",
        "",
        "Deal desk: {s} needs sign-off for [28%; 35%; 30%] off list price, above the 20%"
        " policy.|Price concession: {s} was approved at [15%; 20%] off [the first year; list"
        " price].|{s} is waiting for approval of [a 12-month price lock; 25% off the first"
        " year].",
        "get the concession signed off|stay within policy|win on price",
        also="sales",
    ),
    "customer tickets": _topic(
        "support",
        "",
        "double-charged invoices @finance @backend|PDF exports timing out @backend|the time-off"
        " balance|missing push notifications|password resets",
        "Help desk: the support queue [tripled to; grew to] [340; 212; 1,100] open tickets"
        " [since 9 am; over the weekend; after the release].|Zendesk numbers: [60; 45] tickets a"
        " day [this week; since the release] are about {o}.|First response time for paid plans"
        " [reached; grew to] [4 hours; 9 hours] [this week; in October].|Ticket spike: [212;"
        " 340] customers wrote in [since the release; over the weekend] about {o}.",
        "keep the queue under control|staff the help desk|explain the ticket spike",
    ),
    "bug reports": _topic(
        "support",
        "the week view shows Sunday twice @frontend|shifts created through the API appear one"
        " hour late for Arizona accounts @backend|the CSV importer rejects files with a BOM"
        " @backend|the time-off balance is off by half a day|push reminders arrive twice",
        "",
        "Reproduced: {s} [for 14 customers; since the release; in ticket 48890; on our"
        " side].|Customers report that {s}; [reproduced twice; ticket 48890 has the details;"
        " it started with the release].|Defect: {s} [since the release; for 14 customers],"
        " [reported by three accounts; confirmed by QA].",
        "get the defect fixed|reproduce the reported problem|track the defect",
    ),
    "onboarding problems": _topic(
        "support",
        "new admins|trial accounts|first-time managers|new customers",
        "the CSV import step|inviting employees|adding locations|building the first"
        " schedule|connecting payroll",
        "Setup trouble: [44% of; most; a third of] {s} [get stuck at; give up at] {o} [this month;"
        " within the first week].|First weeks: {s} keep asking for help with {o}, [mostly in the"
        " first two days; 60 tickets this week].|The Globex rollout is stuck: [1,200 employees"
        " are still not invited; their managers cannot import locations] after [three; two]"
        " weeks. @sales",
        "help new customers get started|fix the setup flow|reduce early drop-off",
        also="product",
    ),
    "vendor contracts": _topic(
        "operations",
        "the Datadog order form|the Zendesk agreement|the cleaning company's contract|the Slack"
        " contract|the PagerDuty contract",
        "",
        "Supplier terms: {s} renews automatically on [March 1; the 30th] for [three years;"
        " another year] unless we give [60; 90] days' notice. @legal @finance|Procurement: {s}"
        " goes up [18%; 22%] at [renewal; the next term], [above the 5% cap in the contract"
        " @legal; with no cap in the contract]. @finance|{s} ends on [the 30th; March 1]; [we"
        " need a new quote; the new terms are not agreed yet].",
        "avoid an unwanted renewal|negotiate supplier terms|review the supplier agreement",
    ),
    "budget": _topic(
        "operations",
        "operations spend|the travel line|the events line|software spend|the facilities line",
        "",
        "Spend check: {s} is [40%; 12%] over plan [for the year; this quarter].|{s} has used"
        " [82%; 95%] of its annual amount [by September; so far].|Against the plan: {s} came in"
        " [12%; 8,000 euros] under [this quarter; for the year].|{s} needs another [8,000; 38k]"
        " euros [to finish the year; by September].",
        "keep spending within plan|explain the overrun|reallocate money",
        also="finance",
    ),
    "hiring": _topic(
        "people",
        "engineering|the sales team|operations|the support team|finance",
        "",
        "Headcount: {s} [got approval for; asked for] [two new roles; a replacement lead; three"
        " backfills] [in Q2; next quarter].|{s} must wait for new headcount until [the Q1"
        " numbers are in; March].|Staffing plan: {s} loses the funding for [one open role; two"
        " open roles] [next quarter; from Q2].",
        "plan headcount|decide which roles to open|keep staffing within plan",
        also="recruiter",
    ),
    "roadmap": _topic(
        "product",
        "shift swapping @sales|the DATEV export @sales|offline clock-in @sales|reporting v2|the"
        " France launch @strategist",
        "",
        "Plan change: {s} [moves to; slips to] [Q3; 2026; next quarter] [after the board review;"
        " behind payroll in Germany].|Priorities: {s} is committed for [Q2; this half] [as"
        " priority one; pending design].|{s} is planned for [Q2; Q3; next quarter] in the new"
        " plan.",
        "publish the priorities|set the plan for next quarter|sequence the launches",
    ),
    "feature requests": _topic(
        "product",
        "customers|three prospects @sales|the Globex team @sales|Pro plan users|eight accounts",
        "bulk editing of shifts|a Microsoft Teams integration|labour cost per shift|an export to"
        " DATEV|offline clock-in",
        "Wish list: {s} asked for {o} [this week; again; in writing].|Asked for: {s} [would pay"
        " for; keep asking for] {o}.|Request count: {o} was asked for [212; 48] times [this"
        " quarter; in tickets], most often by {s}.",
        "collect what customers ask for|decide what to build next|rank the asks",
    ),
    "user feedback": _topic(
        "product",
        "NPS comments|interviewed managers|app store reviews|survey answers|beta testers",
        "",
        "What users say: {s} [praise; complain about; are split on] [the mobile app; the new"
        " navigation; the time-off screen; the week view jumping back to today @frontend] [this"
        " month; since the release].|Voice of the user: {s} keep mentioning [the reporting page;"
        " the time-off screen; slow exports] [this month; since June].|{s} rate [the mobile"
        " app; the reporting page] [4.1; 3.2] out of 5 [this quarter; since the release].",
        "understand what users think|pass on what users say|decide what to fix",
    ),
    "contracts": _topic(
        "legal",
        "Initech's redline|Stark's master agreement|Umbrella's MSA|the Globex data annex",
        "",
        "Redline review: {s} [asks for; adds] [uncapped liability; termination for convenience;"
        " broad indemnity; a 12-month fee cap] [in section 9; in the annex].|Terms: {s} [needs"
        " our comments by Friday; is waiting on our liability clause].|{s} allows termination"
        " on [90; 30] days' notice [in section 9; in the annex]; we cannot accept that.",
        "protect our terms|review the agreement|agree the redlines",
        also="sales",
    ),
    "compliance": _topic(
        "legal",
        "the SOC 2 audit|the ISO 27001 review|the vendor risk assessment",
        "our change process|the backup tests|the security training|the quarterly access reviews"
        " @security",
        "Audit: {s} requires evidence for [48; 60] controls [by April 1; this quarter].|{s} found"
        " gaps in {o}.|Certification: {s} asks for [12; 6] months of evidence on {o}.|[The"
        " European Accessibility Act; The new accessibility law] applies to [our web app; the"
        " mobile app] from [June 2025; next year]; we need WCAG 2.1 AA or a documented"
        " exemption. @frontend @product",
        "pass the audit|collect the evidence|close the audit gaps",
    ),
    "gdpr": _topic(
        "legal",
        "",
        "",
        "Privacy: an erasure request from [a former employee of a customer; a user in France; a"
        " user in Spain] arrived [on Monday; this morning]; we have [30 days; until the 15th] to"
        " answer under article 17.|Personal data: the [analytics warehouse; event pipeline]"
        " keeps raw IP addresses of EU users for [3; 5] years with no retention period. @data"
        " @security|The processing agreement with Personio [expired in June; has no clause on"
        " transfers], so our payroll data processing has no valid basis. @ops|Copies of EU"
        " customer data [sit in a US region; are kept for backups in the US] [since the"
        " migration; for 3 years]. @backend|[GPS locations; Clock-in photos] of field workers are"
        " stored [with no consent on record; for 3 years; without a retention period]; we need a"
        " lawful basis.",
        "stay within EU privacy law|answer the data subject|close a privacy gap",
    ),
    "cloud costs": _topic(
        "finance",
        "the AWS bill|BigQuery spend @data|NAT gateway traffic|the warehouse cluster @data|S3"
        " storage",
        "",
        "Infra bill: {s} [rose to; came to] [84k USD; 22k USD; 61k USD] [this month; in"
        " November].|Hosting spend: {s} doubled [since the log shipper went live; in November]."
        "|{s} could drop by [3k USD; 4,000 USD] a month [with tiering; if we pause it at night;"
        " with a savings plan].",
        "cut the hosting bill|explain the bill|find savings in infrastructure",
    ),
    "invoices": _topic(
        "finance",
        "Hooli's Q3 invoice @sales|the Globex invoice @sales|the Oscorp annual invoice @sales",
        "",
        "Accounts receivable: {s} is [62; 18] days overdue; [the PO number was missing; a"
        " reminder went out; their AP team asked for a copy].|Billing: {s} is short by [14,300;"
        " 1,200] euros; the amount does not match the order.|{s} goes to [the Dutch entity;"
        " their new billing address] from the next cycle.|Accounts payable: Lumen sent INV-2291"
        " for [14,300; 1,200] euros [twice; without a PO number]. @ops",
        "collect what we are owed|avoid paying twice|fix the billing details",
    ),
    "revenue": _topic(
        "finance",
        "bookings @revops|new ARR @revops|expansion revenue|recurring revenue|total revenue",
        "",
        "Month close: {s} came in [12% above; 4% below] plan [after the price change @strategist;"
        " in the ledger].|Top line: {s} grew [12%; 4%] [year over year; quarter over quarter]."
        "|{s} fell short of plan by [4%; 6%] [last month; this quarter].",
        "report the numbers|close the month|explain the top line",
    ),
    "hiring pipeline": _topic(
        "people",
        "the senior backend search|the SRE search|the Lisbon analyst search|the AE backfill"
        " search|the design lead search",
        "",
        "Recruiting: {s} has [3; 12; 40] applicants in screening [this week; so far]. @ops"
        "|Search update: {s} has [2 finalists; 3 onsite interviews this week; an offer out]. @ops"
        "|{s} is stuck [with no finalists after six weeks; waiting on agency submissions]. @ops"
        "|The senior backend search needs a second interviewer for [Tuesday; Thursday] at"
        " [14:00; 10:00]. @backend",
        "fill the open roles|move the searches along|plan interviews",
    ),
    "candidates": _topic(
        "people",
        "the Berlin backend candidate|Thursday's SRE finalist|the data science candidate|the AE"
        " from Lisbon|the design lead finalist",
        "",
        "Interview note: {s} [did well in the technical round; struggled in the technical round;"
        " did well on the take-home task; struggled with the take-home task; impressed the panel"
        " in the final interview].|Applicant update: {s} [accepted our offer; turned down our"
        " offer; withdrew after the take-home task] [yesterday; on Friday]. @ops|{s} asked about"
        " [a relocation bonus of 5,000 euros; a later start date; the salary band] [on the"
        " call; this morning]. @ops",
        "give my interview verdict|close the applicant|keep the finalist warm",
    ),
}


def _check_topics() -> None:
    """Every topic has an agent with it among its interests, and its tags name agents."""
    errors = []
    for topic, words in TOPICS.items():
        if not audience_of(topic):
            errors.append(f"topic {topic!r}: no agent has it among its interests")
        strings = [*words["subjects"], *words["objects"], *words["templates"]]
        for agent in [*words["also"], *(tag for text in strings for tag in TAG.findall(text))]:
            if agent not in AGENT_IDS:
                errors.append(
                    f"topic {topic!r}: unknown agent id {agent!r} in a secondary audience"
                )
    if errors:
        raise SystemExit("invalid topic vocabularies:\n  " + "\n  ".join(errors))


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


def fill(words: dict[str, Any], rng: random.Random) -> tuple[str, list[str]]:
    """One unit's text from a topic vocabulary, and the ``@`` tags of the choices it made."""
    text = rng.choice(words["templates"])
    text = text.replace("{s}", rng.choice(words["subjects"]))
    text = text.replace("{o}", rng.choice(words["objects"]))
    while match := CHOICE.search(text):
        option = rng.choice(match.group(1).split(";")).strip()
        text = text[: match.start()] + option + text[match.end() :]
    tags = TAG.findall(text)
    text = TAG.sub("", text)
    return text[0].upper() + text[1:], tags


def secondary_of(topic: str, tags: list[str]) -> list[str]:
    """The agents beyond the topic's own audience that a unit of the topic is also for: the
    topic's ``also`` and the tags of the unit's choices, in table order."""
    wanted = set(TOPICS[topic]["also"]) | set(tags)
    primary = audience_of(topic)
    return [agent for agent in AGENT_IDS if agent in wanted and agent not in primary]


def generated_units() -> list[dict[str, Any]]:
    """``PER_TOPIC`` units per topic, from its vocabulary.

    A unit is for the agents that have its topic among their interests and for its secondary
    audience (``secondary_of``). Each topic has its own generator, seeded by its name, so
    editing one vocabulary leaves the other topics' units as they were. The recorder is drawn
    among the agents outside the unit's audience, so its role says nothing about the unit."""
    _check_topics()
    units = []
    for topic, words in TOPICS.items():
        rng = random.Random(f"{SEED}:{topic}")
        seen: set[str] = set()
        for number in range(1, PER_TOPIC + 1):
            for _attempt in range(1000):
                content, tags = fill(words, rng)
                if content not in seen:
                    break
            else:
                raise SystemExit(f"topic {topic!r}: too few distinct units; widen its vocabulary")
            if (
                re.search(r"[{}\[\]@]", content)
                or not MIN_WORDS <= len(content.split()) <= MAX_WORDS
            ):
                raise SystemExit(f"topic {topic!r}: malformed unit {content!r}")
            seen.add(content)
            audience = [
                agent
                for agent in AGENT_IDS
                if agent in audience_of(topic) or agent in secondary_of(topic, tags)
            ]
            outsiders = [agent for agent in AGENT_IDS if agent not in audience]
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
