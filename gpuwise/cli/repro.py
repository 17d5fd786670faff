"""`gpuwise repro`: how much of a training result is noise, by source of variation."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Annotated, Any

import typer

from gpuwise.cli.common import Command, Html, Json, app, emit, html_output, write_html, wrote
from gpuwise.errors import GpuwiseError

DEFAULT_RESULTS = "gpuwise-repro.jsonl"
# `--ray` with no address: ray.init()'s own choice (RAY_ADDRESS, a cluster here, or a new one).
RAY_DEFAULT = ""


class ReproCommand(Command):
    """`--ray` takes an optional address: given none (the next word is an option, `--`, or
    nothing), it gets RAY_DEFAULT."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        return super().parse_args(ctx, optional_value(args, "--ray", RAY_DEFAULT))


def optional_value(args: list[str], option: str, default: str) -> list[str]:
    """`args` with `default` after each bare `option` not followed by a value (before `--`)."""
    out: list[str] = []
    for i, arg in enumerate(args):
        if arg == "--":
            return out + args[i:]
        out.append(arg)
        if arg == option and (i + 1 == len(args) or args[i + 1].startswith("-")):
            out.append(default)
    return out


@app.command(cls=ReproCommand)
def repro(
    command: Annotated[list[str] | None, typer.Argument(
        help="the training command to run, after --", show_default=False)] = None,
    runs: Annotated[int, typer.Option(help="runs per condition")] = 5,
    conditions: Annotated[str | None, typer.Option(
        help="comma list of same-seed, deterministic, seeds, threads "
             "(default: all; threads only without a GPU)")] = None,
    parallel: Annotated[int, typer.Option(help="runs at a time (processes)")] = 1,
    devices: Annotated[str, typer.Option(
        "--cuda-visible-devices", help="comma list of CUDA_VISIBLE_DEVICES values, one per "
        "--parallel slot in turn, e.g. 0,1 (default: the runs see every device)",
        show_default=False)] = "",
    metric: Annotated[list[str] | None, typer.Option(
        help="NAME=REGEX read from the output (last match, group 1); repeatable")] = None,
    seed_flag: Annotated[str | None, typer.Option(
        help="the program's own seed option, e.g. --seed (the seed is also in GPUWISE_SEED)")] = None,
    seed: Annotated[int, typer.Option(help="the fixed seed; seeds runs use seed+1+i")] = 0,
    results: Annotated[Path, typer.Option(help="where each run's result is saved (JSON lines); "
                                               "an interrupted study resumes from it")] = Path(DEFAULT_RESULTS),
    fresh: Annotated[bool, typer.Option("--fresh", help="discard the results file first")] = False,
    detect: Annotated[str | None, typer.Option(
        help="difference to detect between two settings: 0.001, 0.3% or NAME=0.001")] = None,
    alpha: Annotated[float, typer.Option(help="test level for --detect, 0-1")] = 0.05,
    power: Annotated[float, typer.Option(help="power for --detect, 0-1")] = 0.8,
    timeout: Annotated[float | None, typer.Option(
        help="seconds before a run is killed (default: no limit)")] = None,
    ray: Annotated[str | None, typer.Option(
        "--ray", metavar="[ADDRESS]", show_default=False,
        help="run each replica as a Ray task on the cluster at ADDRESS (its head's host:port, "
             "or auto); with no ADDRESS: RAY_ADDRESS, else a Ray cluster started on this "
             "machine, else a new local one (docs/repro.md)")] = None,
    ray_cpus: Annotated[float | None, typer.Option(
        help="CPUs each replica asks Ray for (default 1)", show_default=False)] = None,
    ray_gpus: Annotated[float | None, typer.Option(
        help="GPUs each replica asks Ray for (default: 1 on a cluster with GPUs, else 0)",
        show_default=False)] = None,
    as_json: Json = False, html: Html = None,
) -> None:
    """Run a training command many times per condition: spread, arithmetic share, costs."""
    from gpuwise.app import repro as repro_app
    from gpuwise.report.progress import runs_bar
    from gpuwise.report.repro_view import repro_view

    html = html_output(html)
    if not command:
        raise GpuwiseError("no command to run", "gpuwise repro --runs 5 -- python train.py")
    if not (0 < alpha < 1 and 0 < power < 1):
        raise GpuwiseError(f"--alpha {alpha} and --power {power} must be between 0 and 1",
                           "for example --alpha 0.05 --power 0.8")
    detected = parse_detect(detect)
    settings: dict[str, Any] = {
        "runs": runs, "results": results, "base_seed": seed, "seed_flag": seed_flag,
        "metric_specs": tuple(metric or ()), "timeout_s": timeout}
    if ray is None:
        settings |= {"parallel": parallel,
                     "devices": tuple(d for d in devices.split(",") if d.strip())}
    with _ray_cluster(repro_app, ray, ray_cpus, ray_gpus, parallel != 1 or bool(devices.strip()),
                      (tuple(command), conditions, settings)) as cluster:
        gpu = cluster.gpus > 0 if cluster is not None else repro_app.has_gpu()
        study = repro_app.new_study(
            tuple(command), conditions or repro_app.default_conditions(gpu), **settings)
        try:
            with runs_bar(quiet=as_json) as progress:
                answer = repro_app.repro(study, fresh, gpu, detected, alpha, power, progress,
                                         cluster)
        except KeyboardInterrupt:
            raise GpuwiseError(f"interrupted; finished runs are saved in {results}",
                               "run the same command again to resume") from None
    view = repro_view(answer)
    emit(view, as_json)
    if as_json:  # the terminal view names it in its first line
        wrote(results, "each run's result; the same command resumes from it")
    write_html(html, lambda pages: pages.repro_page(answer))


def _ray_cluster(repro_app: Any, ray: str | None, cpus: float | None, gpus: float | None,
                 local_slots: bool, study: tuple[Any, ...]) -> AbstractContextManager[Any]:
    """The Ray cluster to run on, connected on entering (nothing without --ray); every option
    is checked first, so that a bad one costs no connection and touches no file."""
    if ray is None:
        if cpus is not None or gpus is not None:
            raise GpuwiseError("--ray-cpus and --ray-gpus need --ray",
                               "add --ray [ADDRESS], or leave them out to run here")
        return nullcontext(None)
    if local_slots:
        raise GpuwiseError("--parallel and --cuda-visible-devices do not apply with --ray",
                           "Ray places the replicas and gives each its GPUs: set what each "
                           "asks for with --ray-cpus and --ray-gpus")
    command, conditions, settings = study
    repro_app.new_study(command, conditions or "seeds", **settings)  # checks, connects nothing
    return repro_app.ray_cluster(ray, 1.0 if cpus is None else cpus, gpus)  # type: ignore[no-any-return]


def parse_detect(text: str | None) -> tuple[dict[str, float], bool]:
    """`0.001`, `0.3%` (of the metric's mean) or `NAME=0.001` -> ({metric or '*': diff}, relative)."""
    if not text:
        return {}, False
    name, sep, value = text.rpartition("=")
    value = value.strip()
    relative = value.endswith("%")
    try:
        number = float(value.rstrip("%")) / (100.0 if relative else 1.0)
    except ValueError:
        raise GpuwiseError(f"--detect {text[:40]!r} is not a number",
                           "for example --detect 0.001, --detect 0.3% or --detect acc=0.002") from None
    if not 0 < number < float("inf"):  # NaN too
        raise GpuwiseError(f"--detect must be a positive number, got {text[:40]!r}",
                           "for example --detect 0.3%")
    return {(name.strip() if sep else "*"): number}, relative
