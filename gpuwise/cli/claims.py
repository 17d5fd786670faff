"""`gpuwise claims`: the GPU explainer's claims, tested by small real experiments here."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from gpuwise.cli.common import Html, Json, app, emit, html_output, write_html
from gpuwise.errors import GpuwiseError

if TYPE_CHECKING:
    from gpuwise.app.claims import ClaimsAnswer
    from gpuwise.report.html.output import Page


@app.command()
def claims(
    quick: Annotated[bool, typer.Option(
        "--quick", help="smaller models, fewer runs: about a minute on 2 cores")] = False,
    only: Annotated[str | None, typer.Option(
        help="comma list of claims to test: memory, bandwidth, data-movement, quantized-cpu, "
             "pipeline, reproducibility, energy (default: all)", show_default=False)] = None,
    as_json: Json = False,
    html: Html = None,
) -> None:
    """Test the explainer's claims on this machine: memory, bandwidth, data movement, CPUs,
    data pipelines, reproducibility, energy; a verdict for each."""
    from gpuwise.app.claims import parse_only, run_claims
    from gpuwise.report.claims_view import claims_view
    from gpuwise.report.progress import progress_bar

    chosen = parse_only(only)
    html = html_output(html)  # refused before minutes of experiments, not after
    command = ("gpuwise claims" + (" --quick" if quick else "")
               + (f" --only {','.join(chosen)}" if only else "")
               + (f" --html {html}" if html else ""))
    try:
        with progress_bar(quiet=as_json) as progress:
            answer = run_claims(quick, chosen, progress, command)
    except KeyboardInterrupt:
        raise GpuwiseError("interrupted: no verdicts",
                           "run it again; --quick takes about a minute") from None
    emit(claims_view(answer), as_json)
    write_html(html, lambda _: _page(answer))


def _page(answer: ClaimsAnswer) -> Page:
    from gpuwise.report.html.claims import claims_page  # plotting only with --html

    return claims_page(answer)
