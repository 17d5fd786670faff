"""Device detection: runs without a GPU; NVML and torch.cuda are faked where a GPU is needed."""

from __future__ import annotations

import sys
from importlib import resources
from pathlib import Path

import psutil
import pytest
from fakes import FakeGpu, fake_nvml

from gpuwise.catalog.hardware import Hardware, load_hardware
from gpuwise.measure.hardware import catalogue_match
from gpuwise.measure.hardware import gpus as gpu_readers
from gpuwise.measure.hardware.catalogue_match import match_catalogue
from gpuwise.measure.hardware.detect import detect_gpus, detect_local
from gpuwise.measure.hardware.gpus import GpuInfo
from gpuwise.measure.hardware.nvml import Nvml

MIB = 2**20
GIB = 2**30
H100_NVML_NAME = "NVIDIA H100 80GB HBM3"
H100_MIB = 81559


def _catalogue_exists() -> bool:
    return resources.files("gpuwise.catalog").joinpath("data/hardware.toml").is_file()


def _gpu(name: str = H100_NVML_NAME, mib: int = H100_MIB) -> FakeGpu:
    return FakeGpu(name=name, memory_total_bytes=mib * MIB, memory_used_bytes=512 * MIB)


def _hw(
    id: str, name: str, memory_gib: float, bandwidth: float, *aliases: str, kind: str = "gpu"
) -> Hardware:
    return Hardware(
        id=id,
        name=name,
        kind=kind,
        vendor="NVIDIA",
        memory_bytes=int(memory_gib * GIB),
        memory_bandwidth_gbs=bandwidth,
        peak_tflops={"bf16": 1.0},
        compute_units=132,
        aliases=aliases,
    )


# A catalogue shaped like data/hardware.toml, so matching is tested whether or not it exists yet.
FAKE_CATALOGUE = (
    _hw("epyc-9654", "AMD EPYC 9654", 384, 460.8, kind="cpu"),
    _hw("h100-sxm", "NVIDIA H100 SXM5 80GB", 80, 3350, "h100", "h100-80gb"),
    _hw("h100-pcie", "NVIDIA H100 PCIe 80GB", 80, 2000, "h100 pcie"),
    _hw("h200-sxm", "NVIDIA H200 SXM 141GB", 141, 4800, "h200"),
    _hw("h200-nvl", "NVIDIA H200 NVL", 141, 4800),
    _hw("a100-40gb-sxm", "NVIDIA A100 SXM4 40GB", 40, 1555, "a100-40gb"),
    _hw("a100-80gb-sxm", "NVIDIA A100 SXM4 80GB", 80, 2039, "a100", "a100-80gb"),
    _hw("a100-80gb-pcie", "NVIDIA A100 PCIe 80GB", 80, 1935),
    _hw("a10g", "NVIDIA A10G", 24, 600),
    _hw("l4", "NVIDIA L4", 24, 300),
    _hw("l40s", "NVIDIA L40S", 48, 864),
    _hw("t4", "NVIDIA T4", 16, 320, "tesla-t4"),
    _hw("rtx-4090", "GeForce RTX 4090", 24, 1008, "4090"),
    _hw("tpu-v4", "Google TPU v4", 32, 1200, "v4", kind="tpu"),
)

# (name NVML reports, memory in MiB, id in the fake catalogue)
FAKE_MATCHES = [
    ("NVIDIA A100-SXM4-80GB", 81920, "a100-80gb-sxm"),
    ("NVIDIA A100-PCIE-40GB", 40960, "a100-40gb-sxm"),  # memory size outranks form factor
    ("NVIDIA A100 80GB PCIe", 81920, "a100-80gb-pcie"),
    (H100_NVML_NAME, H100_MIB, "h100-sxm"),
    ("NVIDIA H100 PCIe", 81559, "h100-pcie"),
    ("NVIDIA GeForce RTX 4090", 24564, "rtx-4090"),
    ("Tesla T4", 15360, "t4"),
    ("NVIDIA L4", 23034, "l4"),
    ("NVIDIA L40S", 46068, "l40s"),
    ("NVIDIA H200", 143771, "h200-sxm"),
    ("NVIDIA H200 NVL", 143771, "h200-nvl"),
    ("NVIDIA A10G", 23028, "a10g"),
]


