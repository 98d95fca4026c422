"""MLflow's UI as a person uses it, in headless Chromium (``tests/helpers/browser.py``): it is a single-page app
that draws after it loads, so every question waits until the page can answer it."""

from __future__ import annotations

import json
import time
from typing import Any

from tests.helpers.browser import BrowserError, Page

WAIT = 90.0  # seconds: the UI's first draw over a real server takes 2-10 s on 2 busy cores

# the points a metric chart plots for one run, once its line is drawn: the chart's card (the plot's nearest
# ancestor whose legend names the metric in brackets) holds a plotly plot, which keeps its data on its element
# (the drawn path alone cannot say: plotly drops points that lie on a straight line)
CHART_POINTS_JS = """(() => {
  for (const plot of document.querySelectorAll('.js-plotly-plot')) {
    let card = plot;
    for (let up = 0; up < 8 && card && !card.textContent.includes('(%s)'); up++) card = card.parentElement;
    const drawn = card && card.textContent.includes('(%s)') && plot.querySelector('.scatterlayer path.js-line');
    if (drawn) return plot.data[0].x.length;
  }
  return 0;
})()"""
# types into a React input as a person does (React watches the input event, not the value)
TYPE_JS = """(() => {
  const input = document.querySelector('input[placeholder="%s"]');
  Object.getOwnPropertyDescriptor(HTMLInputElement.prototype, 'value').set.call(input, %s);
  input.dispatchEvent(new Event('input', {bubbles: true}));
})()"""


def wait_until(page: Page, expression: str, what: str, timeout: float = WAIT) -> Any:
    """The expression's value once it is truthy; a BrowserError naming ``what`` and the page's text if it never is."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := page.evaluate(expression):
            return value
        time.sleep(0.5)
    raise BrowserError(f"the UI never showed {what}; it shows:\n{text(page)[:2000]}")


def text(page: Page) -> str:
    return page.evaluate("document.body.innerText")


def shows(words: str) -> str:
    """An expression: the page's text contains ``words``."""
    return f"document.body.innerText.includes({json.dumps(words)})"


def click_in_row(page: Page, words: str) -> None:
    """Clicks the first button of the table row that contains ``words`` (a parent run's expander)."""
    page.evaluate(f"[...document.querySelectorAll('[role=row]')].find(r => r.innerText.includes({json.dumps(words)}))"
                  ".querySelector('button').click()")


def type_into(page: Page, placeholder: str, value: str) -> None:
    page.evaluate(TYPE_JS % (placeholder, json.dumps(value)))


def chart_points(metric: str) -> str:
    """An expression: the points on the drawn line of ``metric``'s chart (0 while it is not drawn)."""
    return CHART_POINTS_JS % (metric, metric)


def frame_text(page: Page) -> str:
    """The text of the page's first inner frame (an artifact viewer's iframe), as that frame renders it."""
    frames = page.call("Page.getFrameTree")["frameTree"].get("childFrames", [])
    if not frames:
        return ""
    context = page.call("Page.createIsolatedWorld", frameId=frames[0]["frame"]["id"])["executionContextId"]
    result = page.call("Runtime.evaluate", expression="document.body ? document.body.innerText : ''",
                       contextId=context, returnByValue=True)
    return result["result"].get("value", "")


def wait_for_frame(page: Page, words: str, timeout: float = WAIT) -> None:
    """Until the page's inner frame shows ``words``."""
    deadline = time.monotonic() + timeout
    while words not in (shown := frame_text(page)):
        if time.monotonic() > deadline:
            raise BrowserError(f"the UI's inner frame never showed {words!r}; it shows:\n{shown[:2000]}")
        time.sleep(0.5)
