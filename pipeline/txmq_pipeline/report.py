"""The audit's human report: a self-contained HTML page (styles inline, charts embedded
as ``data:`` PNGs, so the one file can be mailed or attached to a ticket) and the same in
Markdown (charts as PNG files beside it). Charts are drawn with matplotlib's Agg backend
(no display needed).

Top to bottom: a header (cluster, when it was made, the pending threshold), one line that
says whether all is well, the anomalies with their ids, details and the command an
operator runs next, then final states, time to resolution (a CDF on a log axis per
producer group and topic, plus its percentiles) and checks per transaction."""

from __future__ import annotations

import base64
import datetime as dt
import html
import io
import math
import os
import shlex
from dataclasses import dataclass
from typing import Any, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # after choosing the backend

_STATE_COLUMNS = ("committed", "rolled_back", "discarded", "pending")
_STATE_COLORS = {"committed": "#2e7d32", "rolled_back": "#607d8b", "discarded": "#c62828", "pending": "#f9a825"}

#: What an operator does about each kind of anomaly.
ADVICE = {
    "pending_too_old": "Prepared and never decided. Look at it first; then find out from the producer's own "
                       "database whether its local transaction committed, and decide to match it (no decision "
                       "is filled in: the wrong one loses or invents work):",
    "discarded_unresolved": "The checks ran out without an answer. Look at it first; decide it only once the "
                            "producer's database says what happened:",
    "committed_missing": "Committed, but its message is in no topic: data loss on the broker. Inspect it:",
    "uncommitted_in_topic": "A consumer could read a message whose transaction is not committed. Inspect it:",
    "duplicate_message_id": "One message id at several offsets: consumers see it twice. Inspect it:",
}
#: What an undecided transaction's decision looks like, once the operator knows it: a
#: template, not a command (it runs nothing as pasted: COMMIT_OR_ROLLBACK is no option).
DECIDE = "txn resolve {tid} --COMMIT_OR_ROLLBACK --reason 'audit: {kind}: <what the database shows>'"
TITLES = {
    "pending_too_old": "Pending too long", "discarded_unresolved": "Discarded, not resolved",
    "committed_missing": "Committed but missing from the topic", "uncommitted_in_topic": "In a topic, not committed",
    "duplicate_message_id": "Duplicate message id",
}
_RESOLVABLE = ("pending_too_old", "discarded_unresolved")


def commands(kind: str, row: dict[str, Any], nameserver: str) -> list[str]:
    """What an operator runs for one anomaly, first to last: always ``txn describe`` of its
    transaction (``message get`` when only a message id is known), ids whole; for an
    undecided transaction (pending, discarded) how to decide, as a comment — never a
    decision filled in."""
    base = ["txmq", "--nameserver", nameserver]
    tid = row.get("transaction_id") or ""
    mid = row.get("message_id") or ""
    out = []
    if tid:
        out.append(shlex.join([*base, "txn", "describe", tid]))
    elif mid:
        out.append(shlex.join([*base, "message", "get", mid]))
    if kind in _RESOLVABLE and tid:
        out.append("#   then, when the producer's database shows the outcome: "
                   + shlex.join(base) + " " + DECIDE.format(tid=tid, kind=kind))
    return out


def command(kind: str, row: dict[str, Any], nameserver: str) -> str:
    """:func:`commands` as one block of lines."""
    return "\n".join(commands(kind, row, nameserver))


# ----------------------------------------------------------------------------- charts

def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()


