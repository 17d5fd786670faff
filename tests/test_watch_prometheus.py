"""`gpuwise watch --prometheus`: the metrics on hand-made logs (the report's verdict, bounded
series), the HTTP exporter, bad input (a port in use, a malformed HOST:PORT), the Grafana
dashboard and alert rules against what is exported (`promtool`), and a real Prometheus
scraping a watched job on loopback, queried through its HTTP API."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuwise.errors import GpuwiseError
from gpuwise.estimate.watch.log_records import parse_records
from gpuwise.estimate.watch.metric_families import METRICS, metric_names
from gpuwise.estimate.watch.metrics import MAX_STEPS, MEMORY_POINTS, LiveWindow, Thinned
from gpuwise.estimate.watch.summary import summarize
from gpuwise.estimate.watch.verdict import verdict
from gpuwise.measure.watch.exporter import SERVED_ENV, default_job_name, parse_listen

REPO = Path(__file__).resolve().parents[1]
DASHBOARD = REPO / "deploy" / "grafana" / "gpuwise-watch.json"
RULES = REPO / "deploy" / "prometheus" / "gpuwise-alerts.yml"
RULE_TESTS = REPO / "deploy" / "prometheus" / "gpuwise-alerts.test.yml"
JOB = str(REPO / "tests" / "watch_prometheus_job.py")
GPUWISE = [sys.executable, "-c", "from gpuwise.cli import main; main()"]
BIN = Path(sys.executable).parent
PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
NO_PROMETHEUS = "needs Prometheus: Debian's `prometheus` package (.ci/run installs it)"
T0 = 1_700_000_000.0


# --------------------------------------------------------------------- hand-made logs


def records(ranks: int = 2, steps: int = 100, gpu: bool = True, creep: bool = True,
            t0: float = T0, step_start: int = 0) -> list[dict]:
    """A log's records: rank 1 waits 50 ms for data (input-bound, the straggler), rank 0
    10 ms; RSS grows 5 MB a step; samples every 0.2 s with one GPU (or none)."""
    out: list[dict] = [{"kind": "header", "format": "gpuwise-watch/1", "cmd": ["train.py"],
                        "t": t0, "host": "node1", "interval_s": 0.2,
                        "gpus": ["NVIDIA H100 80GB HBM3"] if gpu else [], "inject": True,
                        "unavailable": {}}]
    span = 0.0
    for rank in range(ranks):
        t = t0
        for i in range(step_start, step_start + steps):
            data = 0.05 if rank == 1 else 0.01
            step = 0.1 + data
            out.append({"kind": "step", "rank": rank, "world": ranks, "pid": 100 + rank,
                        "source": "inject", "step": i, "t_start": t, "step_s": step,
                        "data_s": data, "h2d_s": 0.0, "forward_s": 0.0,
                        "backward_s": 0.08 - (0.04 if rank == 1 else 0.0), "optimizer_s": 0.01,
                        "samples": 32, "ops": None, "counted": False,
                        "rss_bytes": 10**9 + (i * 5 * 10**6 if creep else 0),
                        "device_mem_bytes": 2 * 10**9 if gpu else None})
            t += step
        span = max(span, t - t0)
    for i in range(int(span / 0.2) + 1):
        gpus = [{"index": 0, "util_percent": 40, "sm_percent": 30, "mem_used_bytes": 10 * 2**30,
                 "mem_total_bytes": 80 * 2**30, "power_w": 300.0,
                 "energy_j": 1000.0 + 60.0 * i}] if gpu else []
        out.append({"kind": "sample", "t": t0 + 0.2 * i, "cpu_percent": 50.0,
                    "per_core": [50.0, 50.0], "iowait_percent": 1.0,
                    "rss_bytes": 2 * 10**9, "gpus": gpus, "cpu_energy_j": 20.0 * i})
    return out


def served(window: LiveWindow, **labels: str) -> dict[tuple, float]:
    """{(sample name, sorted labels without job and host): value}."""
    out = {}
    for family in window.families("train", "node1", 64 * 2**30, "test"):
        for name, got, value in family.samples:
            assert got.pop("job") == "train" and got.pop("host") == "node1"
            out[(name, tuple(sorted(got.items())))] = value
    return out


def value(metrics: dict[tuple, float], metric: str, **labels: object) -> float | None:
    return metrics.get((f"gpuwise_watch_{metric}",
                        tuple(sorted((k, str(v)) for k, v in labels.items()))))


def test_the_served_verdict_is_the_reports():
    recs = records()
    window = LiveWindow(window_s=3600)
    window.feed(recs)
    got = served(window)
    report = verdict(summarize(parse_records(recs)))
    assert report.bound == "input-bound"
    assert value(got, "verdict", verdict="input_bound") == 1
    assert value(got, "verdict", verdict="compute_bound") == 0
    assert value(got, "finding", finding="stragglers") == 1
    assert value(got, "finding", finding="memory_creep") == 1
    assert value(got, "straggler", rank=1) == 1 and value(got, "straggler", rank=0) == 0
    # the evidence is the summary's numbers, with the thresholds it was judged against
    share = value(got, "evidence", finding="input_bound", measure="input_share_ratio")
    assert share == pytest.approx(summarize(parse_records(recs)).phase_share["data"])
    assert value(got, "evidence_threshold", finding="input_bound",
                 measure="input_share_ratio") == 0.2
    assert value(got, "evidence", finding="stragglers", measure="before_sync_seconds") == \
        pytest.approx(0.1)
    assert value(got, "before_sync_seconds", rank=0) == pytest.approx(0.02)
    # per rank: steps, step-time quantiles, phase shares; counters with the summary's sums
    assert value(got, "steps_total", rank=1) == 100
    assert value(got, "step_seconds", rank=1, quantile=0.5) == pytest.approx(0.15)
    assert value(got, "step_seconds_count", rank=0) == 100
    assert value(got, "step_seconds_sum", rank=0) == pytest.approx(11.0)
    assert value(got, "phase_share_ratio", rank=1, phase="data") == pytest.approx(1 / 3)
    assert value(got, "phase_seconds_total", rank=1, phase="backward") == pytest.approx(4.0)
    assert value(got, "phase_step_seconds", rank=0, phase="optimizer") == pytest.approx(0.01)
    assert value(got, "samples_per_second", rank=0) == pytest.approx(32 / 0.11)
    # sensors: the latest sample; energy: the counters' increase; creep: per second
    assert value(got, "gpu_memory_total_bytes", device=0) == 80 * 2**30
    assert value(got, "gpu_utilization_ratio", device=0) == pytest.approx(0.4)
    assert value(got, "gpu_info", device=0, name="NVIDIA H100 80GB HBM3") == 1
    assert value(got, "power_watts", source="gpu") == pytest.approx(300.0)
    last = [r for r in recs if r["kind"] == "sample"][-1]
    assert value(got, "energy_joules_total", source="gpu") == pytest.approx(
        last["gpus"][0]["energy_j"] - 1000.0)
    assert value(got, "memory_growth_bytes_per_second", memory="rss") == pytest.approx(
        5e6 / 0.13, rel=0.2)  # 5 MB per step of the steepest process
    assert value(got, "host_memory_total_bytes") == 64 * 2**30


def test_every_family_is_served_and_the_series_do_not_grow_with_steps():
    def count(steps: int) -> tuple[set[str], int]:
        window = LiveWindow()
        window.feed(records(steps=steps))
        got = served(window)
        return {name for name, _ in got}, len(got)

    names, few = count(60)
    _, many = count(600)
    assert many == few  # nothing per step: the series are the same for 60 steps and 600
    declared = metric_names()
    assert names <= declared
    # one log with GPUs, two ranks and every finding serves every declared family
    assert declared - names == set()


def test_the_window_moves_and_the_counters_keep_counting():
    window = LiveWindow(window_s=5.0)
    window.feed(records(ranks=1, steps=100, creep=False))
    # the job turns compute-bound: steps without waiting, after the first ones
    later = [r for r in records(ranks=1, steps=100, gpu=False, creep=False, t0=T0 + 11.0,
                                step_start=100) if r["kind"] != "header"]
    for r in later:
        if r["kind"] == "step":
            r["step_s"], r["data_s"] = 0.1, 0.0
    window.feed(later)
    got = served(window)
    assert value(got, "verdict", verdict="compute_bound") == 1
    assert value(got, "steps_total", rank=0) == 200
    kept = window.steps[0]  # the last 5 s of steps (started 0.11 s apart)
    assert len(kept) == 46 and kept[0].t_end >= window.now - 5.0 > kept[0].t_start - 0.11
    assert value(got, "phase_seconds_total", rank=0, phase="data") == pytest.approx(1.0)


def test_memory_creep_is_judged_over_the_whole_run_as_the_report_does():
    # 30 kB a step: 90 MB over 3000 steps, under 32 MiB in the window (at most MAX_STEPS)
    recs = records(ranks=1, steps=3000, gpu=False)
    for r in recs:
        if r["kind"] == "step":
            r["rss_bytes"] = 10**9 + r["step"] * 30_000
    window = LiveWindow(window_s=3600)
    window.feed(recs)
    assert len(window.steps[0]) == MAX_STEPS and len(window.memory_steps[0]) <= MEMORY_POINTS
    assert 30_000 * MAX_STEPS < 32 * 2**20  # what the window alone holds is no creep
    assert "memory-creep" in {f.kind for f in verdict(summarize(parse_records(recs))).findings}
    got = served(window)
    assert value(got, "finding", finding="memory_creep") == 1
    assert value(got, "evidence", finding="memory_creep", measure="rss_growth_bytes") == \
        pytest.approx(0.8 * 90e6, rel=0.02)  # after the report's 20% warm-up


def test_thinned_keeps_evenly_spread_items():
    kept = Thinned(cap=8)
    for i in range(100):
        kept.add(i)
    assert list(kept) == [0, 16, 32, 48, 64, 80, 96] and kept.stride == 16


def test_one_ranks_window_and_no_gpu():
    window = LiveWindow(rank=1)
    window.feed(records(gpu=False, creep=False))
    got = served(window)
    assert {dict(labels).get("rank") for _, labels in got} <= {None, "1"}
    assert value(got, "verdict", verdict="input_bound") == 1
    assert not [k for k in got if k[0].startswith("gpuwise_watch_gpu_")]
    assert value(got, "straggler", rank=1) is None  # one rank: nobody to hold back


def test_listen_addresses():
    assert parse_listen("9400") == ("0.0.0.0", 9400)
    assert parse_listen(9400) == ("0.0.0.0", 9400)
    assert parse_listen(":9400") == ("0.0.0.0", 9400)
    assert parse_listen("127.0.0.1:0") == ("127.0.0.1", 0)
    assert parse_listen("node-3.cluster:9400") == ("node-3.cluster", 9400)
    assert parse_listen("[::1]:9400") == ("::1", 9400)
    for bad in ("", "host:", "host:port", "70000", "-1", "::1:9400", "[::1]", "[::1]9400",
                "a b:9400", "9400.5", "١٢٣"):
        with pytest.raises(GpuwiseError, match=r"is not \[HOST:\]PORT"):
            parse_listen(bad)


def test_default_job_names(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_NAME", raising=False)
    assert default_job_name(["torchrun", "--nproc_per_node", "8", "train.py", "--lr", "1"]) == "train"
    assert default_job_name(["python", "-m", "pkg.fit"]) == "pkg.fit"
    assert default_job_name(["/usr/bin/run-job"]) == "run-job"
    monkeypatch.setenv("SLURM_JOB_NAME", "llama-sft")
    assert default_job_name(["python", "train.py"]) == "llama-sft"


# --------------------------------------------------------------------- the HTTP exporter


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return response.read().decode()


def parsed(text: str) -> dict[str, list]:
    from prometheus_client.parser import text_string_to_metric_families

    return {f.name: f.samples for f in text_string_to_metric_families(text)}


@contextlib.contextmanager
def busy_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def test_the_server_serves_a_logs_metrics_from_its_own_registry(tmp_path):
    prometheus_client = pytest.importorskip("prometheus_client")
    from gpuwise.measure.watch.exporter import serve

    log = tmp_path / "run.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in records()))
    server = serve("127.0.0.1:0")
    try:
        assert scrape(server.url) == ""  # bound, nothing attached yet
        server.attach(log, "train", refresh_s=0.0)
        families = parsed(scrape(server.url))
    finally:
        server.close()
    assert {spec.name.removesuffix("_total") for spec in METRICS} <= set(families)
    verdicts = {s.labels["verdict"]: s.value for s in families["gpuwise_watch_verdict"]}
    assert verdicts == {"input_bound": 1, "host_bound": 0, "compute_bound": 0, "no_steps": 0}
    assert {s.labels["host"] for s in families["gpuwise_watch_verdict"]} == {socket.gethostname()}
    steps = {(s.name, s.labels["rank"]): s.value for s in families["gpuwise_watch_steps"]}
    assert steps == {("gpuwise_watch_steps_total", "0"): 100, ("gpuwise_watch_steps_total", "1"): 100}
    assert not [m for m in prometheus_client.REGISTRY.collect() if m.name.startswith("gpuwise")]
    with pytest.raises(OSError):  # closed: the port is free again, nobody answers
        scrape(server.url)


def test_a_failing_computation_keeps_the_last_metrics_and_says_so_once(tmp_path, capsys):
    pytest.importorskip("prometheus_client")
    from gpuwise.measure.watch.exporter import serve

    class Breaks(LiveWindow):
        calls = 0

        def families(self, *args, **kwargs):
            self.calls += 1
            if self.calls > 1:
                raise ZeroDivisionError("broken")
            return super().families(*args, **kwargs)

    log = tmp_path / "run.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in records()))
    server = serve("127.0.0.1:0")
    try:
        server.attach(log, "train", refresh_s=0.0, window=Breaks())
        first, second, third = (scrape(server.url) for _ in range(3))
    finally:
        server.close()
    assert "gpuwise_watch_verdict" in first and first == second == third
    assert capsys.readouterr().err.count("metrics not updated (ZeroDivisionError('broken'))") == 1


def test_the_api_serves_its_own_loop(tmp_path):
    pytest.importorskip("prometheus_client")
    import gpuwise

    with gpuwise.watch(tmp_path / "api.jsonl", sample=False, prometheus="127.0.0.1:0",
                       job_name="api-job") as w:
        assert w.metrics_url and w.metrics_url.startswith("http://127.0.0.1:")
        for _ in w.loader(time.sleep(0.02) or i for i in range(12)):
            with w.phase("forward"):
                time.sleep(0.005)
        w.summary()  # flushes the steps to the log
        families = parsed(scrape(w.metrics_url))
    verdicts = {s.labels["verdict"]: s.value for s in families["gpuwise_watch_verdict"]}
    assert verdicts["input_bound"] == 1
    assert {s.labels["job"] for s in families["gpuwise_watch_verdict"]} == {"api-job"}
    with pytest.raises(OSError):
        scrape(w.metrics_url)


def test_the_api_under_an_exporting_watch_serves_nothing_and_a_busy_port_stops_it(tmp_path,
                                                                                  monkeypatch):
    pytest.importorskip("prometheus_client")
    import gpuwise

    log = tmp_path / "api.jsonl"
    with busy_port() as port:
        busy = gpuwise.watch(log, prometheus=f"127.0.0.1:{port}")
        with pytest.raises(GpuwiseError, match=f"port {port} is in use"), busy:
            pass
        assert not log.exists()  # refused before the log was touched
        monkeypatch.setenv("GPUWISE_WATCH_LOG", str(log))
        monkeypatch.setenv(SERVED_ENV, "http://127.0.0.1:9400/metrics")
        with gpuwise.watch(prometheus=f"127.0.0.1:{port}") as w:  # the parent serves
            assert w.metrics_url is None


def test_without_prometheus_client_one_error(monkeypatch):
    from gpuwise.measure.watch.exporter import serve

    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(GpuwiseError, match="needs prometheus-client") as err:
        serve("127.0.0.1:0")
    assert "gpuwise[prometheus]" in err.value.hint


# --------------------------------------------------------------------- bad input on the command line


def test_a_busy_port_or_a_malformed_address_is_one_line_and_nothing_runs(tmp_path):
    pytest.importorskip("prometheus_client")
    marker, log = tmp_path / "ran", tmp_path / "w.jsonl"
    job = [sys.executable, "-c", f"open({str(marker)!r}, 'w')"]
    with busy_port() as port:
        # (the other malformed addresses: test_listen_addresses, in-process)
        for address, why in ((f"127.0.0.1:{port}", f"port {port} is in use"),
                             ("127.0.0.1:http", "the port is a number")):
            proc = subprocess.run([*GPUWISE, "watch", "--log", str(log), "--prometheus",
                                   address, "--", *job], capture_output=True, text=True,
                                  timeout=60, cwd=tmp_path)
            assert proc.returncode == 2, (address, proc.stderr)
            error, hint = proc.stderr.splitlines()  # one error line and its hint
            assert error.startswith("error: --prometheus") and why in error, error
            assert hint.startswith("hint: ") and proc.stdout == ""
            assert not marker.exists() and not log.exists()
    for args in (["--job-name", "x", "--", "true"], ["--report", "--prometheus", "9400", "x.jsonl"]):
        proc = subprocess.run([*GPUWISE, "watch", *args], capture_output=True, text=True,
                              cwd=tmp_path)
        assert proc.returncode == 2 and proc.stderr.startswith("error: "), proc.stderr
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------- dashboard and alert rules


def dashboard_exprs() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    for var in dash["templating"]["list"]:
        if var["type"] == "query":
            exprs.append(re.sub(r"^label_values\((.*), *\w+\)$", r"\1", var["definition"]))
    return exprs


def grafana_free(expr: str) -> str:
    """A dashboard query as Prometheus gets it, with Grafana's variables filled in."""
    return expr.replace("$__rate_interval", "1m").replace("$__range", "1h").replace(
        '"$job"', '".*"').replace('"$host"', '".*"')


