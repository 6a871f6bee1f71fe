#!/usr/bin/env python3
"""The section of docs/benchmarks.md that puts billing-inbox beside the Stripe sync engine, from
the JSON of `inboxctl bench --peer` (and, when given, of scripts/dev's own throughput).

scripts/benchmarks imports it for the whole page; run on its own (`scripts/benchmarks
--only-peer` does) it puts the section in the page as it is, in place of the one there, else
before "## Cold start":

    python3 scripts/benchmarks_peer.py REPORT.json "COMMAND" "POSTGRES SETTINGS" [DEV.json|""] [PREVIOUS.json]
"""
import json
import os
import subprocess
import sys

HEADING = "## Beside the Stripe sync engine"
ENGINE = "@supabase/stripe-sync-engine"
MODES = [("in-process", "In process"), ("http", "Over HTTP on loopback")]
# billing-inbox in process with its worker started at the intake's last answer, beside the
# engine's in-process run: what its intake alone accepts (on AWS the worker has cores of its own).
INTAKE_FIRST = ("intake-first", "In process, the worker after the intake's last answer")


def engine_version(root):
    lock = json.load(open(os.path.join(root, "scripts", "peer-bench", "package-lock.json")))
    return lock["packages"][f"node_modules/{ENGINE}"]["version"]


def shared_note(report):
    """Says so when the machine's other tenants were busy (a load above its cores before the run; the
    load after holds the run's own callers and backends)."""
    loads = [float(x) for x in str(report.get("load_average_before", "")).split()[:1]]
    if loads and max(loads) > (os.cpu_count() or 1):
        return (": **the machine was shared** with other work while this ran, so \"the rest\" below holds other tenants' CPU and "
                "every rate is lower and noisier than on a quiet machine; compare the two sides' ratios and their named processes, not the rates")
    return ""


def run_of(report, side, mode, c):
    return next(r for r in report["runs"] if r["side"] == side and r["mode"] == mode and r["concurrency"] == c)


def named_ms(run):
    """CPU ms per delivery of the processes a side runs on (Postgres included), not the rest."""
    return sum(ms for name, ms in run["cpu"]["by_process"].items() if ms is not None and name != "the rest")


def cpu_text(run):
    by = run["cpu"]["by_process"]
    parts = [f"{name} {ms:.2f}" for name, ms in by.items() if ms is not None and name != "the rest"]
    return f"**{named_ms(run):.2f}** ({', '.join(parts)}; the rest {by.get('the rest') or 0:.2f})"


def right(run, key):
    c = run["correct"]
    return f"{c[key + '_right']} of {c[key]}"


def ratio(a, b):
    return a / b if b else float("nan")


def goals(ours, engine):
    """Each of issue 43's goals for one pair of runs: (accepted, final, correct)."""
    accepted = ratio(ours["accepted_per_sec"], engine["accepted_per_sec"])
    final = ratio(ours["final_secs"], engine["final_secs"])
    oc, ec = ours["correct"], engine["correct"]
    ours_all = oc["distinct_right"] == oc["distinct"] and oc["paired_right"] == oc["paired"]
    engine_wrong = ec["distinct_right"] < ec["distinct"] or ec["paired_right"] < ec["paired"]
    return accepted >= 1.0, final <= 2.0, ours_all and (engine_wrong or ours_all)


def share(run, name):
    by = run["cpu"]["by_process"]
    total = run["cpu"]["ms_per_delivery"] or 0
    ms = next((v for k, v in by.items() if k.startswith(name)), None) or 0
    return ms, (ms / total if total else 0)


