"""What the commands print: tables and progress bars for people, JSON for scripts.

Every text from the ledger goes through :func:`replayable.terminal.for_terminal` before it
reaches a table or stderr; JSON is written with ``ensure_ascii``, so escape sequences from
documents are escaped, never raw.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.progress_bar import ProgressBar
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from replayable.search.model import searched
from replayable.terminal import for_terminal
from replayable.vocabulary import ITEM_STATUSES

_ERROR_WIDTH = 60


# ---- tables of each command ---------------------------------------------------------------


def status_tables(data: dict[str, Any]) -> RenderableType:
    """Tables of ``status``: items with a progress bar per stage, then model calls."""
    scope = f"run {data['run_id']}" if data["run_id"] else "all runs"
    items = Table(title=f"Items by stage ({scope})", caption=f"as of {data['as_of']}")
    items.add_column("Stage")
    for name in ("Pending", "Running", "Done", "Failed", "Dead", "Open DLQ"):
        items.add_column(name, justify="right")
    items.add_column("Progress (done + dead)", min_width=24)
    for s in data["stages"]:
        finished = s["done"] + s["dead"]
        bar = ProgressBar(total=max(s["total"], 1), completed=finished, width=12)
        share = f"{finished / s['total']:.0%}" if s["total"] else "-"
        progress = Table.grid(padding=(0, 1))
        progress.add_row(bar, Text(f"{finished}/{s['total']} {share}"))
        items.add_row(
            cell(s["stage"]),
            *(number(s[key]) for key in (*ITEM_STATUSES, "open_dead_letters")),
            progress,
        )

    calls = Table(title="Model calls")
    calls.add_column("Stage")
    for name in ("Calls", "OK", "Tokens"):
        calls.add_column(name, justify="right")
    for s in data["stages"]:
        if s["model_calls"]["calls"]:
            calls.add_row(cell(s["stage"]), *numbers(s["model_calls"].values()))
    calls.add_row(Text("all", style="bold"), *numbers(data["model_calls"].values()))
    return Group(items, calls, cost_table(data["cost"], data.get("cost_days")), index_line(data))


def index_line(data: dict[str, Any]) -> RenderableType:
    """What left search (ADR 0138): the run's retracted, superseded and restored documents,
    and why it refused to retract, if it did; for all runs, the documents out of search."""
    index = data.get("index") or {}
    if "superseded" in index:
        text = (
            f"Index: {index['retracted']} retracted (deleted), {index['superseded']} "
            f"superseded (updated), {index['restored']} restored"
        )
        if index.get("refused"):
            text += f"; {index['refused']}"
    else:
        text = (
            f"Index: {index.get('retracted', 0)} retracted documents out of search, "
            f"{index.get('purged', 0)} of them purged"
        )
    return Text(text)


def cost_table(cost: dict[str, Any], days: int | None) -> RenderableType:
    """What the model calls cost, by model and mode (a run's, or the last ``days`` days')."""
    scope = f"last {days} days" if days else "this run"
    table = Table(title=f"Model cost ({scope}, USD at the connection's prices)")
    table.add_column("Model")
    table.add_column("Mode")
    for name in ("Calls", "Input tokens", "Output tokens", "Unpriced", "USD"):
        table.add_column(name, justify="right")
    for m in cost["by_model"]:
        table.add_row(
            cell(m["model"]),
            cell(m["mode"]),
            *numbers((m["calls"], m["input_tokens"], m["output_tokens"], m["unpriced_calls"])),
            usd(m["usd"]),
        )
    table.add_row(
        Text("all", style="bold"), "", "", "", "", number(cost["unpriced_calls"]), usd(cost["usd"])
    )
    return table


def usd(amount: float) -> Text:
    return Text(f"${amount:,.6f}")


def failed_table(data: dict[str, Any]) -> RenderableType:
    """A table of ``failed``: one row per failed item."""
    table = Table(title="Failed items", caption=_shown(len(data["items"]), data["matched"]))
    # Short fields stay on one line; the long ones give way in a narrow terminal.
    table.add_column("Stage", no_wrap=True)
    table.add_column("Doc", no_wrap=True)
    table.add_column("File", overflow="fold")
    table.add_column("Try", justify="right", no_wrap=True)
    table.add_column("Error class", no_wrap=True)
    table.add_column("Last error", overflow="fold")
    table.add_column("Updated", overflow="fold")
    for row in data["items"]:
        table.add_row(
            cell(row["stage"]),
            cell(row["doc_id"][:12]),
            cell(_file_name(row["uri"])),
            number(row["attempts"]),
            cell(row["error_class"]),
            cell(_one_line(row["last_error"], _ERROR_WIDTH)),
            Text(_when(row["updated_at"])),
        )
    return table


def dead_letters_table(data: dict[str, Any]) -> RenderableType:
    """A table of ``dead-letters``.

    Twelve fields do not fit 100 columns side by side, so related ones share a cell on two
    lines, as the two-line headers say.
    """
    table = Table(title="Dead letters", caption=_shown(len(data["dead_letters"]), data["matched"]))
    table.add_column("ID", justify="right", no_wrap=True)
    table.add_column("Stage", no_wrap=True)
    table.add_column("File", overflow="fold")
    table.add_column("Error class\ntries · ver", no_wrap=True)
    table.add_column("Run\nmap index", overflow="fold")
    table.add_column("Status\nowner", no_wrap=True)
    table.add_column("Note", overflow="fold")
    table.add_column("Created", overflow="fold")
    for row in data["dead_letters"]:
        map_index = "" if row["map_index"] is None else f"map {row['map_index']}"
        table.add_row(
            number(row["id"]),
            cell(row["stage"]),
            cell(_file_name(row["uri"])),
            _two_lines(row["error_class"], f"{row['attempts']} · v{row['code_version']}"),
            _two_lines(row["run_id"] or "", map_index),
            _two_lines(row["status"], row["owner"] or "unowned"),
            cell(_one_line(row["note"], 80)),
            Text(_when(row["created_at"])),
        )
    return table


def outbox_table(data: dict[str, Any]) -> RenderableType:
    """A table of ``outbox list``; the caption has the counts and the backlog's age."""
    counts = data["counts"]
    age = data["oldest_pending_age_s"]
    waiting = f", the oldest for {_duration(age)}" if age is not None else ""
    caption = (
        f"{counts['pending']:,} pending{waiting}; {counts['dead']:,} dead; "
        f"{counts['published']:,} published"
    )
    table = Table(title=f"Outbox: {data['status']} events, oldest first", caption=caption)
    table.add_column("Seq", justify="right", no_wrap=True)
    table.add_column("Event\ntype", overflow="fold")
    table.add_column("Document", no_wrap=True)
    table.add_column("Tries", justify="right", no_wrap=True)
    table.add_column("Error class", no_wrap=True)
    table.add_column("Last error", overflow="fold")
    table.add_column("Created", overflow="fold")
    for row in data["events"]:
        table.add_row(
            number(row["seq"]),
            _two_lines(row["event_id"], row["event_type"]),
            cell(row["doc_id"][:12]),
            number(row["attempts"]),
            cell(row["error_class"]),
            cell(_one_line(row["last_error"], _ERROR_WIDTH)),
            Text(_when(row["created_at"])),
        )
    return table


