"""Opens an HTML page in headless Chromium (Debian's ``chromium``, installed by ``make
test``) and reports what a person would see: the page is rendered by the real browser
with a probe script added to a copy of it, which, once the page has loaded, measures the
summary, every table, every image (``naturalWidth`` is 0 when an image failed to
load or decode) and whether the page is wider than the window; ``--dump-dom`` hands the
measurements back."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

WINDOW = (1280, 900)

_PROBE = """
<script>
window.addEventListener('load', () => {
  const box = e => { const r = e.getBoundingClientRect(); return {top: r.top, width: r.width, height: r.height}; };
  const summary = document.getElementById('summary');
  const found = {
    title: document.title,
    header: (document.querySelector('header') || {innerText: ''}).innerText,
    summary: summary ? summary.innerText : null,
    summaryBox: summary ? box(summary) : null,
    images: [...document.images].map(i => ({id: i.id, alt: i.alt, complete: i.complete,
                                             naturalWidth: i.naturalWidth, width: box(i).width})),
    tables: [...document.querySelectorAll('table')].map(t => ({
      id: t.id, columns: t.tHead ? t.tHead.rows[0].cells.length : 0,
      rows: t.tBodies.length ? t.tBodies[0].rows.length : 0, width: box(t).width,
      text: t.innerText})),
    pre: [...document.querySelectorAll('pre')].map(p => p.innerText),
    scrollWidth: document.documentElement.scrollWidth, innerWidth: window.innerWidth,
    innerHeight: window.innerHeight,
  };
  const out = document.createElement('pre');
  out.id = 'txmq-probe';
  out.textContent = JSON.stringify(found);
  document.body.appendChild(out);
});
</script>
"""


def chromium() -> str:
    path = shutil.which("chromium")
    assert path, "chromium is missing: `make test` installs Debian's chromium package"
    return path


def look_at(page: Path, timeout: float = 60.0) -> dict[str, Any]:
    """What the browser shows of ``page`` (a local HTML file)."""
    with tempfile.TemporaryDirectory(prefix="txmq-chromium-") as tmp:
        probed = Path(tmp) / "page.html"
        text = page.read_text()
        assert "</body>" in text, "not a complete HTML page"
        probed.write_text(text.replace("</body>", _PROBE + "</body>"))
        result = subprocess.run(
            [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp}/profile", f"--window-size={WINDOW[0]},{WINDOW[1]}",
             "--virtual-time-budget=5000", "--dump-dom", probed.as_uri()],
            capture_output=True, text=True, timeout=timeout)
    match = re.search(r'<pre id="txmq-probe">(.*?)</pre>', result.stdout, re.S)
    assert match, f"chromium rendered no probe (exit {result.returncode}): {result.stderr[-2000:]}"
    return json.loads(html.unescape(match.group(1)))