def lines(report, command, settings, commit, root, dev=None, previous=None):
    version = engine_version(root)
    out = [
        HEADING,
        "",
        f"Measured at commit {commit} with `{command}` (release build), on the same Postgres cluster as the figures above ({settings}), "
        f"each side on a fresh database of its own and one run after another; load average {report.get('load_average_before', '?')} before "
        f"and {report.get('load_average_after', '?')} after on {os.cpu_count()} cores{shared_note(report)}. The engine is `{ENGINE}` {version} from npm, "
        "pinned by scripts/peer-bench/package-lock.json and installed by scripts/peer-bench/install; it runs its own migrations "
        "(its `stripe` schema) and is configured as its README shows, with no refetch and no backfill, so it calls no Stripe API.",
        "",
        f"The deliveries, the same bytes to both: {report['deliveries']} deliveries ({report['events']} events, 30% of the deliveries copies, "
        f"shuffled) of `customer.subscription.created` and `.updated` at API version {report['api_version']}, each the corpus's "
        "event (testdata/providers/stripe/pre-basil/: the subscription's period at its top level, as in 2023-10-16) with its own ids, "
        "times and status, signed as Stripe signs (`Stripe-Signature`, HMAC-SHA256 with the `whsec_` secret; signed again before each run, "
        f"within both sides' tolerance). Of the {report['subscriptions']} subscriptions, {report['subscriptions'] - report['paired_subscriptions']} "
        "have events minutes apart (created `incomplete`, `active` a minute later, `past_due` an hour later) and "
        f"{report['paired_subscriptions']} are Stripe's same-second pair (created `incomplete`, then updated `active` in the same second, "
        "`previous_attributes.status` naming the first). Event ids are random, as Stripe's are.",
        "",
        "- **In process:** billing-inbox's intake handler (one instance per concurrent caller, as Lambda runs them) with the worker's "
        "pollers applying what the local SQS server brings meanwhile, in `inboxctl`, as `inboxctl bench` measures the pipeline; "
        "the engine's `processWebhook` from as many concurrent callers in one node process (scripts/peer-bench/drive.js, a pool of as many connections).",
        "- **Over HTTP on loopback:** the intake's handler behind a plain hyper server (HTTP/1.1, one intake instance per connection) with the "
        "worker's pollers in the same process; the engine behind node's `http.createServer` calling `processWebhook` per request. "
        "The same node client (keep-alive, as many connections as callers) sends to both.",
        "",
        "Accepted: every delivery answered 2xx, per second of sending. Final: from the first delivery until every subscription's state is "
        "its final one (billing-inbox: every stored event applied by the worker; the engine applies inside the request, so its last answer is its final). "
        "CPU: every process on the machine counted (`/proc/stat`), per delivery, split by process (`/proc/<pid>/stat`); "
        "Postgres is its postmaster and every child (the backends, the WAL writer; the ones that ended included); \"the rest\" is what no named process used (the kernel's network work, and the machine's other tenants). "
        "The CPU compared is the sum of the named processes' (Postgres's included): on a machine whose cores are busy throughout, "
        "the machine's total per delivery is its wall time over the deliveries, whoever used it. "
        "WAL: the server's WAL position before and after, per delivery. Right: subscriptions whose stored status is their newest event's.",
        "",
    ]
    for mode, title in MODES:
        out += [
            f"### {title}",
            "",
            "| concurrency | side | accepted /s | final after s | CPU ms per delivery of its processes (by process; and the rest) | WAL bytes per delivery | right, events minutes apart | right, same-second pairs |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for c in (4, 16):
            ours, engine = run_of(report, "billing-inbox", mode, c), run_of(report, "engine", mode, c)
            for name, r in (("billing-inbox", ours), ("engine", engine)):
                out.append(
                    f"| c{c} | {name} | {r['accepted_per_sec']:.0f} | {r['final_secs']:.2f} | {cpu_text(r)} | "
                    f"{r['wal_bytes_per_delivery']:.0f} | {right(r, 'distinct')} | {right(r, 'paired')} |"
                )
            out.append(
                f"| c{c} | **billing-inbox / engine** | **{ratio(ours['accepted_per_sec'], engine['accepted_per_sec']):.2f}×** | "
                f"**{ratio(ours['final_secs'], engine['final_secs']):.2f}×** | "
                f"**{ratio(named_ms(ours), named_ms(engine)):.2f}×** | "
                f"**{ratio(ours['wal_bytes_per_delivery'], engine['wal_bytes_per_delivery']):.2f}×** | | |"
            )
        out.append("")
    out += intake_first_lines(report)
    out += previous_lines(previous)
    out += goal_lines(report)
    out += cost_goal_lines(report)
    out += storage_lines(report)
    if dev is not None:
        out += dev_lines(dev, report)
    return out


def intake_first_lines(report):
    """billing-inbox's intake with the cores to itself, beside the engine's in-process run."""
    mode, title = INTAKE_FIRST
    if not any(r["mode"] == mode for r in report["runs"]):
        return []
    out = [
        f"### {title}",
        "",
        "The same deliveries in process, billing-inbox's worker started only when the intake has answered the last one, so the "
        "sending has the cores to itself (on AWS the worker is a function of its own, on cores of its own); beside the engine's "
        "in-process run above, whose request does its whole work. Final still counts the worker's apply after the last answer.",
        "",
        "| concurrency | billing-inbox accepted /s | engine accepted /s | **billing-inbox / engine** | final after s (billing-inbox / engine) | CPU ms per delivery of its processes | right, events minutes apart | right, same-second pairs |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for c in (4, 16):
        ours, engine = run_of(report, "billing-inbox", mode, c), run_of(report, "engine", "in-process", c)
        out.append(
            f"| c{c} | {ours['accepted_per_sec']:.0f} | {engine['accepted_per_sec']:.0f} | "
            f"**{ratio(ours['accepted_per_sec'], engine['accepted_per_sec']):.2f}×** | "
            f"{ours['final_secs']:.2f} / {engine['final_secs']:.2f} = **{ratio(ours['final_secs'], engine['final_secs']):.2f}×** | "
            f"{cpu_text(ours)} | {right(ours, 'distinct')} | {right(ours, 'paired')} |"
        )
    out.append("")
    return out


def goal_lines(report):
    out = [
        "### Goals (issue 43) and where the time goes",
        "",
        "Goals: billing-inbox's accepted deliveries per second ≥ the engine's (its intake does less per delivery than the engine's "
        "request: one statement and a send, where the engine writes the subscription, its items and marks the removed items inside the request); "
        "time until final within 2× the engine's; every state right where the engine gets some wrong.",
        "",
        "| run | accepted ≥ engine | final within 2× | every state right |",
        "| --- | --- | --- | --- |",
    ]
    mark = lambda ok: "met" if ok else "**not met**"
    for mode, title in MODES:
        for c in (4, 16):
            ours, engine = run_of(report, "billing-inbox", mode, c), run_of(report, "engine", mode, c)
            a, f, k = goals(ours, engine)
            out.append(
                f"| {title.lower()}, c{c} | {mark(a)} ({ratio(ours['accepted_per_sec'], engine['accepted_per_sec']):.2f}×) | "
                f"{mark(f)} ({ratio(ours['final_secs'], engine['final_secs']):.2f}×) | {mark(k)} |"
            )
    if any(r["mode"] == INTAKE_FIRST[0] for r in report["runs"]):
        for c in (4, 16):
            ours, engine = run_of(report, "billing-inbox", INTAKE_FIRST[0], c), run_of(report, "engine", "in-process", c)
            a, f, k = goals(ours, engine)
            out.append(
                f"| {INTAKE_FIRST[1].lower()}, c{c} | {mark(a)} ({ratio(ours['accepted_per_sec'], engine['accepted_per_sec']):.2f}×) | "
                f"{mark(f)} ({ratio(ours['final_secs'], engine['final_secs']):.2f}×) | {mark(k)} |"
            )
    ours, engine = run_of(report, "billing-inbox", "in-process", 4), run_of(report, "engine", "in-process", 4)
    own, own_share = share(ours, "inboxctl")
    sqs, sqs_share = share(ours, "SQS server")
    pg, pg_share = share(ours, "Postgres")
    rest, rest_share = share(ours, "the rest")
    node, node_share = share(engine, "node")
    epg, epg_share = share(engine, "Postgres")
    erest, erest_share = share(engine, "the rest")
    named, enamed = own + sqs + pg, node + epg
    oc, ec = ours["correct"], engine["correct"]
    out += [
        "",
        f"Where the time goes (in process, c4): every delivery costs billing-inbox "
        f"**{named:.2f} CPU ms** in the processes it runs on, the engine **{enamed:.2f}** (**{ratio(named, enamed):.2f}×**). "
        f"billing-inbox's: {own:.2f} in its own process (the intake's verification, its statement and its send; the worker's receive, read, "
        f"write and finish of each new event), {sqs:.2f} in the local SQS server (a node process: every new event sent, received and deleted "
        f"through it) and **{pg:.2f} in Postgres**; the engine's: {node:.2f} in node (the stripe library's verification and parse, "
        f"the engine's three statements) and {epg:.2f} in Postgres. Postgres is where the difference lies ({ratio(pg, epg):.1f}× the engine's): "
        f"billing-inbox writes {ours['wal_bytes_per_delivery']:.0f} WAL bytes per delivery against the engine's {engine['wal_bytes_per_delivery']:.0f} "
        f"({ratio(ours['wal_bytes_per_delivery'], engine['wal_bytes_per_delivery']):.1f}×), because it keeps every event whole (the payload, "
        "for the audit, replays and `inboxctl why`) and each event's life as rows (stored, claimed, applied with the registers, the account's "
        "version and the log line), where the engine updates one subscription row and its items in place and keeps no event. "
        + (f"Its own process costs less per delivery than node does for the engine ({own:.2f} against {node:.2f} ms). " if own < node
           else f"Its own process costs more per delivery than node does for the engine ({own:.2f} against {node:.2f} ms). ")
        + "On 2 cores the machine is the bound for both, so the side that spends more CPU per delivery accepts fewer per second "
        "when its intake and its worker share the cores, as they do in process; over HTTP both sides also pay for the same node client "
        "and an HTTP server, which moves the ratios (the tables above).",
        "",
        c16_lines(report),
        "",
        "What would close it where a goal is missed: on AWS the intake and the worker are separate functions on cores of their own and the "
        "queue is SQS, not a process on the same 2 cores, so the intake's rate is its own statement and send, not that and the worker's apply "
        "on the same cores (the run above with the worker started at the intake's last answer: the same intake alone, beside the "
        "engine's request); the Postgres work per event is the price of the stored payload and the event's life, "
        "which is what the audit, replays and the right answer to a same-second pair are built on. Part of it is gone: the event's row kept "
        "its raw body inline (compressed, under Postgres's 2 kB default once the payload had gone out of line), so each of the worker's "
        "updates of the row (its claim, its finish) wrote it to the WAL again; with both out of line past 512 bytes "
        "(migration `20261213100001`) an update copies pointers: 7.4 kB of WAL per delivery became 6.0 kB (not from this run: "
        "measured once on the development cluster, 2,000 of these deliveries in process at c4, `pg_waldump` by relation: the event's heap 3.2 kB → 0.8 kB, its TOAST 1.3 → 2.4 kB). What is left, by `pg_stat_statements` there "
        "(5,000 deliveries), in Postgres time per delivery: the worker's one write of everything (0.30 ms), the intake's insert (0.29 ms: the row, "
        "its TOAST, six indexes, the delivery's row and three more), the worker's read of the account's registers (0.18 ms); each status "
        "change of the event's row is a new index entry in every index of the table (`status` is in one, so no update is HOT). "
        "Fewer indexes on the event's row, or its status kept in a row of its own, is where a further gain would come from. "
        "One more cause of run-to-run spread, on this side more than the engine's: each run starts on empty tables, and when "
        "autovacuum analyzes one within the run's first second (at 50 rows), the worker's connections plan their prepared "
        "statements on a one-page table, so the read of the account's registers scans `subscriptions` whole until the next "
        "analyze; in 6 of 9 runs of 5,000 deliveries on the development cluster, 2,500–2,700 of the 3,500 reads did, reading "
        "up to 1,400 rows each (`pg_stat_user_tables`; the plan shown by `EXPLAIN` of the generic plan at 60 analyzed rows). "
        "A deployment's tables are analyzed at their size, so it holds only for a store's first minutes.",
        "",
        f"Correctness on the same deliveries: billing-inbox ended {oc['distinct_right']} of {oc['distinct']} subscriptions with events minutes apart "
        f"and {oc['paired_right']} of {oc['paired']} same-second pairs on their newest event's status; the engine {ec['distinct_right']} of {ec['distinct']} "
        f"and {ec['paired_right']} of {ec['paired']}. The engine keeps whichever event of a pair arrives first: its upsert is guarded by "
        "`last_synced_at < event.created`, a second's resolution, so the second event of the same second is dropped whatever it says. "
        "billing-inbox settles a tie on Stripe's second by what the provider says the subscription is: a provider read when the "
        "source has an API key, else the status progression (`incomplete` < `active`; docs/design.md §4.2), never by the random id "
        "or the arrival (no API key here: the status progression).",
        "",
    ]
    return out


def pg_ms(run):
    return run["cpu"]["by_process"].get("Postgres") or 0.0


def cost_goal_lines(report):
    """The goals of issue 57: as fast as the engine in process, for at most 1.2× its CPU, no more Postgres CPU, at most 2× its WAL,
    at most 2,000 bytes stored per event, final within 1.5×."""
    out = [
        "### Goals (issue 57): the cost per delivery",
        "",
        "Goals, in process (the intake and the worker sharing the cores): accepted deliveries per second ≥ 1.0× the engine's; CPU per delivery "
        "of every process ≤ 1.2× the engine's; Postgres CPU per delivery ≤ the engine's; WAL per delivery ≤ 2× the engine's; "
        "bytes stored per event ≤ 2,000 after the drain, indexes and TOAST included; final within 1.5× the engine's. Every event "
        "is still kept whole: its signed raw body, for the audit, replays and `why`.",
        "",
        "| run | accepted | CPU per delivery | Postgres CPU per delivery | WAL per delivery | bytes stored per event | final |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    mark = lambda ok, text: text if ok else f"**not met** ({text})"
    for c in (4, 16):
        ours, engine = run_of(report, "billing-inbox", "in-process", c), run_of(report, "engine", "in-process", c)
        accepted = ratio(ours["accepted_per_sec"], engine["accepted_per_sec"])
        cpu = ratio(named_ms(ours), named_ms(engine))
        pg = ratio(pg_ms(ours), pg_ms(engine))
        wal = ratio(ours["wal_bytes_per_delivery"], engine["wal_bytes_per_delivery"])
        stored = (ours.get("storage") or {}).get("bytes_per_event")
        final = ratio(ours["final_secs"], engine["final_secs"])
        wal_text = f"{wal:.2f}× ({ours['wal_bytes_per_delivery']:.0f} / {engine['wal_bytes_per_delivery']:.0f} B)"
        out.append(
            f"| in process, c{c} | {mark(accepted >= 1.0, f'{accepted:.2f}×')} | {mark(cpu <= 1.2, f'{cpu:.2f}×')} | "
            f"{mark(pg <= 1.0, f'{pg:.2f}× ({pg_ms(ours):.2f} / {pg_ms(engine):.2f} ms)')} | "
            f"{mark(wal <= 2.0, wal_text)} | "
            + (mark(stored <= 2000, f"{stored:.0f}") if stored is not None else "?")
            + f" | {mark(final <= 1.5, f'{final:.2f}×')} |"
        )
    out.append("")
    return out


def storage_lines(report):
    """Where billing-inbox's bytes, row versions and WAL go, per run: read after the drain from its database (sizes,
    `pg_stat_user_tables`) and, when the server loads it, `pg_stat_statements`."""
    ours = [r for r in report["runs"] if r["side"] == "billing-inbox" and r.get("storage")]
    if not ours:
        return []
    out = [
        "### Where billing-inbox's bytes, row versions and WAL go",
        "",
        "Read after each run's drain from its own database: the bytes on disk per stored event (every table, indexes and TOAST "
        "included; then `inbox_events` and `deliveries` part by part), and the event's and the delivery's rows written "
        "(inserts, updates, and of the updates those that were HOT: a new row version on the same page that writes no index entry).",
        "",
        "| run | events | bytes per event, all tables | inbox_events: heap / TOAST / indexes | deliveries: heap / TOAST / indexes | inbox_events inserts / updates (HOT) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in ours:
        st = r["storage"]
        def part(table, which):
            rows = [p for p in st["parts"] if p["table"] == table]
            if which == "indexes":
                return sum(p["bytes_per_event"] for p in rows if p["part"] not in ("heap", "TOAST"))
            return sum(p["bytes_per_event"] for p in rows if p["part"] == which)
        ev = next((u for u in st["updates"] if u["table"] == "inbox_events"), None)
        out.append(
            f"| {r['mode']}, c{r['concurrency']} | {st['events']} | {st['bytes_per_event']:.0f} | "
            f"{part('inbox_events', 'heap'):.0f} / {part('inbox_events', 'TOAST'):.0f} / {part('inbox_events', 'indexes'):.0f} | "
            f"{part('deliveries', 'heap'):.0f} / {part('deliveries', 'TOAST'):.0f} / {part('deliveries', 'indexes'):.0f} | "
            + (f"{ev['inserted']} / {ev['updated']} ({ev['hot']})" if ev else "?") + " |"
        )
    first = ours[0]
    idx = [p for p in first["storage"]["parts"] if p["part"] not in ("heap", "TOAST")]
    out += [
        "",
        f"Each index's bytes per event ({first['mode']}, c{first['concurrency']}): "
        + ", ".join(f"{p['part']} {p['bytes_per_event']:.0f}" for p in idx) + ".",
        "",
    ]
    with_statements = [r for r in ours if r.get("by_statement")]
    if with_statements:
        r = with_statements[0]
        out += [
            f"By statement ({r['mode']}, c{r['concurrency']}; `pg_stat_statements` with `track = all`, so a trigger's statements "
            "are their own lines), per delivery, most WAL first:",
            "",
            "| statement | calls | WAL bytes | of which full-page images (count) | execution ms |",
            "| --- | --- | --- | --- | --- |",
        ]
        for s in r["by_statement"]:
            text = s["statement"].replace("|", "\\|")
            out.append(
                f"| `{text}` | {s['calls_per_delivery']:.2f} | {s['wal_bytes_per_delivery']:.0f} | "
                f"{s['full_page_images_per_delivery']:.3f} | {s['exec_ms_per_delivery']:.3f} |"
            )
        out.append("")
    return out


def c16_lines(report):
    """What changes from c4 to c16, in process: where the misses are."""
    o4, o16 = run_of(report, "billing-inbox", "in-process", 4), run_of(report, "billing-inbox", "in-process", 16)
    e4, e16 = run_of(report, "engine", "in-process", 4), run_of(report, "engine", "in-process", 16)
    return (
        f"From c4 to c16 (in process) billing-inbox's Postgres work per delivery went from {share(o4, 'Postgres')[0]:.2f} to "
        f"{share(o16, 'Postgres')[0]:.2f} ms and its own process's from {share(o4, 'inboxctl')[0]:.2f} to {share(o16, 'inboxctl')[0]:.2f}; "
        f"the engine's Postgres from {share(e4, 'Postgres')[0]:.2f} to {share(e16, 'Postgres')[0]:.2f} and node's from "
        f"{share(e4, 'node')[0]:.2f} to {share(e16, 'node')[0]:.2f} (what no named process used, the kernel's and any other "
        f"tenant's: billing-inbox {share(o4, 'the rest')[0]:.2f} to {share(o16, 'the rest')[0]:.2f}, the engine "
        f"{share(e4, 'the rest')[0]:.2f} to {share(e16, 'the rest')[0]:.2f}). At c16 billing-inbox runs 16 intake instances, each with its own "
        "connection, and 16 worker invocations fed by their pollers on the same 2 cores as Postgres's backends for both: more "
        "processes contend for the cores and the account's rows, where the engine's 16 callers share one node event loop."
    )


def previous_lines(previous):
    """The ratios of the run before, from the same command: how far they move on this machine."""
    if not previous:
        return []
    parts = []
    for mode, title in MODES:
        for c in (4, 16):
            try:
                ours, engine = run_of(previous, "billing-inbox", mode, c), run_of(previous, "engine", mode, c)
            except StopIteration:
                return []
            parts.append(
                f"{title.lower()} c{c}: accepted {ratio(ours['accepted_per_sec'], engine['accepted_per_sec']):.2f}×, "
                f"final {ratio(ours['final_secs'], engine['final_secs']):.2f}×"
            )
    load = previous.get("load_average_before")
    return [
        f"The run before this one, the same command ({previous['deliveries']} deliveries"
        + (f"; load average {load} before and {previous.get('load_average_after', '?')} after" if load else "")
        + "), billing-inbox / engine: " + "; ".join(parts) + ". On this shared machine the ratios move that much from run to run.",
        "",
    ]


def dev_lines(dev, report):
    by = dev["cpu"]["by_process"]
    total = dev["cpu"]["ms_per_delivery"] or 0
    parts = ", ".join(f"{name} {ms:.2f} ({ms / total * 100:.0f}%)" for name, ms in sorted(by.items(), key=lambda kv: -(kv[1] or 0)) if ms)
    busy = dev["cpu"]["busy"] or 0
    c = dev["correct"]
    functions = by.get("the functions (debug builds)") or 0
    release = [share(r, "inboxctl")[0] for r in report["runs"] if r["side"] == "billing-inbox" and r["mode"] == "in-process"]
    return [
        "### scripts/dev's own throughput",
        "",
        f"The local stack as `scripts/dev` runs it (debug builds of the functions behind `cargo lambda watch`, `inboxctl dev` playing the "
        f"event source mapping against the local SQS server, the development Postgres), measured once with `inboxctl bench --peer "
        f"--peer-dev-intake $INTAKE_URL --deliveries {dev['deliveries']}`: the same kind of signed deliveries, sent by the node client from "
        f"{dev['concurrency']} concurrent senders to its intake. **{dev['accepted_per_sec']:.0f} deliveries accepted/s**, every event final after "
        f"{dev['final_secs']:.1f} s: **{dev['deliveries'] / max(dev['final_secs'], 1e-9):.0f} deliveries/s until final**; "
        f"subscriptions right {c['distinct_right']} of {c['distinct']} and same-second pairs {c['paired_right']} of {c['paired']}. "
        f"Load average {dev.get('load_average_before', '?')} before and {dev.get('load_average_after', '?')} after.",
        "",
        f"What limits it: the machine's cores, {busy * 100:.0f}% busy throughout. CPU per delivery {total:.2f} ms: {parts} "
        "(\"inboxctl\" is the bridge, the effects receiver and this measurement's own process; \"the rest\" the kernel and the machine's other tenants). "
        f"The functions' debug builds are the largest share: {functions:.2f} ms per delivery, against {min(release):.2f}–{max(release):.2f} ms "
        "for the release build's intake and worker in process above (unoptimized verification, JSON and the SDK's request signing); each invocation also passes through `cargo lambda watch`'s runtime emulator "
        "(an HTTP hop in and out of the function process). The bridge hands the worker one batch at a time (up to 10 messages, received "
        "without waiting) and the local SQS server answers a receive that finds fewer than 10 only after about 40 ms, so the worker's "
        "apply trails the intake by a batch. This is a development loop's rate, not the pipeline's: the release figures above are.",
        "",
    ]


def main():
    report = json.load(open(sys.argv[1]))
    command, settings = sys.argv[2], sys.argv[3]
    dev = json.load(open(sys.argv[4])) if len(sys.argv) > 4 and sys.argv[4] else None
    previous = json.load(open(sys.argv[5])) if len(sys.argv) > 5 else None
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=root).stdout.strip()
    path = os.path.join(root, "docs", "benchmarks.md")
    page = open(path).read().split("\n")
    section = lines(report, command, settings, commit, root, dev, previous)
    if HEADING in page:
        start = page.index(HEADING)
        end = next((n for n in range(start + 1, len(page)) if page[n].startswith("## ")), len(page))
        page[start:end] = section
    else:
        at = next((n for n, l in enumerate(page) if l.startswith("## Cold start")), len(page))
        page[at:at] = section
    open(path, "w").write("\n".join(page))


if __name__ == "__main__":
    main()