def print_rerun(console: Console, data: dict[str, Any]) -> None:
    """``rerun``'s conf, its query with the bound values, the count now, the commands."""
    console.rule("DAG-run conf")
    console.print(_syntax(json.dumps(data["conf"], indent=2), "json"))
    console.rule(f"Query: {data['sql_file']}")
    console.print(_syntax(data["sql"].strip(), "sql"))
    bound = Table(title="Bound parameters (NULL = any)")
    bound.add_column("Name")
    bound.add_column("Value", overflow="fold")
    for name, value in data["params"].items():
        bound.add_row(Text(name), Text("NULL" if value is None else json.dumps(value)))
    console.print(bound)
    console.print(Text(f"Documents matching now: {data['matching_documents']}", style="bold"))
    if data["revives_dead"]:
        console.print(
            Text(
                "This re-run includes dead items: it reopens them with a fresh attempt budget "
                "and marks their open dead letters redriven.",
                style="yellow",
            )
        )
    console.rule("Trigger it with")
    for command in data["commands"]:
        # soft_wrap: a wrapped command would paste as two.
        console.print(Text(command), soft_wrap=True)


def print_redrive(console: Console, as_json: bool, data: dict[str, Any]) -> None:
    """``redrive``'s conf and what it matches, then the run it started or the commands."""
    if as_json:
        print_json(data)
        return
    console.rule("DAG-run conf")
    console.print(_syntax(json.dumps(data["conf"], indent=2), "json"))
    console.print(
        Text(
            f"Open dead letters matching now: {data['letters']} ({data['documents']} documents)",
            style="bold",
        )
    )
    if "run_id" in data:
        console.rule("Triggered")
        console.print(Text(f"run {for_terminal(data['run_id'])}"), soft_wrap=True)
        console.print(Text(for_terminal(data["run_url"])), soft_wrap=True)
        return
    console.rule("Trigger it with")
    console.print(Text("replayable redrive … --trigger  (this command, with --trigger)"))
    for command in data["commands"]:
        console.print(Text(command), soft_wrap=True)


# ---- output ------------------------------------------------------------------------------


