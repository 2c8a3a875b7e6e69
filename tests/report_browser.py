"""report.html as a reader sees it: laid out and painted by real headless Chromium.

`render(report_html, workdir)` runs Chromium twice on the same page at the same width:
once to read the layout (the box of every plot, its axes and its labels, measured by a
script injected into a copy of the page) and once to take a full-page screenshot. The
pixel checks then look inside those boxes of the screenshot.
"""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from PIL import Image

CHROMIUM = "/usr/bin/chromium"
WIDTH = 1280

# Runs after load; writes the layout as JSON into an attribute (no effect on the layout).
LAYOUT_JS = """
<script>
window.addEventListener('load', function () {
  function box(el) {
    var r = el.getBoundingClientRect();
    return {x: r.left + window.scrollX, y: r.top + window.scrollY, w: r.width, h: r.height};
  }
  var plots = {};
  document.querySelectorAll('figure.plot').forEach(function (fig) {
    var pid = fig.id.replace(/^plot-/, '');
    var axes = fig.querySelector('[id="' + pid + '-axes"]');
    var labels = [];
    fig.querySelectorAll('[id^="' + pid + '-phase-"]').forEach(function (g) {
      labels.push({text: g.textContent.trim(), box: box(g)});
    });
    var ticks = [];
    fig.querySelectorAll('g[id^="xtick_"] text').forEach(function (t) {
      ticks.push(t.textContent.trim());
    });
    var ids = [];
    fig.querySelectorAll('[id]').forEach(function (el) { ids.push(el.id); });
    plots[pid] = {figure: box(fig), axes: axes ? box(axes) : null, labels: labels,
                  xticks: ticks, ids: ids};
  });
  var missing = [];
  document.querySelectorAll('.not-measured[id^="missing-"]').forEach(function (p) {
    missing.push({pid: p.id.replace(/^missing-/, ''), text: p.textContent});
  });
  var meta = document.getElementById('metadata');
  document.body.setAttribute('data-layout', JSON.stringify({
    height: document.documentElement.scrollHeight,
    plots: plots,
    missing: missing,
    metadata: meta ? {box: box(meta), text: meta.innerText} : null,
    answer: (document.getElementById('answer') || {}).innerText || null
  }));
});
</script>
"""


@dataclass
class Box:
    """A rectangle in page pixels."""

    x: float
    y: float
    w: float
    h: float

    def inset(self, d: float) -> tuple[int, int, int, int]:
        """(left, top, right, bottom) shrunk by `d` pixels on each side."""
        return (
            round(self.x + d),
            round(self.y + d),
            round(self.x + self.w - d),
            round(self.y + self.h - d),
        )

    def overlaps(self, other: Box) -> bool:
        return not (
            self.x + self.w <= other.x
            or other.x + other.w <= self.x
            or self.y + self.h <= other.y
            or other.y + other.h <= self.y
        )


@dataclass
class PlotLayout:
    """Where one plot was laid out, and what its SVG holds."""

    figure: Box
    axes: Box | None
    labels: list[tuple[str, Box]]
    xticks: list[str]
    ids: list[str]


@dataclass
class Page:
    """The rendered report: layout and screenshot."""

    height: int
    plots: dict[str, PlotLayout]
    missing: dict[str, str]
    metadata: tuple[Box, str] | None
    answer: str | None
    screenshot: Image.Image
    shot_path: Path
    extra: dict[str, object] = field(default_factory=dict)


def _chromium(*args: str) -> str:
    with tempfile.TemporaryDirectory() as profile:
        out = subprocess.run(
            [
                CHROMIUM,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--hide-scrollbars",
                "--force-device-scale-factor=1",
                f"--user-data-dir={profile}",
                "--virtual-time-budget=3000",
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=180,
            check=True,
        )
    return out.stdout


def _box(d: dict[str, float]) -> Box:
    return Box(d["x"], d["y"], d["w"], d["h"])


def render(report_html: Path, workdir: Path) -> Page:
    """Lay out and screenshot `report_html` in headless Chromium."""
    probe = workdir / "layout-probe.html"
    text = report_html.read_text(encoding="utf-8")
    probe.write_text(text.replace("</body>", LAYOUT_JS + "</body>"), encoding="utf-8")
    dom = _chromium(f"--window-size={WIDTH},1000", "--dump-dom", probe.resolve().as_uri())
    found = re.search(r"data-layout=\"([^\"]*)\"", dom)
    assert found is not None, "the layout script did not run"
    import html

    data = json.loads(html.unescape(found.group(1)))
    height = int(data["height"])
    shot = workdir / "report.png"
    # The same width, tall enough for the whole page: the layout above still holds.
    _chromium(
        f"--window-size={WIDTH},{height}",
        f"--screenshot={shot}",
        report_html.resolve().as_uri(),
    )
    image = Image.open(shot).convert("RGB")
    plots = {
        pid: PlotLayout(
            figure=_box(p["figure"]),
            axes=_box(p["axes"]) if p["axes"] else None,
            labels=[(lbl["text"], _box(lbl["box"])) for lbl in p["labels"]],
            xticks=p["xticks"],
            ids=p["ids"],
        )
        for pid, p in data["plots"].items()
    }
    meta = data["metadata"]
    return Page(
        height=height,
        plots=plots,
        missing={m["pid"]: m["text"] for m in data["missing"]},
        metadata=(_box(meta["box"]), meta["text"]) if meta else None,
        answer=data["answer"],
        screenshot=image,
        shot_path=shot,
    )


def colored_pixels(image: Image.Image, area: tuple[int, int, int, int]) -> int:
    """Pixels in `area` with a clear hue: drawn data, not white, grey grid, black text."""
    px = image.crop(area).tobytes()
    return sum(1 for i in range(0, len(px), 3) if max(px[i : i + 3]) - min(px[i : i + 3]) > 80)


def dark_pixels(image: Image.Image, area: tuple[int, int, int, int]) -> int:
    """Pixels in `area` dark enough to be text."""
    px = image.crop(area).tobytes()
    return sum(1 for i in range(0, len(px), 3) if sum(px[i : i + 3]) < 300)
