"""The report in a real browser (issue 24): headless Chromium loads report.html, and a probe script run
after the page's load event says whether every image decoded and whether anything sticks out of the
page body. Two spoiled copies (one image's bytes broken, one element wider than the page) must be
caught, so the probe is shown to see what it checks. The screenshot is kept in the test's tmp_path.

Skipped, with the reason, where no Chromium is installed: nothing is downloaded here.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from test_report import make_experiment  # noqa: E402
from truestep.analysis.report import write_report  # noqa: E402
from truestep.experiment.summary import summarize  # noqa: E402

pytestmark = pytest.mark.slow

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "headless_shell")
BROWSER = next((path for name in BROWSERS if (path := shutil.which(name))), None)
HEADLESS = ["--headless", "--no-sandbox", "--disable-gpu", "--window-size=1280,900"]

PROBE = """<script>
window.addEventListener('load', () => {
  const images = [...document.images];
  const broken = images.filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.alt);
  const right = document.body.getBoundingClientRect().right + 1;
  const sticking = [...document.querySelectorAll('body *')]
    .filter(e => e.getBoundingClientRect().right > right).map(e => e.tagName);
  const out = document.createElement('pre');
  out.id = 'probe';
  out.textContent = JSON.stringify({images: images.length, broken, sticking});
  document.body.appendChild(out);
});
</script>"""


def probe(page: Path, html: str) -> dict:
    """Load `html` (with the probe) from `page` in headless Chromium; the probe's findings."""
    page.write_text(html.replace("</body>", PROBE + "</body>"))
    assert BROWSER is not None
    cmd = [BROWSER, *HEADLESS, "--virtual-time-budget=10000", "--dump-dom", page.as_uri()]
    dom = subprocess.run(cmd, capture_output=True, text=True, timeout=120).stdout
    found = re.search(r'<pre id="probe">([^<]*)</pre>', dom)
    assert found is not None, dom[-2000:]
    return json.loads(found.group(1))


@pytest.mark.skipif(
    BROWSER is None, reason=f"no headless browser installed (looked for {', '.join(BROWSERS)})"
)
def test_every_image_loads_and_nothing_overflows_in_chromium(tmp_path: Path) -> None:
    out = tmp_path / "exp"
    make_experiment(out, faulted_perturb={8: 1e-3})
    _, html_path = write_report(out, summarize(out))
    html = html_path.read_text()
    embedded = html.count("data:image/png;base64,")
    # the floor envelope, loss and deviation for each of the 3 judged runs, the faulted run's timeline
    # (ablation cells draw none: their section is compact) and the ablation's goodput bars
    assert embedded == 1 + 3 * 2 + 1 + 1

    seen = probe(tmp_path / "probe.html", html)
    assert seen == {"images": embedded, "broken": [], "sticking": []}

    # The probe sees what it checks: a broken image and an element wider than the page.
    spoiled = re.sub(
        r"data:image/png;base64,[A-Za-z0-9+/]{64}", "data:image/png;base64," + "A" * 64, html, count=1
    )
    assert len(probe(tmp_path / "broken.html", spoiled)["broken"]) == 1
    wide = html.replace("</body>", '<div style="width: 4000px">wide</div></body>')
    assert probe(tmp_path / "wide.html", wide)["sticking"] == ["DIV"]

    shot = tmp_path / "report.png"
    cmd = [BROWSER, *HEADLESS, "--window-size=1280,2400", f"--screenshot={shot}", html_path.as_uri()]
    subprocess.run(cmd, capture_output=True, timeout=120, check=True)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