def search_table(data: dict[str, Any]) -> RenderableType:
    """A table of ``search``: the chunks found, best first."""
    ranking = {
        "text": "by shared words",
        "hybrid": f"by shared words and {data['model']} vectors, fused",
    }.get(data.get("mode", "vector"), f"by {data['model']} vectors")
    table = Table(
        title=f"Best chunks for {cell(repr(data['query']))} ({ranking})",
        caption=f"{len(data['hits'])} found. {cell(searched(data))}",
    )
    table.add_column("#", justify="right", no_wrap=True)
    table.add_column("Score", justify="right", no_wrap=True)
    table.add_column("File", overflow="fold")
    table.add_column("Chunk", justify="right", no_wrap=True)
    table.add_column("Text", overflow="fold")
    for rank, hit in enumerate(data["hits"], start=1):
        table.add_row(
            str(rank),
            f"{hit['score']:.3f}",
            cell(hit["uri"]),
            str(hit["ordinal"]),
            cell(hit["snippet"]),
        )
    return table


def check_tables(data: dict[str, Any]) -> RenderableType:
    """What ``check`` found: counts per invariant, then each violation and item in flight."""
    mode = "at quiescence" if data["quiescent"] else "while runs may be in progress"
    counts = Table(title=f"Ledger invariants ({mode})")
    counts.add_column("Invariant")
    counts.add_column("Violations", justify="right")
    for name, total in data["totals"].items():
        counts.add_row(cell(name), Text(f"{total:,}", style="bold red" if total else ""))
    parts: list[RenderableType] = [counts]
    if data["violations"]:
        parts.append(_violations_table("Violations", data["violations"], data["totals"]))
    if data["in_flight"]:
        title = "In flight (running under an expired lease; a violation only at quiescence)"
        totals = {"no_outcome": data["in_flight_total"]}
        parts.append(_violations_table(title, data["in_flight"], totals))
    verdict = "no violation" if data["clean"] else f"{sum(data['totals'].values()):,} violations"
    parts.append(Text(verdict, style="bold green" if data["clean"] else "bold red"))
    return Group(*parts)


def _violations_table(
    title: str, rows: list[dict[str, Any]], totals: dict[str, int]
) -> RenderableType:
    shown = sum(totals.values())
    table = Table(title=title, caption=_shown(len(rows), shown))
    table.add_column("Invariant", no_wrap=True)
    table.add_column("Stage", no_wrap=True)
    table.add_column("Doc", no_wrap=True)
    table.add_column("Item", no_wrap=True)
    table.add_column("Detail", overflow="fold")
    for row in rows:
        table.add_row(
            cell(row["invariant"]),
            cell(row["stage"]),
            cell((row["doc_id"] or "")[:12]),
            cell((row["item_key"] or "")[:16]),
            cell(row["detail"]),
        )
    return table


def emit(
    console: Console,
    as_json: bool,
    data: dict[str, Any],
    render: Callable[[dict[str, Any]], RenderableType],
) -> None:
    """Print ``data`` as JSON, or as ``render`` draws it."""
    if as_json:
        print_json(data)
    else:
        console.print(render(data))


def print_json(data: Any, indent: int | None = 2) -> None:
    """Write ``data`` to stdout as JSON (times in ISO 8601), and flush it for a reader."""
    # ensure_ascii: escape sequences and controls from documents are written as \u001b etc.,
    # never raw; a script that loads the JSON gets the text exactly as stored.
    text = json.dumps(data, indent=indent, default=_json_default, ensure_ascii=True)
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def error(message: str) -> None:
    """Print ``message`` to stderr, line by line through :func:`for_terminal`."""
    print("\n".join(for_terminal(line) for line in message.split("\n")), file=sys.stderr)


def cell(text: str | None) -> Text:
    """A table cell of text from the ledger, safe for the terminal."""
    return Text(for_terminal(text or ""))


def number(value: int) -> Text:
    """A count with thousands separators."""
    return Text(f"{value:,}")


def numbers(values: Iterable[int]) -> list[Text]:
    """:func:`number` of each value."""
    return [number(v) for v in values]


def _json_default(value: object) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def _syntax(code: str, lexer: str) -> Syntax:
    return Syntax(code, lexer, background_color="default", word_wrap=True)


def _shown(shown: int, matched: int) -> str:
    return f"{shown} of {matched}" if shown < matched else f"{matched} in all"


def _file_name(uri: str | None) -> str:
    return uri.rstrip("/").rsplit("/", 1)[-1] if uri else "?"


def _one_line(text: str | None, width: int) -> str:
    flat = " ".join((text or "").split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def _two_lines(first: str, second: str) -> Text:
    first, second = for_terminal(first), for_terminal(second)
    return Text.assemble(first, "\n", (second, "dim")) if second else Text(first)


def _when(moment: datetime | None) -> str:
    return moment.astimezone().strftime("%Y-%m-%d %H:%M") if moment else ""


def _duration(seconds: float) -> str:
    minutes = int(seconds // 60)
    if minutes < 60:
        return f"{minutes} min"
    return f"{minutes // 60} h {minutes % 60} min"
