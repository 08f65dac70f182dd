"""The audit's human report: Markdown (or HTML) with PNG charts of state counts and
resolution latency, drawn with matplotlib's Agg backend (no display needed)."""

from __future__ import annotations

import html
import os
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402 - after choosing the backend

_STATE_COLUMNS = ("committed", "rolled_back", "discarded", "pending")


def _label(row: dict[str, Any]) -> str:
    return f"{row['producer_group']}\n{row['topic']}"


def state_chart(rows: list[dict[str, Any]], path: str) -> None:
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(rows) + 2), 4))
    bottom = [0] * len(rows)
    labels = [_label(r) for r in rows] or ["(none)"]
    for column in _STATE_COLUMNS:
        values = [r[column] for r in rows] or [0]
        ax.bar(labels, values, bottom=bottom or [0], label=column)
        bottom = [b + v for b, v in zip(bottom or [0], values)]
    ax.set_ylabel("transactions")
    ax.set_title("Transactions by final state, per producer group and topic")
    ax.legend()
    ax.tick_params(axis="x", labelsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def latency_chart(rows: list[dict[str, Any]], path: str) -> None:
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(rows) + 2), 4))
    labels = [_label(r) for r in rows] or ["(none)"]
    width = 0.25
    for i, q in enumerate(("p50_seconds", "p90_seconds", "p99_seconds")):
        values = [r[q] or 0.0 for r in rows] or [0.0]
        ax.bar([x + (i - 1) * width for x in range(len(labels))], values, width, label=q.split("_")[0])
    ax.set_xticks(range(len(labels)), labels)
    ax.set_ylabel("seconds (prepared → ended)")
    ax.set_title("Time to resolution")
    ax.legend()
    ax.tick_params(axis="x", labelsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _table(rows: list[dict[str, Any]], columns: list[str]) -> list[list[str]]:
    def fmt(v: Any) -> str:
        return f"{v:.3f}" if isinstance(v, float) else ("" if v is None else str(v))
    return [[fmt(r.get(c)) for c in columns] for r in rows]


def _markdown(result: Any, sections: list[tuple[str, list[str], list[list[str]]]]) -> str:
    lines = ["# txmq transaction audit", "",
             f"- transactions: {result.transactions}", f"- messages in topics: {result.messages}",
             f"- anomalies: **{result.anomalies}** " + (
                 "(" + ", ".join(f"{k}: {v}" for k, v in result.anomaly_counts.items() if v) + ")"
                 if result.anomalies else "(none)"),
             f"- audit time: {result.seconds:.1f} s", "",
             "![state counts](state_counts.png)", "", "![resolution latency](latency.png)", ""]
    for title, columns, rows in sections:
        lines += [f"## {title}", ""]
        if not rows:
            lines += ["(none)", ""]
            continue
        lines.append("| " + " | ".join(columns) + " |")
        lines.append("|" + "---|" * len(columns))
        lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
        lines.append("")
    return "\n".join(lines)


def _html(result: Any, sections: list[tuple[str, list[str], list[list[str]]]]) -> str:
    parts = ["<!doctype html><meta charset='utf-8'><title>txmq transaction audit</title>",
             "<h1>txmq transaction audit</h1>",
             f"<p>transactions: {result.transactions} — messages: {result.messages} — "
             f"anomalies: <b>{result.anomalies}</b> — {result.seconds:.1f} s</p>",
             "<img src='state_counts.png' alt='state counts'><img src='latency.png' alt='resolution latency'>"]
    for title, columns, rows in sections:
        parts.append(f"<h2>{html.escape(title)}</h2>")
        if not rows:
            parts.append("<p>(none)</p>")
            continue
        parts.append("<table border='1'><tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in columns) + "</tr>")
        parts += ["<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows]
        parts.append("</table>")
    return "\n".join(parts)


def write(result: Any, output: str, fmt: str = "md") -> str | None:
    """Writes the charts and ``report.md``/``report.html`` into ``output``; returns the
    report's path (None when ``output`` is not a local path)."""
    if output.startswith("file:"):
        output = "/" + output[len("file:"):].lstrip("/")
    elif "://" in output:
        return None
    os.makedirs(output, exist_ok=True)
    state_chart(result.state_counts, os.path.join(output, "state_counts.png"))
    latency_chart(result.latency, os.path.join(output, "latency.png"))
    state_cols = ["producer_group", "topic", "total", *_STATE_COLUMNS,
                  "source_client", "source_check", "source_operator", "source_broker"]
    latency_cols = ["producer_group", "topic", "resolved", "p50_seconds", "p90_seconds", "p99_seconds", "max_seconds"]
    checks_cols = ["producer_group", "topic", "checks_delivered", "transactions", "answers"]
    anomaly_cols = ["kind", "broker", "producer_group", "topic", "transaction_id", "message_id", "detail"]
    examples = [row for kind in sorted(result.anomaly_examples) for row in result.anomaly_examples[kind]]
    sections = [("Final states and resolution sources", state_cols, _table(result.state_counts, state_cols)),
                ("Time to resolution", latency_cols, _table(result.latency, latency_cols)),
                ("Checks per transaction", checks_cols, _table(result.checks, checks_cols)),
                ("Anomalies (examples; all in tables/anomalies)", anomaly_cols, _table(examples, anomaly_cols))]
    path = os.path.join(output, f"report.{fmt}")
    with open(path, "w") as f:
        f.write(_html(result, sections) if fmt == "html" else _markdown(result, sections))
    return path