def rule_exprs() -> list[str]:
    import yaml

    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule["expr"] for group in groups for rule in group["rules"]]


def names_in(expr: str) -> set[str]:
    return set(re.findall(r"\bgpuwise_watch_[a-z0-9_]+", expr))


def test_dashboard_and_rules_query_only_exported_metrics():
    pytest.importorskip("yaml")
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] == "gpuwise-watch" and dash["panels"]
    for panel in dash["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
            assert panel["targets"], panel["title"]
    used = set().union(*map(names_in, dashboard_exprs() + rule_exprs()))
    assert used and used <= metric_names(), used - metric_names()
    # the panels show every family but the exporter's plumbing
    shown = {n.removesuffix("_count").removesuffix("_sum") for n in used}
    assert {spec.name for spec in METRICS} - shown == set()


def test_the_stored_dashboard_is_what_its_tool_writes():
    spec = importlib.util.spec_from_file_location("dash", REPO / "tools" / "write_watch_dashboard.py")
    assert spec is not None and spec.loader is not None
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    assert DASHBOARD.read_text() == tool.text(), "run tools/write_watch_dashboard.py"


@pytest.mark.skipif(PROMTOOL is None, reason=NO_PROMETHEUS)
def test_promtool_checks_the_rules_their_tests_and_the_dashboards_queries(tmp_path):
    pytest.importorskip("yaml")
    import yaml

    check = subprocess.run([str(PROMTOOL), "check", "rules", str(RULES)], capture_output=True,
                           text=True)
    assert check.returncode == 0 and "SUCCESS: 5 rules found" in check.stdout, check.stderr
    tests = subprocess.run([str(PROMTOOL), "test", "rules", RULE_TESTS.name], capture_output=True,
                           text=True, cwd=RULE_TESTS.parent)
    assert tests.returncode == 0 and "SUCCESS" in tests.stdout, tests.stdout + tests.stderr
    # each dashboard query, as a recording rule: promtool parses it as Prometheus would
    rules = [{"record": f"dashboard:query{i}", "expr": grafana_free(e)}
             for i, e in enumerate(dashboard_exprs())]
    (tmp_path / "dash.yml").write_text(yaml.safe_dump({"groups": [{"name": "d", "rules": rules}]}))
    check = subprocess.run([str(PROMTOOL), "check", "rules", str(tmp_path / "dash.yml")],
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


# --------------------------------------------------------------------- a real Prometheus


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def api(base: str, path: str, **params: str) -> dict:
    url = f"{base}/api/v1/{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=10) as response:
        got = json.loads(response.read())
    assert got["status"] == "success", got
    return got["data"]


class JobEnded(AssertionError):
    """The watched job ended before what was awaited showed up."""


def wait_for(what: str, get, timeout: float = 30.0, every: float = 0.25,
             job: subprocess.Popen | None = None):
    end = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError, ValueError, KeyError, AssertionError):
            got = get()
            if got:
                return got
        if job is not None and job.poll() is not None:
            raise JobEnded(f"the job ended (exit code {job.returncode}) before {what}")
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(every)


def start_watched(tmp_path: Path, *cmd: str, job: str) -> tuple[subprocess.Popen, str]:
    """`gpuwise watch --prometheus 127.0.0.1:0 --json -- cmd`, and the URL it serves."""
    proc = subprocess.Popen([*GPUWISE, "watch", "--json", "--log", str(tmp_path / "w.jsonl"),
                             "--prometheus", "127.0.0.1:0", "--job-name", job, "--", *cmd],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=tmp_path)
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:  # the job's own lines (torchrun's warnings) may come first
        seen.append(line)
        found = re.search(r"metrics for Prometheus at (http://\S+)", line)
        if found is not None:
            return proc, found.group(1)
    proc.kill()
    raise AssertionError(f"no metrics address: {''.join(seen)}{proc.communicate()[1]}")


@contextlib.contextmanager
def prometheus(tmp_path: Path, target: str) -> Iterator[str]:
    """A Prometheus on loopback scraping `target` every second, with the alert rules."""
    port = free_port()
    tmp_path.mkdir(exist_ok=True)
    config = tmp_path / "prometheus.yml"
    config.write_text(f"""
global: {{scrape_interval: 1s, evaluation_interval: 1s}}
rule_files: ["{RULES}"]
scrape_configs:
  - job_name: gpuwise
    honor_labels: true
    static_configs: [{{targets: ["{target}"]}}]
""")
    log = (tmp_path / "prometheus.log").open("w")
    proc = subprocess.Popen([str(PROMETHEUS), f"--config.file={config}",
                             f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                            stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for("Prometheus to be ready", lambda: scrape(f"{base}/-/ready"))
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.fixture
def stopped(tmp_path: Path) -> Iterator[list[subprocess.Popen]]:
    """Watched jobs stopped at the end of the test if still running: their stop file, then
    SIGTERM (which `gpuwise watch` forwards to the job), then SIGKILL."""
    procs: list[subprocess.Popen] = []
    yield procs
    (tmp_path / "stop").touch()
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.communicate(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()


@pytest.mark.slow
@pytest.mark.skipif(PROMETHEUS is None, reason=NO_PROMETHEUS)
def test_prometheus_scrapes_the_verdict_and_step_time_of_a_watched_job(tmp_path, stopped):
    pytest.importorskip("prometheus_client")
    stop = tmp_path / "stop"
    watched, url = start_watched(tmp_path, sys.executable, JOB, "loop", str(stop), "60",
                                 job="prom-test")
    stopped.append(watched)
    target = urllib.parse.urlsplit(url).netloc
    with prometheus(tmp_path, target) as base:
        query = 'gpuwise_watch_verdict{job="prom-test", verdict="input_bound"} == 1'
        verdicts = wait_for("the verdict in Prometheus",
                            lambda: api(base, "query", query=query)["result"], job=watched)
        labels = verdicts[0]["metric"]
        assert labels["host"] == socket.gethostname() and labels["instance"] == target
        step = api(base, "query", query='gpuwise_watch_step_seconds{job="prom-test", quantile="0.5"}')
        assert [r["metric"]["rank"] for r in step["result"]] == ["0"]
        assert 0.035 < float(step["result"][0]["value"][1]) < 0.5  # 30 ms wait + 10 ms work
        # the step-time series over time, and the step-time counters' rate
        wait_for("step-time samples", lambda: len(api(base, "query", query='gpuwise_watch_step_seconds_count{job="prom-test"}[10s]')["result"][0]["values"]) >= 3)
        mean = api(base, "query", query='rate(gpuwise_watch_step_seconds_sum{job="prom-test"}[10s]) / rate(gpuwise_watch_step_seconds_count{job="prom-test"}[10s])')
        assert 0.035 < float(mean["result"][0]["value"][1]) < 0.5
        share = api(base, "query", query='gpuwise_watch_evidence{job="prom-test", measure="input_share_ratio"}')
        assert 0.5 < float(share["result"][0]["value"][1]) <= 1
        # the alert rules loaded and evaluate; every dashboard query runs
        groups = wait_for("the rules evaluated", lambda: [
            g for g in api(base, "rules")["groups"] if all(r["health"] == "ok" for r in g["rules"])])
        assert [len(g["rules"]) for g in groups] == [5]
        for expr in dashboard_exprs():
            api(base, "query", query=grafana_free(expr))
        stop.touch()
        out, err = watched.communicate(timeout=60)
    assert watched.returncode == 0, err
    report = json.loads(out.splitlines()[-1])
    assert report["verdict"]["bound"] == "input-bound"  # what Prometheus saw: the report's verdict


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.skipif(PROMETHEUS is None, reason=NO_PROMETHEUS)
def test_prometheus_sees_each_rank_of_torchrun_and_the_straggler(tmp_path, stopped):
    pytest.importorskip("torch")
    pytest.importorskip("prometheus_client")
    stop = tmp_path / "stop"
    for attempt in range(2):  # gloo can abort a rank in its own C++ (SIGABRT) on a loaded
        # 2-core machine, as in test_watch_runs: one retry, then fail
        watched, url = start_watched(tmp_path, str(BIN / "torchrun"), "--standalone",
                                     "--nproc_per_node", "2", JOB, "ddp", str(stop), "60",
                                     job="ddp-test")
        stopped.append(watched)
        with prometheus(tmp_path / f"p{attempt}", urllib.parse.urlsplit(url).netloc) as base:
            try:
                found = wait_for("the straggler in Prometheus", lambda b=base: api(
                    b, "query", query='gpuwise_watch_straggler{job="ddp-test"} == 1')["result"],
                                 timeout=60, job=watched)
            except JobEnded:
                err = watched.communicate(timeout=30)[1]
                if attempt == 0 and "SIGABRT" in err:
                    continue
                raise AssertionError(err) from None
            assert [r["metric"]["rank"] for r in found] == ["1"]
            ranks = api(base, "query", query='gpuwise_watch_steps_total{job="ddp-test"}')["result"]
            assert sorted(r["metric"]["rank"] for r in ranks) == ["0", "1"]
            stop.touch()
            out, err = watched.communicate(timeout=60)
        break
    assert watched.returncode == 0, err
    report = json.loads(out.splitlines()[-1])
    assert report["summary"]["ranks"]["stragglers"] == [1]
