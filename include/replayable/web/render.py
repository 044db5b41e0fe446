"""HTML pages from the Jinja templates in ``templates/``, autoescaped, with their filters.

Every template renders with autoescaping on and strict undefined values, and no template
marks data safe: a value from the ledger is always text on the page. The pages carry no
script (see :data:`.security.SECURITY_HEADERS`).
"""

from __future__ import annotations

import json
import pathlib
from datetime import UTC, datetime
from http import HTTPStatus
from typing import Any, get_args

import jinja2
from fastapi.responses import HTMLResponse

from replayable.search.model import searched
from replayable.vocabulary import STAGES
from replayable.web.charts import CHART_BAR_W, CHART_H, CHART_HOURS, hour_label
from replayable.web.filters import LetterStatus, filter_time


def _when(moment: datetime | None) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if moment else ""


def _file_name(uri: str | None) -> str:
    return uri.rstrip("/").rsplit("/", 1)[-1] if uri else "?"


_templates = jinja2.Environment(
    loader=jinja2.FileSystemLoader(pathlib.Path(__file__).with_name("templates")),
    autoescape=True,  # every template, whatever its name: all output here is HTML
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
_templates.filters.update(
    when=_when,
    file_name=_file_name,
    filter_time=filter_time,
    hour_label=hour_label,
    usd=lambda amount: f"${amount:,.6f}",
    searched=searched,
    # Plain text: autoescaping escapes it like every other value.
    pretty_json=lambda value: json.dumps(value, indent=2, ensure_ascii=False),
)
_templates.globals.update(
    stages=STAGES,
    letter_statuses=get_args(LetterStatus),
    chart_w=CHART_HOURS * CHART_BAR_W,
    chart_h=CHART_H,
    chart_bar_w=CHART_BAR_W,
)


def page(name: str, *, root: str = "", status: int = HTTPStatus.OK, **context: Any) -> HTMLResponse:
    """Render a page; ``root`` leads from the page's URL back to the app's (for nested pages).

    ``airflow`` leads from the page to Airflow's base URL, for links into Airflow's UI: the
    app is mounted one level below it (at ``/replayable``), so it is ``root`` and ``../``.
    """
    html = _templates.get_template(name).render(
        page=name, root=root, airflow=f"{root}../", **context
    )
    return HTMLResponse(html, status_code=status)