@pytest.fixture
def fake_catalogue(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(catalogue_match, "load_hardware", lambda: FAKE_CATALOGUE)


# NVML that fails to start, as without a driver; detect_gpus then says "nvidia-ml-py: <reason>".
NO_NVML = {"nvmlInit": "fake failure"}


def _driver(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, present: bool) -> None:
    """An NVIDIA driver's files present (a folder that exists) or absent."""
    path = tmp_path if present else tmp_path / "no-driver"
    monkeypatch.setattr(gpu_readers, "NVIDIA_DRIVER_PATHS", (str(path),))


def _torch_finds(monkeypatch: pytest.MonkeyPatch, *gpus: GpuInfo, reason: str | None = None) -> None:
    monkeypatch.setattr(gpu_readers, "torch_gpus", lambda: (list(gpus), reason))


def _torch_must_not_run() -> tuple[list[GpuInfo], str | None]:
    raise AssertionError("torch.cuda probed when it should not be")


# --- This machine -------------------------------------------------------------------------------


@pytest.mark.skipif(gpu_readers.nvidia_driver_present(), reason="this machine has an NVIDIA driver")
def test_no_gpu_here_falls_back_to_the_cpu() -> None:
    machine = detect_local()
    assert machine.gpus == ()
    assert machine.gpu_unavailable_reason and "no NVIDIA driver" in machine.gpu_unavailable_reason
    best = machine.best_device()
    assert best.kind == "cpu" and best.id == "local-cpu" and best.source == "detected"
    assert best.memory_bytes == machine.ram_total_bytes == psutil.virtual_memory().total
    assert best.compute_units == machine.logical_cores == psutil.cpu_count()
    assert best.memory_bandwidth_gbs == 0.0 and "detected" in best.notes
    assert best.name == machine.cpu_model and machine.cpu_model


def test_machine_readings_are_sane() -> None:
    machine = detect_local(use_torch=False)
    assert machine.logical_cores >= 1
    assert machine.physical_cores is None or 1 <= machine.physical_cores <= machine.logical_cores
    assert 0 < machine.ram_available_bytes <= machine.ram_total_bytes
    assert (machine.gpus == ()) == (machine.gpu_unavailable_reason is not None)


# --- Faked GPUs --------------------------------------------------------------------------------


def test_fake_h100_is_the_best_device(fake_catalogue: None) -> None:
    machine = detect_local(nvml=fake_nvml(_gpu(), _gpu()))
    assert machine.gpu_unavailable_reason is None and len(machine.gpus) == 2
    best = machine.best_device()
    assert best.kind == "gpu" and best.source == "detected"
    assert best.memory_bytes == H100_MIB * 2**20
    assert best.memory_bandwidth_gbs == 3350 and best.peak_tflops == {"bf16": 1.0}
    assert best.name == H100_NVML_NAME and best.aliases == ("h100-sxm",)
    assert "h100-sxm" in best.notes and "GPU 0 of 2" in best.notes


@pytest.mark.skipif(not _catalogue_exists(), reason="data/hardware.toml not written yet")
def test_fake_h100_borrows_from_the_real_catalogue() -> None:
    best = detect_local(nvml=fake_nvml(_gpu())).best_device()
    h100_sxm = next((hw for hw in load_hardware() if hw.id == "h100-sxm"), None)
    if h100_sxm is None:
        pytest.skip("no 'h100-sxm' entry in the catalogue")
    assert best.kind == "gpu" and best.memory_bytes == 81559 * 2**20
    assert best.memory_bandwidth_gbs == h100_sxm.memory_bandwidth_gbs > 0


def test_unknown_gpu_keeps_its_measured_memory(fake_catalogue: None) -> None:
    best = detect_local(nvml=fake_nvml(_gpu("NVIDIA Frobnicator X9", 12000))).best_device()
    assert best.kind == "gpu" and best.id == "local-gpu0"
    assert best.memory_bytes == 12000 * MIB and best.memory_bandwidth_gbs == 0.0
    assert "not in the catalogue" in best.notes


def test_unreadable_memory_borrows_the_catalogue_size(fake_catalogue: None) -> None:
    assert detect_local(nvml=fake_nvml(_gpu(mib=0))).best_device().memory_bytes == 80 * GIB


def test_failing_nvml_without_driver_never_tries_torch(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _driver(monkeypatch, tmp_path, present=False)
    monkeypatch.setattr(gpu_readers, "torch_gpus", _torch_must_not_run)
    machine = detect_local(nvml=fake_nvml(fail={"nvmlInit": "NVML Shared Library Not Found"}))
    assert machine.gpus == ()
    assert machine.gpu_unavailable_reason == (
        "no NVIDIA driver (nvidia-ml-py: NVML Shared Library Not Found)"
    )
    assert machine.best_device().kind == "cpu"


def test_failing_nvml_with_driver_falls_back_to_torch(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fake_catalogue: None
) -> None:
    pytest.importorskip("torch")  # detect_gpus tries torch.cuda only where torch is installed
    _driver(monkeypatch, tmp_path, present=True)
    torch_gpu = GpuInfo(0, "NVIDIA A100-SXM4-80GB", 81920 * MIB, None, None, "torch.cuda")
    _torch_finds(monkeypatch, torch_gpu)
    machine = detect_local(nvml=fake_nvml(fail=NO_NVML))
    assert machine.gpus == (torch_gpu,) and machine.gpu_unavailable_reason is None
    best = machine.best_device()
    assert best.aliases == ("a100-80gb-sxm",) and "torch.cuda" in best.notes


def test_use_torch_false_never_tries_torch(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _driver(monkeypatch, tmp_path, present=True)
    monkeypatch.setattr(gpu_readers, "torch_gpus", _torch_must_not_run)
    gpus, reason = detect_gpus(use_torch=False, nvml=fake_nvml(fail=NO_NVML))
    assert gpus == () and reason == "nvidia-ml-py: fake failure"


def test_use_torch_true_tries_torch_without_a_driver(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _driver(monkeypatch, tmp_path, present=False)
    _torch_finds(monkeypatch, reason="torch.cuda: no CUDA device")
    gpus, reason = detect_gpus(use_torch=True, nvml=fake_nvml(fail=NO_NVML))
    assert gpus == ()
    assert reason == "no NVIDIA driver (nvidia-ml-py: fake failure; torch.cuda: no CUDA device)"


def test_real_torch_probe_on_cpu_only_torch_reports_a_reason() -> None:
    pytest.importorskip("torch")
    gpus, reason = gpu_readers.torch_gpus()
    if gpus:
        pytest.skip("this machine has a CUDA GPU")
    assert reason and reason.startswith("torch.cuda:")


def test_nvml_failing_everywhere_never_raises(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _driver(monkeypatch, tmp_path, present=True)
    _torch_finds(monkeypatch, reason="torch.cuda: no CUDA device")
    machine = detect_local(nvml=fake_nvml(fail={"*": "nvmlInit exploded"}))
    assert machine.gpus == () and machine.best_device().kind == "cpu"
    assert machine.gpu_unavailable_reason == (
        "nvidia-ml-py: nvmlInit exploded; torch.cuda: no CUDA device"
    )
    started = fake_nvml()
    started.lib.fail["*"] = "GPU is lost"  # every call after nvmlInit fails
    assert gpu_readers.nvml_gpus(started) == ([], "nvidia-ml-py: GPU is lost")


def test_nvml_failing_per_device_keeps_what_it_could_read() -> None:
    nvml = fake_nvml(FakeGpu(name=b"NVIDIA H100 80GB HBM3"), driver=b"550.54.15",
                     fail={"nvmlDeviceGetMemoryInfo": "Not Supported"})
    gpus, reason = gpu_readers.nvml_gpus(nvml)
    assert reason is None and nvml.lib.calls.count("nvmlInit") == 1
    (gpu,) = gpus
    assert gpu.name == H100_NVML_NAME and gpu.driver == "550.54.15" and gpu.via == "nvidia-ml-py"
    assert gpu.memory_total_bytes == 0 and gpu.memory_used_bytes is None
    assert gpu.reading_errors == ("memory: Not Supported",)


def test_nvml_reads_a_working_device() -> None:
    h100 = FakeGpu(name=H100_NVML_NAME, memory_total_bytes=H100_MIB * MIB,
                   memory_used_bytes=600 * MIB, compute_capability=(9, 0))
    gpus, reason = gpu_readers.nvml_gpus(fake_nvml(h100, h100, driver="560.1"))
    assert reason is None and [g.index for g in gpus] == [0, 1]
    assert gpus[1] == GpuInfo(1, H100_NVML_NAME, H100_MIB * MIB, 600 * MIB, "560.1", "nvidia-ml-py",
                              compute_capability=9.0)


def test_missing_pynvml_is_a_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` fail
    gpus, reason = gpu_readers.nvml_gpus(Nvml.open())
    assert gpus == [] and reason and reason.startswith("nvidia-ml-py not installed")


def test_import_does_not_load_torch(heavy_imports) -> None:
    code = ("import gpuwise.measure.hardware.detect as d\n"
            "d.detect_local(use_torch=False).best_device()")
    assert heavy_imports(code, ("torch",)) == []


# --- Matching names to the catalogue ------------------------------------------------------------


@pytest.mark.parametrize(("name", "mib", "expected"), FAKE_MATCHES)
def test_match_fake_catalogue(fake_catalogue: None, name: str, mib: int, expected: str) -> None:
    found = match_catalogue(name, mib * MIB)
    assert found is not None and found.id == expected


def test_match_uses_the_size_in_the_name_when_memory_is_unknown(fake_catalogue: None) -> None:
    assert match_catalogue("NVIDIA A100-SXM4-40GB", 0).id == "a100-40gb-sxm"  # type: ignore[union-attr]
    assert match_catalogue("NVIDIA A100-SXM4-80GB", 0).id == "a100-80gb-sxm"  # type: ignore[union-attr]


NO_MATCH = ["NVIDIA Frobnicator", "NVIDIA A10", "NVIDIA", "", "RTX", "NVIDIA V4"]  # V4: a TPU alias


@pytest.mark.parametrize("name", NO_MATCH)
def test_no_match_for_unknown_names(fake_catalogue: None, name: str) -> None:
    assert match_catalogue(name, 24 * GIB) is None


def test_no_catalogue_means_no_match(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing() -> tuple[Hardware, ...]:
        raise FileNotFoundError("data/hardware.toml")

    monkeypatch.setattr(catalogue_match, "load_hardware", missing)
    assert match_catalogue(H100_NVML_NAME, H100_MIB * MIB) is None


# Against the real catalogue: the id must contain every `need` and no `avoid`. A case is skipped
# when the catalogue has no entry that fits (it may not list that device).
REAL_MATCHES = [
    ("NVIDIA A100-SXM4-80GB", 81920, ("a100", "80", "sxm"), ()),
    ("NVIDIA A100-PCIE-40GB", 40960, ("a100", "40"), ()),
    (H100_NVML_NAME, H100_MIB, ("h100", "sxm"), ()),
    ("NVIDIA H100 PCIe", 81559, ("h100", "pcie"), ()),
    ("NVIDIA GeForce RTX 4090", 24564, ("4090",), ()),
    ("Tesla T4", 15360, ("t4",), ()),
    ("NVIDIA L4", 23034, ("l4",), ("l40",)),
    ("NVIDIA H200", 143771, ("h200",), ("nvl",)),
    ("NVIDIA A10G", 23028, ("a10g",), ()),
]


def _fits(hw_id: str, need: tuple[str, ...], avoid: tuple[str, ...]) -> bool:
    return all(n in hw_id for n in need) and not any(a in hw_id for a in avoid)


@pytest.mark.skipif(not _catalogue_exists(), reason="data/hardware.toml not written yet")
@pytest.mark.parametrize(("name", "mib", "need", "avoid"), REAL_MATCHES)
def test_match_real_catalogue(
    name: str, mib: int, need: tuple[str, ...], avoid: tuple[str, ...]
) -> None:
    if not any(_fits(hw.id, need, avoid) for hw in load_hardware()):
        pytest.skip(f"no catalogue entry for {name}")
    found = match_catalogue(name, mib * MIB)
    assert found is not None and _fits(found.id, need, avoid), found


def test_a_detected_gpu_carries_its_compute_capability_where_the_catalogue_has_none():
    """An NVIDIA GPU the catalogue lacks still says what it can run: NVML's compute capability
    (a T4-class part: no bf16, so fp16 runs there; estimate/capability.py)."""
    from gpuwise.estimate.capability import Device, weights_here
    from gpuwise.measure.hardware.detect import gpu_hardware

    odd = FakeGpu(name=b"NVIDIA Quadro RTX 8000", memory_total_bytes=48 * 2**30,
                  compute_capability=(7, 5))
    gpus, reason = detect_gpus(use_torch=False, nvml=fake_nvml(odd))
    assert reason is None and gpus[0].compute_capability == 7.5
    hw = gpu_hardware(gpus[0])
    assert hw.source == "detected" and hw.compute_capability == 7.5
    assert weights_here("fp16", Device.of(hw)) == "fp16"