def _short(text: str, width: int = 28) -> str:
    return text if len(text) <= width else text[:width // 2 - 1] + "…" + text[-(width // 2):]


def _series_label(row: dict[str, Any]) -> str:
    """A chart label that fits (the tables carry the full names)."""
    return f"{_short(row['producer_group'])} / {_short(row['topic'])}"


def state_chart(rows: list[dict[str, Any]]) -> bytes:
    """Horizontal stacked bars, one per producer group and topic (labels stay readable
    however many there are)."""
    fig, ax = plt.subplots(figsize=(9, max(2.6, 0.45 * len(rows) + 1.8)))
    labels = [_series_label(r) for r in rows] or ["(no transactions)"]
    left = [0] * len(labels)
    for column in _STATE_COLUMNS:
        values = [r[column] for r in rows] or [0]
        ax.barh(labels, values, left=left, label=column.replace("_", " "), color=_STATE_COLORS[column])
        left = [a + b for a, b in zip(left, values)]
    ax.invert_yaxis()
    ax.set_xlabel("transactions")
    ax.legend(ncol=4, fontsize=8, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
    ax.tick_params(axis="y", labelsize=8)
    return _png(fig)


def latency_chart(histogram: list[dict[str, Any]]) -> bytes:
    """Time to resolution as a CDF per producer group and topic on a log time axis: a
    p50 of 1 ms and a p99 of 4 s are both readable."""
    groups = len({(r["producer_group"], r["topic"]) for r in histogram})
    fig, ax = plt.subplots(figsize=(9, 4.4 + 0.22 * ((groups + 1) // 2)))
    series: dict[str, list[tuple[float, int]]] = {}
    for r in histogram:
        series.setdefault(_series_label(r), []).append((r["upper_seconds"], r["transactions"]))
    for label, points in sorted(series.items()):
        points.sort()
        total = sum(n for _, n in points)
        xs, ys, seen = [], [], 0
        for upper, n in points:
            seen += n
            xs.append(upper)
            ys.append(seen / total)
        ax.step(xs, ys, where="post", label=f"{label} (n={total})", marker=".")
    ax.set_xscale("log")
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("seconds from prepare to commit/rollback (log scale)")
    ax.set_ylabel("fraction resolved within")
    ax.set_title("Time to resolution (CDF)")
    for q in (0.5, 0.9, 0.99):
        ax.axhline(q, color="#bbb", linewidth=0.8, linestyle="--")
    ax.grid(True, which="major", axis="x", color="#eee")
    if series:
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
    else:
        ax.text(0.5, 0.5, "no resolved transactions", ha="center", transform=ax.transAxes)
    return _png(fig)


# ----------------------------------------------------------------------------- content

@dataclass(frozen=True)
class Section:
    title: str
    columns: Sequence[str]
    rows: list[list[str]]
    note: str = ""


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return "" if math.isnan(v) else (f"{v:.3f}" if abs(v) < 100 else f"{v:,.1f}")
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    return "" if v is None else str(v)


def _cells(rows: list[dict[str, Any]], columns: Sequence[str]) -> list[list[str]]:
    return [[_fmt(r.get(c)) for c in columns] for r in rows]


def summary_line(result: Any) -> str:
    """One line: is all well?"""
    if not result.anomalies:
        return (f"All is well: {result.transactions:,} transactions and {result.messages:,} messages "
                "reconciled, no anomaly.")
    parts = ", ".join(f"{n:,} {TITLES[k].lower()}" for k, n in result.anomaly_counts.items() if n)
    return f"Attention: {result.anomalies:,} anomal{'y' if result.anomalies == 1 else 'ies'} ({parts})."


def _generated(result: Any) -> str:
    ms = getattr(result, "generated_at_ms", None)
    when = dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC) if ms else dt.datetime.now(dt.UTC)
    return when.strftime("%Y-%m-%d %H:%M:%S UTC")


def _sections(result: Any) -> list[Section]:
    state_cols = ["producer_group", "topic", "total", *_STATE_COLUMNS,
                  "source_client", "source_check", "source_operator", "source_broker"]
    latency_cols = ["producer_group", "topic", "resolved", "p50_seconds", "p90_seconds", "p99_seconds",
                    "max_seconds"]
    checks_cols = ["producer_group", "topic", "checks_delivered", "transactions", "answers"]
    return [Section("Final states and who decided", state_cols, _cells(result.state_counts, state_cols)),
            Section("Time to resolution (seconds)", latency_cols, _cells(result.latency, latency_cols)),
            Section("Checks per transaction", checks_cols, _cells(result.checks, checks_cols))]


def _anomaly_rows(result: Any, nameserver: str) -> list[tuple[str, list[dict[str, Any]]]]:
    return [(kind, [{**row, "command": command(kind, row, nameserver)} for row in result.anomaly_examples[kind]])
            for kind in result.anomaly_counts if result.anomaly_examples.get(kind)]


_ANOMALY_COLUMNS = ("transaction_id", "message_id", "broker", "producer_group", "topic", "detail")

# ----------------------------------------------------------------------------- Markdown

def _md_table(columns: Sequence[str], rows: list[list[str]]) -> list[str]:
    if not rows:
        return ["(none)", ""]
    out = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    out += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return out + [""]


def markdown(result: Any, nameserver: str, threshold: float) -> str:
    lines = ["# txmq transaction audit", "",
             f"Cluster `{nameserver}` · made {_generated(result)} · pending threshold {threshold:g} s · "
             f"{result.seconds:.1f} s to run", "", f"**{summary_line(result)}**", ""]
    lines += ["## Anomalies", ""]
    anomalies = _anomaly_rows(result, nameserver)
    if not anomalies:
        lines += ["None.", ""]
    for kind, rows in anomalies:
        count = result.anomaly_counts[kind]
        lines += [f"### {TITLES[kind]} ({count:,}{', first ' + str(len(rows)) if count > len(rows) else ''})", "",
                  ADVICE[kind], "", "```", *(r["command"] for r in rows), "```", ""]
        lines += _md_table(_ANOMALY_COLUMNS, _cells(rows, _ANOMALY_COLUMNS))
    lines += ["![final states](state_counts.png)", "", "![time to resolution](latency.png)", ""]
    for s in _sections(result):
        lines += [f"## {s.title}", ""] + _md_table(s.columns, s.rows)
    return "\n".join(lines)


# ----------------------------------------------------------------------------- HTML

_CSS = """
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1d2733;margin:0;background:#f4f6f8}
main{max-width:1100px;margin:0 auto;padding:0 16px 40px}
header{background:#1d2733;color:#fff;padding:18px 16px}
header .inner{max-width:1100px;margin:0 auto}
header h1{margin:0 0 4px;font-size:22px}
header .meta{color:#c5d0db;font-size:13px}
header code{color:#fff}
.summary{margin:18px 0;padding:14px 18px;border-radius:8px;font-size:16px;font-weight:600}
.summary.ok{background:#e6f4ea;color:#1e5e2b;border:1px solid #a8d5b3}
.summary.bad{background:#fdecea;color:#8a1c1c;border:1px solid #f1aaa5}
section{background:#fff;border:1px solid #dde3e9;border-radius:8px;padding:14px 18px;margin:16px 0}
h2{font-size:17px;margin:0 0 10px}
h3{font-size:15px;margin:14px 0 6px}
.scroll{overflow-x:auto;max-width:100%}
table{border-collapse:collapse;width:100%;font-size:12.5px;table-layout:auto}
th,td{border-bottom:1px solid #e6ebf0;padding:5px 8px;text-align:left;vertical-align:top;overflow-wrap:anywhere}
th{background:#f0f3f6;font-weight:600;overflow-wrap:normal}
td:not(.num){min-width:8ch}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
td.id,pre{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12px}
pre{background:#f6f8fa;border:1px solid #e1e6eb;border-radius:6px;padding:8px 10px;white-space:pre-wrap;
    overflow-wrap:anywhere;margin:6px 0}
figure{margin:0}
img{max-width:100%;height:auto;display:block;margin:6px auto}
.count{color:#8a1c1c}
footer{color:#6b7785;font-size:12px;text-align:center}
"""

_NUMERIC = {"total", "committed", "rolled_back", "discarded", "pending", "source_client", "source_check",
            "source_operator", "source_broker", "resolved", "p50_seconds", "p90_seconds", "p99_seconds",
            "max_seconds", "checks_delivered", "transactions", "answers"}


def _html_table(columns: Sequence[str], rows: list[list[str]], table_id: str) -> str:
    if not rows:
        return "<p>(none)</p>"
    head = "".join(f"<th>{html.escape(c.replace('_', ' '))}</th>" for c in columns)
    klass = ["num" if c in _NUMERIC else ("id" if c.endswith("_id") else "") for c in columns]
    body = "".join("<tr>" + "".join(f"<td class='{k}'>{html.escape(v)}</td>" for k, v in zip(klass, row))
                   + "</tr>" for row in rows)
    return f"<div class='scroll'><table id='{table_id}'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>"


def _img(png: bytes, alt: str, img_id: str) -> str:
    data = base64.b64encode(png).decode("ascii")
    return f"<figure><img id='{img_id}' alt='{html.escape(alt)}' src='data:image/png;base64,{data}'></figure>"


def html_page(result: Any, nameserver: str, threshold: float, charts: dict[str, bytes]) -> str:
    esc = html.escape
    ok = not result.anomalies
    parts = ["<!doctype html><html lang='en'><head><meta charset='utf-8'>",
             "<meta name='viewport' content='width=device-width, initial-scale=1'>",
             f"<title>txmq audit · {esc(nameserver)} · {_generated(result)}</title><style>{_CSS}</style></head><body>",
             "<header><div class='inner'><h1>txmq transaction audit</h1>",
             f"<div class='meta'>cluster <code>{esc(nameserver)}</code> · made {_generated(result)} · "
             f"pending threshold {threshold:g} s · {result.transactions:,} transactions, "
             f"{result.messages:,} messages · {result.seconds:.1f} s to run</div></div></header><main>",
             f"<p id='summary' class='summary {'ok' if ok else 'bad'}'>{esc(summary_line(result))}</p>",
             "<section id='anomalies'><h2>Anomalies</h2>"]
    anomalies = _anomaly_rows(result, nameserver)
    if not anomalies:
        parts.append("<p>None: every committed transaction's message is in its topic exactly once, no message "
                     "of an undecided transaction is visible, nothing is stuck.</p>")
    for kind, rows in anomalies:
        count = result.anomaly_counts[kind]
        shown = f" — first {len(rows)}, all in tables/anomalies" if count > len(rows) else ""
        parts += [f"<h3>{esc(TITLES[kind])} <span class='count'>({count:,}{shown})</span></h3>",
                  f"<p>{esc(ADVICE[kind])}</p>",
                  "<pre>" + esc("\n".join(r["command"] for r in rows)) + "</pre>",
                  _html_table(_ANOMALY_COLUMNS, _cells(rows, _ANOMALY_COLUMNS), f"anomalies-{kind}")]
    parts.append("</section>")
    parts += ["<section id='states'><h2>Final states</h2>", _img(charts["state_counts"], "final states", "chart-states")]
    sections = _sections(result)
    parts += [_html_table(sections[0].columns, sections[0].rows, "table-states"), "</section>",
              "<section id='latency'><h2>Time to resolution</h2>",
              _img(charts["latency"], "time to resolution, CDF on a log axis", "chart-latency"),
              _html_table(sections[1].columns, sections[1].rows, "table-latency"), "</section>",
              "<section id='checks'><h2>Checks per transaction</h2>",
              _html_table(sections[2].columns, sections[2].rows, "table-checks"), "</section>",
              "<footer>Parquet tables of every figure (and every anomaly) are in <code>tables/</code>; "
              "<code>summary.json</code> has the same figures for machines.</footer></main></body></html>"]
    return "\n".join(parts)


# ----------------------------------------------------------------------------- files

def write(result: Any, output: str, fmt: str = "both", *, nameserver: str = "", threshold: float = 0.0
          ) -> list[str]:
    """Writes ``report.html`` and/or ``report.md`` (with ``state_counts.png`` and
    ``latency.png``) into ``output``; returns the reports' paths (none when ``output`` is
    not a local path)."""
    if output.startswith("file:"):
        output = "/" + output[len("file:"):].lstrip("/")
    elif "://" in output:
        return []
    os.makedirs(output, exist_ok=True)
    charts = {"state_counts": state_chart(result.state_counts),
              "latency": latency_chart(getattr(result, "latency_histogram", []))}
    written = []
    if fmt in ("md", "both"):
        for name, png in charts.items():
            with open(os.path.join(output, f"{name}.png"), "wb") as f:
                f.write(png)
        path = os.path.join(output, "report.md")
        with open(path, "w") as f:
            f.write(markdown(result, nameserver, threshold))
        written.append(path)
    if fmt in ("html", "both"):
        path = os.path.join(output, "report.html")
        with open(path, "w") as f:
            f.write(html_page(result, nameserver, threshold, charts))
        written.insert(0, path)
    return written
