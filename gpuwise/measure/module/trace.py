"""Trace any torch.nn.Module on the meta device: every aten op with its FLOPs and bytes, the
tensors autograd saves for backward, and the highest point of memory, with no memory
allocated and no weights needed.

How: the module runs through `torch.func.functional_call` with meta stand-ins for its
parameters and buffers (the module itself is not touched, whatever device it is on), on meta
inputs of the example shapes. A TorchDispatchMode sees every aten op: its FLOPs come from
torch.utils.flop_counter's formulas, its bytes from its tensors; each storage an op creates is
tracked with a weak reference until it dies, so the live bytes at every op boundary (and their
peak) are those of the eager run. `saved_tensors_hooks` marks what autograd keeps for backward.

The meta device picks the math path for `scaled_dot_product_attention`, which a CPU does not
(it runs a flash kernel that keeps no score matrix): each call asks the CPU's own selector,
with stride-0 stand-ins of the real shapes, and runs the CPU flash op on meta when the CPU
would. Tensors created inside a backend kernel (oneDNN scratch) are not visible here.
"""

from __future__ import annotations

import importlib
import math
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from gpuwise.errors import GpuwiseError
from gpuwise.measure.module.cpu_attention import cpu_attention
from gpuwise.measure.module.meta import meta_inputs, meta_like, require_torch, torch_dtype
from gpuwise.measure.module.op_counter import op_counter
from gpuwise.measure.module.recorder import Recorder, tensors_in
from gpuwise.measure.runs.optimizers import make_optimizer
from gpuwise.workload.traced import MemoryMoment, TracedModule

OPTIMIZERS = ("adamw", "sgd", "adafactor")


def load_factory(path: str, extra_sys_path: tuple[str, ...] = ()) -> Callable[[], Any]:
    """The callable at 'package.module:factory' (imported from the current directory too)."""
    if ":" not in path:
        raise GpuwiseError(f"{path!r} is not of the form 'package.module:factory'",
                           "name a module and a function in it, e.g. mymodels.resnet:build")
    mod_name, _, attr = path.partition(":")
    for entry in ("", *extra_sys_path):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    try:
        module = importlib.import_module(mod_name)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - the user's import failed: one line
        raise GpuwiseError(f"cannot import {mod_name[:80]!r}: {type(exc).__name__}: "
                           f"{str(exc)[:200]}",
                           "check the module path and that it imports from this directory") from None
    factory: Any = module
    for part in attr.split("."):
        factory = getattr(factory, part, None)
        if factory is None:
            raise GpuwiseError(f"{mod_name!r} has no attribute {attr!r}",
                               "name a function that returns a torch.nn.Module")
    if not callable(factory):
        raise GpuwiseError(f"{path!r} is not callable", "name a function returning a module")
    return factory


def default_loss(output: Any) -> Any:
    """The sum of every floating output, in fp32: every output reaches the loss."""
    parts = [t.float().sum() for t in tensors_in(output) if t.is_floating_point()]
    if not parts:
        raise GpuwiseError("the module's output has no floating tensor to take a loss of",
                           "pass loss_fn= to from_module")
    return sum(parts[1:], parts[0])


@contextmanager
def _mode_kept(model: Any, training: bool) -> Iterator[None]:
    """Put the module in train/eval mode for the trace and give each submodule its own back."""
    before = [(m, m.training) for m in model.modules()]
    model.train(training)
    try:
        yield
    finally:
        for m, flag in before:
            m.training = flag


def _storage_bytes(tensors: list[Any]) -> tuple[int, set[int]]:
    keys: dict[int, int] = {}
    for t in tensors:
        storage = t.untyped_storage()
        keys[storage._cdata] = int(storage.nbytes())
    return sum(keys.values()), set(keys)


def _factored(shape: tuple[int, ...]) -> int:
    if len(shape) < 2:
        return math.prod(shape)
    return math.prod(shape[:-1]) + math.prod(shape[:-2]) * shape[-1]


def _meta_state(model: Any, target: Any,
                training: bool) -> tuple[dict[str, Any], list[Any], list[Any]]:
    """(state for functional_call, parameter stand-ins, buffer stand-ins) on meta: one
    stand-in per tensor, so tied weights stay tied."""
    meta: dict[int, Any] = {}
    state: dict[str, Any] = {}
    params = list(model.named_parameters(remove_duplicate=False))
    for key, p in params:
        state[key] = meta.setdefault(id(p), meta_like(p, target, training and p.requires_grad))
    buffers = list(model.named_buffers(remove_duplicate=False))
    for key, b in buffers:
        state[key] = meta.setdefault(id(b), meta_like(b, target, False))
    param_meta = list({id(state[k]): state[k] for k, _ in params}.values())
    return state, param_meta, [state[k] for k, _ in buffers]


def _peak_moment(rec: Recorder, saved: dict[int, int], trained: list[Any]) -> MemoryMoment:
    """The peak's live bytes, and how much of them autograd saved and gradients held."""
    grads = {rec.serial_of(p.grad) for p in trained if p.grad is not None}
    sizes = {s: n for s, n in rec.alive.values()}
    return MemoryMoment(
        rec.peak,
        sum(n for s, n in saved.items() if s in rec.peak_serials),
        sum(sizes.get(s, 0) for s in grads if s in rec.peak_serials),
    )


