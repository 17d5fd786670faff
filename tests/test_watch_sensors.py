"""What gpuwise watch records in-process and reads around the job: the step recorder, GPU
sensors with a fake NVML, RAPL across a wrap, the live line, the light import, the Lightning
callback."""

from __future__ import annotations

import io
import json
import os
import time
from types import SimpleNamespace

import pytest
from fakes import FakeGpu, fake_nvml

from gpuwise.estimate.watch.log_records import parse_records
from gpuwise.measure.watch.inject import _gpuwise_watch_recorder as recorder

# --------------------------------------------------------------------- recorder and hooks


def test_batch_size_from_nested_batches():
    t = SimpleNamespace(shape=(8, 3))
    assert recorder.batch_size({"input_ids": t}) == 8
    assert recorder.batch_size((t, t)) == 8
    assert recorder.batch_size([[t]]) == 8
    assert recorder.batch_size(3) is None


def test_steps_tile_and_accumulation_is_one_step(tmp_path):
    log = recorder.JsonlLog(str(tmp_path / "r.jsonl"))
    rec = recorder.StepRecorder(log, source="inject")
    t = time.perf_counter()
    for k in range(3):  # two micro-batches, one optimizer step
        rec.on_data(t + k, 0.1, (SimpleNamespace(shape=(4,)),))
        rec.on_data(t + k + 0.3, 0.1, (SimpleNamespace(shape=(4,)),))
        rec.on_phase("backward", t + k + 0.5, 0.2)
        rec.on_optimizer_done()
    rec.on_loader_exhausted()
    out = parse_records(
        json.loads(line) for line in (tmp_path / "r.jsonl").read_text().splitlines()
    )
    assert [s.samples for s in out.steps] == [8, 8, 8]
    assert [s.data_s for s in out.steps] == pytest.approx([0.2, 0.2, 0.2])
    assert out.steps[0].step_s == pytest.approx(1.0)
    assert out.steps[1].t_start == pytest.approx(out.steps[0].t_end, abs=1e-3)


# --------------------------------------------------------------------- sensors


def test_gpu_sensor_readings_and_reasons(monkeypatch):
    from gpuwise.measure.watch.sensors import GpuSensor

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpu = GpuSensor(fake_nvml())
    assert gpu.names == ["NVIDIA A100-SXM4-80GB"]
    assert gpu.read() == [{"index": 0, "util_percent": 87, "sm_percent": None,
                           "mem_used_bytes": 40 * 2**30, "mem_total_bytes": 80 * 2**30,
                           "power_w": 312.0, "energy_j": 5000.0}]
    assert "Hopper" in gpu.unavailable["sm_active"]
    no_energy = GpuSensor(fake_nvml(fail={"nvmlDeviceGetTotalEnergyConsumption": "Not Supported"}))
    assert no_energy.read()[0]["energy_j"] is None and no_energy.unavailable["energy"]
    none = GpuSensor(fake_nvml(fail={"nvmlInit": "NVML Shared Library Not Found"}))
    assert none.read() == [] and "no NVIDIA driver" in none.unavailable["gpu"]


def test_gpu_sensor_reads_sm_activity_between_two_readings(monkeypatch):
    from gpuwise.measure.watch.sensors import GpuSensor

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    gpu = GpuSensor(fake_nvml(FakeGpu(), FakeGpu("NVIDIA H100 80GB HBM3", gpm=True)))
    assert gpu.names == ["NVIDIA H100 80GB HBM3"]
    assert [r["sm_percent"] for r in gpu.read() + gpu.read()] == [64.0, 64.0]
    assert "sm_active" not in gpu.unavailable


def test_rapl_counts_across_a_wrap(tmp_path):
    from gpuwise.measure.watch.sensors import RaplSensor

    zone = tmp_path / "intel-rapl:0"
    zone.mkdir()
    (zone / "max_energy_range_uj").write_text("1000000\n")
    (zone / "energy_uj").write_text("900000\n")
    rapl = RaplSensor(tmp_path)
    first = rapl.read()
    (zone / "energy_uj").write_text("100000\n")  # wrapped: +0.2 J
    assert rapl.read() - first == pytest.approx(0.2)
    assert "absent" in RaplSensor(tmp_path / "none").unavailable["cpu_energy"]


def test_live_line_fences_the_last_row(monkeypatch):
    from gpuwise.report import watch_live

    monkeypatch.setattr(watch_live.shutil, "get_terminal_size", lambda: os.terminal_size((100, 30)))
    out = io.StringIO()
    line = watch_live.LiveLine(out)
    line.start()
    step = {"kind": "step", "step_s": 0.05, "data_s": 0.03, "h2d_s": 0.0}
    line.update([step] * 3, {"per_core": [50.0, 100.0], "rss_bytes": 2**30,
                             "gpus": [{"index": 0, "util_percent": 31, "power_w": 212.0}]})
    line.stop()
    text = out.getvalue()
    assert "\033[1;29r" in text and text.endswith("\033[1;30r\033[30;1H\033[2K\0338")
    assert "3 steps 50.0 ms" in text and "data 60%" in text and "GPU0 31% 212 W" in text


def test_import_gpuwise_stays_light_and_exports_watch(heavy_imports):
    code = "import gpuwise\nassert gpuwise.watch.__name__ == 'watch'"
    assert heavy_imports(code, ("torch",)) == []


def test_lightning_callback_says_what_is_missing():
    from gpuwise.errors import GpuwiseError
    from gpuwise.measure.watch.callbacks import lightning_callback

    try:
        import lightning  # noqa: F401
    except ImportError:
        with pytest.raises(GpuwiseError, match="Lightning"):
            lightning_callback()
    else:  # pragma: no cover - when lightning is installed the callback builds
        assert lightning_callback() is not None


def test_a_job_whose_processes_are_gone_has_no_rss_reading_not_zero():
    """`watch --no-inject`'s memory trend read `rss 299.64 MiB -> 0 B` where the last sample
    came after the job's processes had exited: a tree with no process is no reading."""
    import subprocess
    import sys

    from gpuwise.measure.watch.sensors import CpuSensor

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)"])
    sensor = CpuSensor(child.pid)
    assert sensor.read()["rss_bytes"] > 0
    child.wait()
    assert sensor.read()["rss_bytes"] is None
