"""A web view of a run: the peer network, each round's aggregation weights on its edges, who is
Byzantine and whether the honest clients shut them out, beside the run's accuracy, detection and
attack curves; served live while a run goes (``dfedrw run --view``), for any results folder
(``dfedrw view RUN_DIR``), or written as one self-contained HTML file (``--html FILE``).
Everything it serves comes from this package and the run's records: no network beyond the
machine the browser runs on, nothing fetched from elsewhere."""

from dfedrw.launch.view.records import NotARun, RunRecords, check_run_folder
from dfedrw.launch.view.server import ViewServer, page_html

__all__ = ["NotARun", "RunRecords", "ViewServer", "check_run_folder", "page_html", "export_html"]


def export_html(folder, dest) -> int:
    """Write the run in ``folder`` as one HTML file ``dest`` (script, style and records in it);
    returns the number of round records it holds."""
    from pathlib import Path

    data = RunRecords(folder).snapshot()
    Path(dest).write_text(page_html(None, data), encoding="utf-8")
    return len(data["records"])