def trace_module(model: Any, example_inputs: Any, *, training: bool = False,
                 dtype: str | None = None, loss_fn: Callable[[Any], Any] | None = None,
                 optimizer: str = "adamw", name: str | None = None,
                 device_kind: str = "cpu") -> TracedModule:
    """Trace one forward pass (and, when `training`, the loss's backward) on meta, for a
    device of `device_kind` ("cpu" adds oneDNN's convolution scratch to the peak)."""
    torch = require_torch()
    if not isinstance(model, torch.nn.Module):
        raise GpuwiseError(f"expected a torch.nn.Module, got {type(model).__name__}",
                           "pass the module itself (or a factory returning it)")
    target = torch_dtype(dtype)
    state, param_meta, buffer_meta = _meta_state(model, target, training)
    args, kwargs = meta_inputs(example_inputs, target)
    inputs = list(tensors_in((args, kwargs)))
    param_bytes, param_keys = _storage_bytes(param_meta)
    buffer_bytes, buffer_keys = _storage_bytes(buffer_meta)
    input_bytes, input_keys = _storage_bytes(inputs)
    rec = Recorder(param_keys | buffer_keys | input_keys, param_keys, device_kind == "cpu")
    saved: dict[int, int] = {}
    notes: list[str] = []
    try:
        output_bytes = _run_traced(torch, model, state, args, kwargs, rec, training, saved,
                                   loss_fn)
    except GpuwiseError:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's forward failed on meta: one line
        first = " ".join(str(exc).split())[:300]
        raise GpuwiseError(f"tracing {name or type(model).__name__} on the meta device failed: "
                           f"{type(exc).__name__}: {first}",
                           "the forward must not read tensor values (.item(), data-dependent "
                           "shapes) and the inputs must fit the module") from None
    trainable = [p for p in param_meta if (p.grad is not None if training else p.requires_grad)]
    if training and len(trainable) < sum(1 for p in param_meta if p.requires_grad):
        notes.append(f"{sum(1 for p in param_meta if p.requires_grad) - len(trainable)} "
                     "parameter tensors received no gradient: no optimizer state for them")
    peak = _peak_moment(rec, saved, trainable if training else [])
    counts = [p.numel() for p in param_meta]
    return TracedModule(
        name=name or type(model).__name__, training=training,
        dtype=_dtype_name(param_meta, target), param_count=sum(counts),
        param_bytes=param_bytes, buffer_bytes=buffer_bytes, input_bytes=input_bytes,
        trainable_count=sum(p.numel() for p in trainable),
        largest_trainable=max((p.numel() for p in trainable), default=0),
        factored_state_count=sum(_factored(tuple(p.shape)) for p in trainable),
        ops=tuple(rec.ops), peak=peak, saved_bytes=sum(saved.values()),
        heap=tuple(rec.heap), cast_bytes=_cast_bytes(model, target),
        output_bytes=output_bytes,
        optimizer_ops=count_optimizer_ops(trainable, optimizer) if training else {},
        trainable_tensors=tuple(sorted(Counter(p.numel() for p in trainable).items())),
        trainable_order=tuple(p.numel() for p in trainable),
        notes=tuple(notes),
    )


def _run_traced(torch: Any, model: Any, state: dict, args: tuple, kwargs: dict,
                rec: Recorder, training: bool, saved: dict[int, int],
                loss_fn: Callable[[Any], Any] | None) -> int:
    """Run the pass under the recorder, marking what autograd saves in `saved` (serial ->
    bytes); return the bytes of the output not saved for backward."""

    def pack(t: Any) -> Any:
        serial = rec.serial_of(t)
        if serial is not None:
            saved[serial] = int(t.untyped_storage().nbytes())
        return t

    with _mode_kept(model, training), cpu_attention(), rec.mode:
        if training:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                out = torch.func.functional_call(model, state, args, kwargs)
                loss = (loss_fn or default_loss)(out)
            output_bytes = sum(n for s, n in {rec.serial_of(t): int(t.untyped_storage().nbytes())
                                               for t in tensors_in(out)}.items()
                               if s is not None and s not in saved)
            del out
            rec.phase = "backward"
            loss.backward()
            del loss
        else:
            with torch.no_grad():
                out = torch.func.functional_call(model, state, args, kwargs)
            output_bytes = sum(int(t.untyped_storage().nbytes()) for t in tensors_in(out))
            del out
    return output_bytes


def _cast_bytes(model: Any, target: Any) -> int:
    """Bytes of the largest parameter or buffer a cast to `target` replaces (0: no cast)."""
    if target is None:
        return 0
    return max((t.untyped_storage().nbytes() for t in (*model.parameters(), *model.buffers())
                if t.is_floating_point() and t.dtype != target), default=0)


def _dtype_name(params: list[Any], target: Any) -> str:
    torch = require_torch()
    names = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
    if target is not None:
        return names[target]
    floating = [p for p in params if p.is_floating_point()]
    if not floating:
        return "fp32"
    counts: dict[Any, int] = {}
    for p in floating:
        counts[p.dtype] = counts.get(p.dtype, 0) + p.numel()
    return names.get(max(counts, key=lambda d: counts[d]), "fp32")


def count_optimizer_ops(trainable: list[Any], optimizer: str) -> dict[str, int]:
    """Aten ops one optimizer step dispatches, counted on 1-element stand-ins of the
    trainable tensors (same number and rank): the step's per-op cost does not depend on size."""
    torch = require_torch()

    if optimizer not in OPTIMIZERS:
        raise GpuwiseError(f"unknown optimizer {optimizer!r}",
                           f"choose one of: {', '.join(OPTIMIZERS)}")
    stand_ins = [torch.zeros((1,) * max(1, p.dim()), requires_grad=True) for p in trainable]
    for p in stand_ins:
        p.grad = torch.zeros_like(p)
    opt = make_optimizer(optimizer, stand_ins)
    opt.step()  # the first step creates the states
    counter = op_counter()
    with counter:
        opt.step()
    return {"kernels": counter.kernels, "views": counter.views}
