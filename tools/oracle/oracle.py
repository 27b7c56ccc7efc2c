#!/usr/bin/env python3
"""peakfit oracle: the peak torch.cuda.max_memory_allocated and max_memory_reserved of a Hugging Face
workload, without a GPU.

The real transformers / PEFT / torch.optim code runs on fake tensors (torch FakeTensorMode, CPU
device, no data) while a TorchDispatchMode sees every tensor the ops produce and follows every
storage until Python frees it. Each storage counts as the CUDA caching allocator counts it in
`allocated_bytes`: its size rounded up to a multiple of 512 bytes (0 bytes: no block). Every
allocation and free is also logged, in order, and replayed through a model of the caching
allocator (allocator.py) for the reserved peak. Where the code path on a CPU differs from the one
on an sm90 GPU (H100/H200) the oracle makes it take the GPU's path; docs/oracle.md lists each
place and why.

usage:
  oracle.py case --config F.json --workload inference|training|lora --dtype bf16|fp16|fp32|fp16-amp
                 --batch B --context-tokens T [--new-tokens N] [--gradient-checkpointing none|full]
                 [--optimizer adamw|adamw-loop|adamw-fused|sgd] [--lora-rank R] [--attention sdpa|eager] [--no-reserved]
  oracle.py batch CASES.jsonl          (one JSON case per line; one JSON result per line on stdout)
"""
import argparse
import contextlib
import json
import math
import os
import sys
import time
import weakref

import torch
import torch.nn.functional as F

from allocator import Allocator
# accelerate (PEFT's dependency) wraps a Trainer's forward in `convert_outputs_to_fp32`: imported here, before
# any fake mode, so that nothing its import makes is tracked.
from accelerate.utils import convert_to_fp32
from torch._subclasses.fake_tensor import FakeTensorMode, FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

GIB = 2 ** 30
CUBLAS_WORKSPACE = 4096 * 8 * 1024
# Host reads of tensor values in the code paths run here, and their answer on measure.py's inputs.
KNOWN_READS = {
    # position_ids are 0..n-1 in every row: no packed sequences (the mask stays implicit, is_causal=True)
    "masking_utils.py:find_packed_sequence_indices": True,
    # all-ones attention mask: no right padding (generate only warns otherwise)
    "utils.py:generate": False,
    # EOS / pad sanity checks in generate: they only decide whether to warn
    "utils.py:_prepare_special_tokens": False,
    # optimizer step counts (values do not change memory)
    "optimizer.py:_get_value": 1,
    "adam.py:_single_tensor_adam": 1,
    "adam.py:_multi_tensor_adam": 1,
    "sgd.py:_multi_tensor_sgd": 1,
}
CUBLAS_OPS = {getattr(torch.ops.aten, n).default for n in ("mm", "addmm", "bmm", "baddbmm", "addmv", "mv", "addbmm")}
ENCODER_TYPES = {"bert", "roberta", "xlm-roberta", "distilbert", "electra", "deberta-v2", "modernbert"}
WHISPER_START = 50258          # <|startoftranscript|>, as measure.py
WHISPER_FRAMES = 3000          # 30 s of audio


def block(nbytes):
    """Bytes the CUDA caching allocator counts as allocated for a request (rounded to 512)."""
    return 0 if nbytes <= 0 else (nbytes + 511) // 512 * 512


# --------------------------------------------------------------------------- memory tracker
class Tracker(TorchDispatchMode):
    """Follows every storage produced by an op until it is freed; keeps the peak and what was live then."""

    def __init__(self):
        super().__init__()
        self.live = {}          # id(storage) -> [bytes, category, weakref]
        self.cur = 0
        self.peak = 0
        self.peak_phase = None
        self.phase = "init"
        self.dirty = False
        self.snap = []
        self.ops = 0
        self.data_reads = {}
        self.last_op = None
        self.kept = []
        self.workspaces = {}
        # every allocation and free, in the order the run makes them, for the caching-allocator replay
        # (replay_events): ("a", handle, requested bytes, phase), ("f", handle), ("r",) = measure.py's
        # empty_cache() + reset_peak_memory_stats() after the weights; marks: the event index at each
        # model forward call (generate's steps, Whisper's decoder calls)
        self.events = []
        self.marks = []
        self.handles = 0
        self.synth_calls = None     # run_inference recorded fewer model calls than the run makes (synthesize)
        self.largest = 0        # the largest storage the workload allocates (weights not counted)

    def _malloc(self, nbytes):
        self.handles += 1
        if nbytes > 0:
            self.events.append(("a", self.handles, nbytes, self.phase))
        return self.handles

    def _freed(self, key):
        def cb(_ref):
            if key in self.live:
                if self.dirty:          # the peak was the state just before this first free after it
                    self._snapshot()
                rec = self.live.pop(key)
                self.cur -= rec[0]
                self.events.append(("f", rec[6]))
        return cb

    def _snapshot(self):
        self.snap = list(self.live.values())
        self.dirty = False

    def track(self, t, category="temporaries"):
        st = t.untyped_storage()
        key = id(st)
        n = block(st.nbytes())
        rec = self.live.get(key)
        if rec is not None:
            if rec[0] != n:      # resized in place
                if n < rec[0] and self.dirty:
                    self._snapshot()
                self.cur += n - rec[0]
                rec[0] = n
                self._maybe_peak()
                # the storage's resize takes a new block, copies, then frees the old one (resize_bytes_cuda)
                old, rec[6] = rec[6], self._malloc(st.nbytes())
                self.events.append(("f", old))
            return rec
        rec = [n, category, weakref.ref(st, self._freed(key)), self.last_op, tuple(t.shape), t.dtype,
               self._malloc(st.nbytes())]
        self.live[key] = rec
        self.cur += n
        if self.phase != "init":
            self.largest = max(self.largest, n)
        self._maybe_peak()
        return rec

    def _maybe_peak(self):
        if self.cur > self.peak:
            self.peak = self.cur
            self.peak_phase = self.phase
            self.dirty = True

    def keep_peak(self):
        """Close a measured stretch: remember its peak, start a new one at the current level."""
        if self.dirty:
            self._snapshot()
        self.kept.append((self.peak, self.peak_phase, self.snap))
        self.restart()

    def restart(self):
        """Forget the peak since the last keep_peak (a stretch that does not happen in the real run)."""
        self.peak, self.peak_phase = self.cur, self.phase
        self.snap, self.dirty = list(self.live.values()), False

    def finish(self):
        self.keep_peak()
        self.peak, self.peak_phase, self.snap = max(self.kept, key=lambda k: k[0])

    def tag(self, t, category):
        if isinstance(t, torch.Tensor):
            rec = self.live.get(id(t.untyped_storage()))
            if rec is not None:
                rec[1] = category

    def read_value(self, t):
        """A value read on the host: fake tensors have none. Each place the code paths run here read one is
        answered from what it is on measure.py's inputs (KNOWN_READS); any other place is an error."""
        import traceback
        for fr in reversed(traceback.extract_stack()[:-2]):
            f = fr.filename.replace("\\", "/")
            if "/torch/_" in f or "/torch/utils/" in f or f.endswith("oracle.py"):
                continue
            site = f"{f.split('/')[-1]}:{fr.name}"
            if site not in KNOWN_READS:
                raise RuntimeError(f"oracle: unexpected read of a tensor's value at {f}:{fr.lineno} ({fr.name})")
            self.data_reads[site] = True
            v = KNOWN_READS[site]
            return v if t.dtype == torch.bool else int(v) if not t.is_floating_point() else float(v)
        raise RuntimeError("oracle: read of a tensor's value from an unknown place")

    def cublas_workspace(self):
        """cuBLAS takes a 32 MiB workspace (sm90 default, CublasHandlePool.cpp) from the caching allocator per
        (handle, stream) the first time a thread multiplies matrices, and keeps it. Handles are per thread:
        the main thread gets one at its first matmul, the autograd engine's device thread at the first
        matmul of a backward pass."""
        key = "backward" if self.phase == "backward" else "main"
        if key not in self.workspaces:
            ws = torch.empty(CUBLAS_WORKSPACE, dtype=torch.uint8)
            self.workspaces[key] = ws
            self.track(ws, "workspace")

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in CUBLAS_OPS:
            self.cublas_workspace()
        if func in (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.is_nonzero.default):
            return self.read_value(args[0])
        self.last_op = func
        out = func(*args, **(kwargs or {}))
        self.ops += 1
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type != "meta":
                self.track(t)
        if func is torch.ops.aten._safe_softmax.default:
            self.safe_softmax_temporaries(out, *args, **(kwargs or {}))
        elif func is torch.ops.aten._softmax_backward_data.default:
            self.softmax_backward_temporary(*args, **(kwargs or {}))
        return out

    def safe_softmax_temporaries(self, out, x, dim, dtype=None):
        """The temporaries of the math SDPA kernel's softmax as a GPU makes them.

        `_scaled_dot_product_attention_math` (aten/src/ATen/native/transformers/attention.cpp) calls
        `at::_safe_softmax(attn, -1)`. That op is CompositeExplicitAutograd (native_functions.yaml; no CUDA
        kernel of its own), so on CUDA its C++ body runs: `out = at::softmax(self, dim, dtype)`,
        `masked = self.isneginf()` (a bool the size of the scores), `masked_rows = all(masked, dim, true)`,
        a 0-dim `zero`, then `at::where_out(out, masked_rows, zero, out)` into out's own storage; the locals
        die in reverse order at return. On fake tensors the op runs its meta function instead, which only
        makes the output, so the bool (one byte per score, alive with the scores and their softmax) is made
        here, in the same order, for the peak and the allocator replay. Checked on torch 2.11's CPU build
        (the same composite body): the profiler lists softmax, isneginf, all, scalar_tensor, where."""
        with torch.no_grad():
            masked = torch.ops.aten.isneginf.default(x)
            self.track(masked)
            rows = torch.ops.aten.all.dim(masked, dim, True)
            self.track(rows)
            zero = torch.ops.aten.scalar_tensor.default(0.0, dtype=out.dtype, device=out.device)
            self.track(zero)
            del zero, rows, masked

    def softmax_backward_temporary(self, grad, output, _dim, _input_dtype):
        """The product CUDA's softmax backward makes before its kernel runs.

        `_softmax_backward_data` is a structured kernel (native_functions.yaml: `_softmax_backward_data.out`,
        CPU `softmax_backward_cpu_out`, CUDA `softmax_backward_cuda_out`): its meta function allocates the
        input gradient (`input_dtype`: 16-bit under `half_to_float`), then the backend's body runs. CUDA's
        (`aten/src/ATen/native/cuda/SoftMax.cu`, `TORCH_IMPL_FUNC(softmax_backward_cuda_out)`) begins
        `Tensor tmp = grad * output;` and hands `tmp` to `host_softmax_backward`, whose
        `SoftMaxBackwardEpilogue` reads it as "gradOutput * output"; `tmp` dies at return. It has the
        probabilities' shape and `grad * output`'s promoted dtype: fp32 under `half_to_float` too (an fp16
        input's fp32 probabilities and their fp32 gradient; only the input gradient is 16-bit). The CPU
        kernel the fake run stands for has no such product (and fake tensors run only the meta function),
        so it is made here after the output, tracked and freed: output allocated, tmp allocated, tmp freed,
        as the GPU's allocator histories show it (tests/data/h200c/traces; docs/oracle.md, "Falcon-7B
        LoRA: the GPU holds one more fp32 score block"). Eager attention's `softmax`, the math SDPA kernel's
        `_safe_softmax` and the MoE routers' softmax all take their gradient through this op."""
        with torch.no_grad():
            tmp = torch.ops.aten.mul.Tensor(grad, output)
            self.track(tmp)
            del tmp

    def breakdown(self):
        if self.dirty:
            self._snapshot()
        cats = {}
        for n, c, *_ in self.snap:
            cats[c] = cats.get(c, 0) + n
        return cats


# --------------------------------------------------------------------------- reserved: the allocator replay
# What cudaMalloc can hand the caching allocator on the H200 of the measured rows: its 140.40 GiB
# (gpu_memory_total_gib) less what NVML shows beyond max_reserved there (0.68 GiB: the CUDA context, 0.598,
# and the library handles). Only a run that fragments past it notices (the allocator then releases its free
# segments and retries, or runs out of memory).
H200_ALLOCATOR_CAPACITY = round((140.40 - 0.68) * GIB)


def replay_events(events, capacity=H200_ALLOCATOR_CAPACITY):
    """Feed a run's allocations and frees to the caching allocator. Returns the allocator (its peak_reserved is
    max_memory_reserved as measure.py reads it; oom: the run would not fit), the phase of the allocation that
    made the last segment, and what was reserved after the weights."""
    al = Allocator(capacity)
    phase, weight_segments = "weights", 0
    for e in events:
        if e[0] == "a":
            before = al.reserved
            al.malloc(e[1], e[2])
            if al.reserved > before:
                phase = e[3]
        elif e[0] == "f":
            al.free(e[1])
        else:
            al.empty_cache()
            al.reset_peak()
            weight_segments = al.reserved
    return al, phase, weight_segments


SYNTH_RECORDED = 7      # model calls run for real before the rest are synthesized (see synthesize_steps)


def synthesize_steps(events, marks, calls):
    """The event stream of a generation of `calls` model calls, from a run of the first SYNTH_RECORDED.

    Each decode step of generate (or of the Whisper loop) runs the same ops; only the tensors that grow with the
    cache (its torch.cat, attention over it, the growing ids) change size, by the same bytes every step. Step k
    (the events from the k-th model call to the next) is written relative to itself: an allocation's size; a free
    as (steps back, index in that step), or as the handle itself for something allocated before the prefill. The
    steps 3, 4, 5 must read the same and their sizes grow linearly (3 points); then steps 6 .. calls-2 are steps
    5's with sizes + k·delta, and the recorded last call (its forward, then generate's exit) is moved to the end
    the same way. Returns None when the steps do not repeat (a sliding window filling up, say): run them all."""
    n = SYNTH_RECORDED
    if calls <= n or len(marks) != n:
        return None
    where = {}                              # handle -> (step, index in step)
    segs = []
    for k in range(n):
        seg = events[marks[k]:marks[k + 1]] if k + 1 < n else events[marks[k]:]
        for j, e in enumerate(seg):
            if e[0] == "a":
                where[e[1]] = (k, j)
        segs.append(seg)

    def rel(k, seg):
        out = []
        for e in seg:
            if e[0] == "a":
                out.append(("a",))
            elif e[0] == "f":
                src = where.get(e[1])
                out.append(("f", "abs", e[1]) if src is None else ("f", k - src[0], src[1]))
            else:
                return None
        return out

    sig = [rel(k, segs[k]) for k in (3, 4, 5)]
    if sig[0] is None or not sig[0] == sig[1] == sig[2]:
        return None
    size = lambda k: [e[2] for e in segs[k] if e[0] == "a"]
    s3, s4, s5 = size(3), size(4), size(5)
    delta = [b - a for a, b in zip(s3, s4)]
    if delta != [c - b for b, c in zip(s4, s5)]:
        return None
    # the last call reads like a step up to the preparation of a next call, which it does not make
    last = rel(6, segs[6])
    if last is None:
        return None
    common = next((j for j, (x, y) in enumerate(zip(last, sig[0])) if x != y), min(len(last), len(sig[0])))
    if common < len(sig[0]) - 16:
        return None
    handles = {}                            # (step, index) -> handle, recorded and synthesized
    for k in range(n):
        for j, e in enumerate(segs[k]):
            if e[0] == "a":
                handles[(k, j)] = e[1]
    out = list(events[:marks[6]])
    nxt = [max(where, default=0) + 1]

    def emit(k, template, sizes_from, shift, steady):
        ai = 0
        for j, (e, r) in enumerate(zip(template, rel(sizes_from, template))):
            if e[0] == "a":
                h = nxt[0]
                nxt[0] += 1
                handles[(k, j)] = h
                grow = delta[ai] * shift if j < steady else 0
                out.append(("a", h, e[2] + grow, "decode"))
                ai += 1
            elif r[1] == "abs":
                out.append(e)
            else:
                src_step = k - r[1]
                if j >= steady and where[e[1]][0] <= 2:
                    out.append(e)          # the exit frees what the prefill and first steps made: as recorded
                else:
                    out.append(("f", handles[(src_step, r[2])]))

    for k in range(6, calls - 1):
        emit(k, segs[5], 5, k - 5, len(segs[5]))
    emit(calls - 1, segs[6], 6, calls - 1 - 6, common)
    return out


# --------------------------------------------------------------------------- SDPA as on sm90
# torch 2.11 + cuDNN 9.19 on sm90 (H100/H200): priority cuDNN > flash > efficient > math
# (sdp_utils.cpp: check_prefer_cudnn_attention is true for cuDNN > 9.15 on sm90 / sm10x).
def _half(dt):
    return dt in (torch.float16, torch.bfloat16)


def select_backend(q, k, v, mask, dropout_p, is_causal, enable_gqa):
    hq, hk, hv = q.shape[1], k.shape[1], v.shape[1]
    dq, dk, dv = q.shape[-1], k.shape[-1], v.shape[-1]
    sq, sk = q.shape[2], k.shape[2]
    if q.dim() != 4 or sq == 0 or sk == 0 or q.shape[0] != k.shape[0]:
        return "math"
    same_heads = hq == hk == hv
    divisible = hk == hv and hk > 0 and hq % hk == 0
    strides_ok = all(t.stride(-1) == 1 or t.shape[-1] == 1 for t in (q, k, v))
    # cuDNN: fp16/bf16, head dims <= 256 (sm90, cuDNN >= 9.10) and multiples of 8, kv length != 1,
    # batch and heads <= 65535, dropout a multiple of 1/16; masks allowed. Heads: can_use_cudnn_attention's
    # dense constraints (cuda/sdp_utils.cpp) run check_batch_size_and_num_heads_dense<true /*supports_gqa*/,
    # false /*requires_same_num_heads*/> (sdp_utils_cpp.h), which takes the grouped-query path only
    # `if (params.enable_gqa && supports_gqa)` (k and v heads each dividing q heads) and otherwise requires
    # q, k and v to have the same number of heads. So unequal heads without enable_gqa (Falcon's multi-query
    # attention calls F.scaled_dot_product_attention itself, without it) are refused, as by flash and the
    # efficient kernel: the math kernel runs.
    cudnn_heads = same_heads or (enable_gqa and hk > 0 and hv > 0 and hq % hk == 0 and hq % hv == 0)
    if (_half(q.dtype) and strides_ok and cudnn_heads and dq <= 256 and dv <= 256 and dq % 8 == 0 and dv % 8 == 0
            and sk != 1 and q.shape[0] <= 65535 and hq <= 65535
            and dropout_p * 16.0 == math.floor(dropout_p * 16.0)):
        return "cudnn"
    # flash: no mask, equal head dims <= 256, fp16/bf16, causal only when square, GQA only with enable_gqa.
    if (_half(q.dtype) and mask is None and dq == dk == dv and dq <= 256 and strides_ok
            and (same_heads or (enable_gqa and divisible)) and not (is_causal and sq != sk)):
        return "flash"
    # memory-efficient: fp16/bf16/fp32 (sm80+), head dims aligned (8 for 16-bit, 4 for fp32), equal heads
    # (torch 2.11: no GQA / implicit MQA in this backend; added later, pytorch#191085).
    align = 8 if _half(q.dtype) else 4
    if (q.dtype in (torch.float16, torch.bfloat16, torch.float32) and dq == dk and dq % align == 0
            and dv % align == 0 and same_heads and all(t.stride(-1) == 1 for t in (q, k, v))):
        return "efficient"
    return "math"


_SDPA_USED = {}


def sdpa_sm90(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """F.scaled_dot_product_attention as torch 2.11 runs it on an sm90 GPU: same kernel, same tensors kept."""
    if torch.is_autocast_enabled("cpu"):
        # CUDA autocast lists scaled_dot_product_attention as lower precision: cast q, k, v (and a float mask)
        dt = torch.get_autocast_dtype("cpu")
        cast = lambda t: t.to(dt) if (t is not None and t.is_floating_point() and t.dtype != dt) else t
        query, key, value, attn_mask = cast(query), cast(key), cast(value), cast(attn_mask)
    with torch.autocast("cpu", enabled=False):
        if attn_mask is not None and attn_mask.dtype == torch.bool:
            # convert_boolean_attn_mask: where(mask.logical_not(), -inf, 0) in the query's dtype
            attn_mask = torch.where(attn_mask.logical_not(), torch.tensor(float("-inf"), dtype=query.dtype),
                                    torch.tensor(0.0, dtype=query.dtype))
        be = select_backend(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa)
        _SDPA_USED[be] = _SDPA_USED.get(be, 0) + 1
        need_lse = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
        if be == "cudnn":
            return torch.ops.aten._scaled_dot_product_cudnn_attention(
                query, key, value, attn_mask, need_lse, dropout_p, is_causal, False, scale=scale)[0]
        if be == "flash":
            return torch.ops.aten._scaled_dot_product_flash_attention(
                query, key, value, dropout_p, is_causal, False, scale=scale)[0]
        if be == "efficient":
            if attn_mask is not None:
                # preprocess_mask: pad the last dim to a multiple of 16 (a copy), then expand (a view)
                sk = attn_mask.shape[-1]
                if sk % 16:
                    attn_mask = F.pad(attn_mask, (0, 16 - sk % 16))[..., :sk]
                attn_mask = attn_mask.expand(query.shape[0], query.shape[1], query.shape[2], key.shape[2])
            return torch.ops.aten._scaled_dot_product_efficient_attention(
                query, key, value, attn_mask, need_lse, dropout_p, is_causal, scale=scale)[0]
        # math: the composite kernel itself (attention.cpp `_scaled_dot_product_attention_math`, the same C++
        # on CPU and CUDA) copies 16-bit q, k, v to fp32 (allowFP16BF16ReductionMathSDP is off by default),
        # adds the mask to the fp32 scores (`add_` on CUDA converts a 16-bit mask into a temporary; fake
        # tensors are "subclass-like" and take its out-of-place `add`, a transient below the softmax's), runs
        # `_safe_softmax` (its temporaries: Tracker.safe_softmax_temporaries) and returns the output and the
        # probabilities cast back to the input dtype. The probabilities' cast is dropped at return.
        return torch.ops.aten._scaled_dot_product_attention_math(
            query, key, value, attn_mask, dropout_p, is_causal, None, scale=scale, enable_gqa=enable_gqa)[0]


# --------------------------------------------------------------------------- CUDA autocast on CPU tensors
# Fake CUDA tensors cannot run autograd without a GPU, so training runs on fake CPU tensors under
# torch.autocast("cpu", bfloat16). The CPU autocast op lists differ from CUDA's (aten/src/ATen/autocast_mode.cpp):
# the ops below are cast by CUDA autocast but not by CPU autocast. This TorchFunctionMode applies CUDA's policy
# to them, above autograd, as autocast itself does (so autograd saves the cast tensors, as on the GPU).
from torch.overrides import TorchFunctionMode  # noqa: E402

CUDA_FP32 = {"acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal", "rsqrt",
             "sinh", "tan", "pow", "__pow__", "__rpow__", "float_power", "softplus", "layer_norm", "group_norm",
             "frobenius_norm", "nuclear_norm", "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss",
             "nll_loss", "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss",
             "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss",
             "multi_margin_loss", "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp"}
CUDA_FP32_SET_OPT_DTYPE = {"prod", "softmax", "log_softmax", "cumprod", "cumsum", "sum", "vector_norm", "matrix_norm"}
CUDA_LOWER = {"addmv", "addr", "einsum", "mv", "chain_matmul", "multi_dot"}


def _low(t):
    return isinstance(t, torch.Tensor) and t.dtype in (torch.float16, torch.bfloat16)


class CudaAutocastPolicy(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if not torch.is_autocast_enabled("cpu") or not name:
            return func(*args, **kwargs)
        if name in CUDA_FP32:
            if any(_low(a) for a in args) or any(_low(v) for v in kwargs.values()):
                args = tuple(a.float() if _low(a) else a for a in args)
                kwargs = {k: (v.float() if _low(v) else v) for k, v in kwargs.items()}
        elif name in CUDA_FP32_SET_OPT_DTYPE:
            if args and _low(args[0]) and kwargs.get("dtype") is None and not (
                    name in ("softmax", "log_softmax") and len(args) >= 4 and args[3] is not None):
                kwargs = dict(kwargs, dtype=torch.float32)
        elif name in CUDA_LOWER:
            dt = torch.get_autocast_dtype("cpu")
            cast = lambda a: a.to(dt) if isinstance(a, torch.Tensor) and a.dtype == torch.float32 else a
            args = tuple(cast(a) for a in args)
        elif name == "cross_entropy" and args and _low(args[0]):
            # CUDA: cross_entropy is not listed; inside it log_softmax runs with dtype=float32 (no input copy)
            # and nll_loss in fp32. CPU autocast would cast the whole input to fp32 first.
            x, target = args[0], args[1]
            rest = dict(zip(("weight", "size_average", "ignore_index", "reduce", "reduction", "label_smoothing"),
                            args[2:]), **kwargs)
            if not rest.get("label_smoothing"):
                rest.pop("label_smoothing", None)
                return F.nll_loss(torch.log_softmax(x, 1, dtype=torch.float32), target, **rest)
        return func(*args, **kwargs)


# --------------------------------------------------------------------------- transformers on fake tensors
_PATCHED = []
TOTAL = [0]        # the total length generate must reach (prompt + new tokens)


def patch_transformers():
    if _PATCHED:
        return
    _PATCHED.append(True)
    import transformers.masking_utils as mu
    import transformers.utils.import_utils as iu
    import transformers.generation.utils as gu

    # 1. fake tensors are not "tracing": masks are skipped exactly as on a GPU (is_causal=True kernels)
    iu.is_fake_tensor = lambda t: False
    # 2. the attention masks are all ones (measure.py): fast_all() is True without reading data
    orig_fast_all = mu.fast_all
    mu.fast_all = lambda t: True if isinstance(t, FakeTensor) else orig_fast_all(t)
    # 3. generation stops when every sequence reached the total length (min_new = max_new, no EOS)
    gu.StopCheck.__call__ = lambda self, unfinished, tokens, length: length >= TOTAL[0]
    # 4. on CUDA, decode switches MoE experts from grouped_mm to batched_mm (CPU does not)
    @contextlib.contextmanager
    def optimize_for_decode(self):
        orig = self.get_experts_implementation()
        switch = "grouped_mm" in orig.values()
        if switch:
            self.set_experts_implementation({k: "batched_mm" if v == "grouped_mm" else v for k, v in orig.items()})
        try:
            yield
        finally:
            if switch:
                self.set_experts_implementation(orig)
    gu.GenerationMixin._optimize_model_for_decode = optimize_for_decode
    # 5. SDPA picks its kernel as on sm90
    F.scaled_dot_product_attention = sdpa_sm90
    torch.nn.functional.scaled_dot_product_attention = sdpa_sm90
    # 6. softmax of an fp16 input with dtype=float32 converts inside CUDA's kernel, as on a GPU
    F.softmax = softmax_cuda
    # 7. opt-in (PEAKFIT_ORACLE_CUDA_DROPOUT=1): dropout as CUDA runs it, a one-byte mask, not the CPU's
    #    noise in the input's dtype. Off by default: the committed grid was made without it.
    if os.environ.get("PEAKFIT_ORACLE_CUDA_DROPOUT") == "1":
        F.dropout = dropout_cuda


_SOFTMAX = F.softmax


class _CudaDropout(torch.autograd.Function):
    """`native_dropout` on a CUDA tensor (aten/src/ATen/native/cuda/Dropout.cu, `dropout_cuda`): the `bool`
    mask first (`empty_like(self, kBool)`), then the output; the mask is saved, and backward
    (`native_dropout_backward`, `masked_scale`) makes the input's gradient alone. A fake run's CPU tensors take
    `_dropout_impl` instead (`is_fused_kernel_acceptable` wants a CUDA tensor), whose noise tensor is in the
    input's dtype: a GPT-2 or Phi-2 step there saves `c` bytes a mask element where the GPU saves one
    (`train_replay`'s `Run::dropout_mask`). Only the sizes and the order matter on fake tensors."""

    @staticmethod
    def forward(ctx, x, p):
        mask = torch.empty_like(x, dtype=torch.bool)
        out = torch.empty_like(x)
        ctx.save_for_backward(mask)
        return out

    @staticmethod
    def backward(ctx, grad):
        return torch.empty_like(grad), None


def dropout_cuda(input, p=0.5, training=True, inplace=False):
    """`F.dropout` as a CUDA tensor runs it (ATen's `dropout`): `native_dropout` in training at 0 < p < 1,
    out of place; otherwise what ATen does off that path (the input itself at p 0 or in eval; in place,
    `_dropout_impl`'s noise)."""
    if inplace or not training or p <= 0.0 or p >= 1.0 or input.numel() == 0:
        # in place (`dropout_`) CUDA takes `_dropout_impl` too: noise in the input's dtype
        return _DROPOUT(input, p, training, inplace)
    return _CudaDropout.apply(input, p)


_DROPOUT = F.dropout


def softmax_cuda(input, dim=None, _stacklevel=3, dtype=None):
    """`F.softmax` as a CUDA tensor runs it. ATen's `softmax(input, dim, dtype)`
    (aten/src/ATen/native/SoftMax.cpp) sends a CUDA `Half` input with `dtype=Float` straight to
    `_softmax(input, dim, half_to_float=true)`, whose kernel reads fp16 and writes fp32; every other input
    (`BFloat16`, and any CPU tensor, so the fake CPU tensors here) is first copied whole,
    `input.toType(dtype)`, and `_softmax` runs on the copy. Llama's `eager_attention_forward` calls
    `softmax(w, dtype=float32)`: on the CPU path an fp16 prefill held a 4-byte copy of every score that the GPU
    never makes (SmolLM2-1.7B eager at 16 x 2,048 measured 24.66 GiB in fp16, 28.41 in bf16). The fake tensors
    run `_softmax`'s meta function, which takes `half_to_float` on any device; autograd's
    `_softmax_backward_data` returns fp16, as on CUDA."""
    if (dim is not None and dtype == torch.float32 and isinstance(input, torch.Tensor)
            and input.dtype == torch.float16):
        return torch.ops.aten._softmax.default(input, dim, True)
    return _SOFTMAX(input, dim=dim, _stacklevel=_stacklevel, dtype=dtype)


def load_config(path):
    import transformers
    with open(path) as f:
        d = json.load(f)
    d = {k: v for k, v in d.items() if k not in ("transformers_version", "_name_or_path", "architectures")
         or (k == "architectures" and v)}
    return d, transformers.AutoConfig.for_model(**d)


def model_kind(d):
    mt = d.get("model_type")
    if mt == "whisper":
        return "whisper"
    if mt in ENCODER_TYPES:
        return "encoder"
    return "causal"


def fake_params(model, fake_mode):
    """Replace every parameter and buffer (built on the meta device) by a fake CPU tensor; ties kept."""
    memo = {}
    for mod in model.modules():
        for name, p in list(mod._parameters.items()):
            if p is None:
                continue
            if id(p) not in memo:
                with fake_mode:
                    t = torch.empty(p.shape, dtype=p.dtype, device="cpu")
                memo[id(p)] = torch.nn.Parameter(t, requires_grad=p.requires_grad)
            mod._parameters[name] = memo[id(p)]
        for name, b in list(mod._buffers.items()):
            if b is None:
                continue
            if id(b) not in memo:
                with fake_mode:
                    memo[id(b)] = torch.empty(b.shape, dtype=b.dtype, device="cpu")
            mod._buffers[name] = memo[id(b)]


DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "fp16-amp": torch.float32}


def run_case(c):
    """c: dict with config (path), workload, dtype, batch, context_tokens, new_tokens, gradient_checkpointing,
    optimizer, lora_rank, attention; reserved (default true): also replay the run through the caching
    allocator. Returns the result dict.

    The allocated peak comes from the run as `decode` asks (by default the prefill and the last decode step).
    Reserved memory is never released in the real run, so it depends on every step the GPU really ran: when
    the allocated run took that shortcut, reserved comes from a second run with every decode step."""
    res = _run_case(c)
    if c.get("reserved", True) and res.pop("_shortcut"):
        full = _run_case(dict(c, decode=c.get("reserved_decode") or "synth"))
        full.pop("_shortcut")
        res.update({k: full[k] for k in ("peak_reserved_bytes", "peak_reserved_gib", "reserved_phase",
                                          "reserved_breakdown_bytes", "largest_tensor_bytes", "reserved_oom",
                                          "reserved_cache_releases")})
        res["reserved_run"] = dict(decode=full["reserved_decode"], seconds=full["seconds"],
                                   peak_allocated_bytes=full["peak_allocated_bytes"],
                                   replay_allocated_bytes=full["reserved_breakdown_bytes"]["allocated_blocks"])
        res["seconds"] = round(res["seconds"] + full["seconds"], 2)
    elif not c.get("reserved", True):
        for k in ("peak_reserved_bytes", "peak_reserved_gib", "reserved_phase", "reserved_breakdown_bytes",
                  "reserved_oom", "reserved_cache_releases"):
            res.pop(k)
    res.pop("_shortcut", None)
    res.pop("_events", None)
    res.pop("reserved_decode", None)
    return res


def canonical(events):
    """Events with handles renumbered in allocation order (to compare two runs' streams)."""
    ids, out = {}, []
    for e in events:
        if e[0] == "a":
            ids[e[1]] = len(ids)
            out.append(("a", ids[e[1]], e[2]))
        elif e[0] == "f":
            out.append(("f", ids.get(e[1], ("?", e[1]))))
        else:
            out.append(e)
    return out


def check_synth(c):
    """Self-check of synthesize_steps: the synthesized stream against the one of a run of every step
    (`python -c 'import oracle; print(oracle.check_synth(case_dict))'` in tools/oracle)."""
    full = _run_case(dict(c, decode="all"))
    syn = _run_case(dict(c, decode="synth"))
    a, b = canonical(full["_events"]), canonical(syn["_events"])
    first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    return dict(id=c.get("id"), reserved_all=full["peak_reserved_bytes"], reserved_synth=syn["peak_reserved_bytes"],
                synthesized=syn["reserved_decode"] == "synth", events_all=len(a), events_synth=len(b),
                identical=a == b, first_difference=first, seconds_all=full["seconds"], seconds_synth=syn["seconds"])


def _run_case(c):
    import transformers
    t0 = time.time()
    d, cfg = load_config(c["config"])
    kind = c.get("kind") or model_kind(d)
    workload, dtype = c["workload"], c["dtype"]
    dt = DTYPES[dtype]
    b, ctx = int(c["batch"]), int(c["context_tokens"])
    new = int(c.get("new_tokens") or 0)
    attn = c.get("attention") or "sdpa"
    extra = {"attn_implementation": attn}
    total = TOTAL
    patch_transformers()
    _SDPA_USED.clear()

    with torch.device("meta"):
        if kind == "encoder":
            model = transformers.AutoModel.from_config(cfg, dtype=dt, **extra)
        elif kind == "whisper":
            model = transformers.AutoModelForSpeechSeq2Seq.from_config(cfg, dtype=dt, **extra)
        else:
            model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=dt, **extra)
    training = workload in ("training", "lora")
    if training:
        model.train()
        model.config.use_cache = False
        if c.get("gradient_checkpointing", "none") == "full":
            kw = {"use_reentrant": False}
            if dtype == "fp16-amp":
                # the recomputation in backward runs outside the forward's TorchFunctionMode: give it the
                # CUDA autocast policy through checkpoint's context_fn (no effect on what is saved)
                kw["context_fn"] = lambda: (contextlib.nullcontext(), CudaAutocastPolicy())
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kw)
            model.config.use_cache = False
        if workload == "lora":
            import peft
            r = int(c["lora_rank"])
            model = peft.get_peft_model(model, peft.LoraConfig(r=r, lora_alpha=2 * r, target_modules="all-linear",
                                                               lora_dropout=0.0, task_type="CAUSAL_LM"))
    else:
        model.eval()

    fake_mode = FakeTensorMode(allow_non_fake_inputs=False)
    fake_params(model, fake_mode)
    tr = Tracker()
    nparams = sum(p.numel() for p in model.parameters())
    with fake_mode, tr:
        for t in list(model.parameters()) + list(model.buffers()):
            tr.track(t, "weights")
        weights = tr.cur
        # measure.py builds the model on the GPU, then empty_cache() and reset_peak_memory_stats(): reserved
        # starts at the weights' segments (with the free room left in them)
        tr.events.append(("r",))
        tr.phase = "forward"
        tr.restart()
        if not training:
            run_inference(model, cfg, kind, b, ctx, new, dt, tr, c.get("decode") or "ends", total)
        else:
            run_training(model, cfg, c, b, ctx, dtype, tr)
        tr.finish()
    cats = tr.breakdown()
    if c.get("debug"):
        for rec in sorted(tr.snap, key=lambda r: -r[0])[:int(c["debug"])]:
            print(f"{rec[0] / GIB:8.4f} {rec[1]:12s} {rec[3]} {rec[4]} {rec[5]}", file=sys.stderr)
    events = tr.events
    if tr.synth_calls:
        events = synthesize_steps(tr.events, tr.marks, tr.synth_calls)
        if events is None:      # the recorded steps do not repeat: run every step
            return _run_case(dict(c, decode="all"))
    al, reserved_phase, weight_segments = replay_events(events)
    decode = c.get("decode") or "ends"
    shortcut = (not training and decode == "ends" and
                ((kind == "causal" and new > 2) or (kind == "whisper" and ctx > 2)))
    res = dict(c)
    res.update(
        _shortcut=shortcut, reserved_decode=("synth" if tr.synth_calls else "all" if decode == "synth" else decode),
        _events=events,
        peak_reserved_bytes=al.peak_reserved, peak_reserved_gib=round(al.peak_reserved / GIB, 4),
        reserved_phase=reserved_phase,
        reserved_breakdown_bytes=dict(weight_segments=weight_segments, small_pool=al.segments[True],
                                      large_pool=al.segments[False], segments=al.mallocs,
                                      allocated_blocks=al.peak_allocated),
        reserved_oom=al.oom, reserved_cache_releases=al.releases,
        largest_tensor_bytes=tr.largest,
        kind=kind, params=nparams, attn_implementation=getattr(model.config, "_attn_implementation", attn),
        sdpa_backends=dict(_SDPA_USED),
        peak_allocated_bytes=tr.peak, peak_allocated_gib=round(tr.peak / GIB, 4), peak_phase=tr.peak_phase,
        weights_bytes=weights,
        breakdown_bytes={k: cats.get(k, 0) for k in
                         ("weights", "gradients", "optimizer", "activations", "kv_cache", "temporaries",
                          "workspace")},
        data_reads=sorted(tr.data_reads), ops=tr.ops, seconds=round(time.time() - t0, 2),
        versions=dict(torch=torch.__version__, transformers=transformers.__version__, peft=_peft_version()))
    return res


def _peft_version():
    try:
        import peft
        return peft.__version__
    except Exception:
        return None


def run_inference(model, cfg, kind, b, ctx, new, dt, tr, decode, total):
    """Generation as measure.py runs it. decode="all" runs every decode step; decode="ends" runs the prefill
    and the last decode step only: every decode step allocates the same tensors except those that grow with
    the cache, so the decode phase peaks at its last step (the forward that extends the cache to ctx - 1
    tokens). "ends" runs the prefill of the real prompt (ctx - new tokens, one token generated), then, apart,
    a prompt of ctx - 2 tokens whose own prefill is not counted, followed by that last decode step."""
    import transformers
    calls = [0]
    on_decode = [None]

    def pre_hook(_m, _a, _k):
        tr.phase = "prefill" if calls[0] == 0 else "decode"
        tr.marks.append(len(tr.events))
        if calls[0] == 1 and on_decode[0]:
            on_decode[0]()
        calls[0] += 1

    def cache_hook(_m, _a, _k, out):
        pkv = getattr(out, "past_key_values", None)
        if pkv is None:
            return
        caches = [pkv]
        if hasattr(pkv, "self_attention_cache"):
            caches = [pkv.self_attention_cache, pkv.cross_attention_cache]
        for cache in caches:
            for layer in getattr(cache, "layers", []):
                for name in ("keys", "values"):
                    tr.tag(getattr(layer, name, None), "kv_cache")

    with torch.no_grad():
        if kind == "encoder":
            tr.phase = "forward"
            x = torch.randint(0, cfg.vocab_size, (b, ctx))
            model(input_ids=x)
            return
        model.register_forward_pre_hook(pre_hook, with_kwargs=True)
        model.register_forward_hook(cache_hook, with_kwargs=True)
        if kind == "whisper":
            def whisper(first_len, steps):
                calls[0] = 0
                tr.marks.clear()
                tr.phase = "prefill"
                feats = torch.randn(b, cfg.num_mel_bins, WHISPER_FRAMES, dtype=dt)
                enc = model.model.encoder(feats)
                cur = torch.full((b, first_len), WHISPER_START)
                past = None
                for _ in range(steps):      # like measure.py: the last step's output lives into the next
                    out = model(encoder_outputs=enc, decoder_input_ids=cur, past_key_values=past, use_cache=True)
                    past = out.past_key_values
                    cur = out.logits[:, -1:].argmax(-1)
                    if out.logits.shape[1] > 1:
                        # the stand-in for ctx - 1 one-token steps: keep what the last of them would leave
                        out = type(out)(logits=out.logits[:, -1:].clone(), past_key_values=past)
            if decode == "synth" and ctx > SYNTH_RECORDED:
                tr.synth_calls = ctx
                whisper(1, SYNTH_RECORDED)
            elif decode in ("all", "synth") or ctx <= 2:
                whisper(1, ctx)
            else:
                whisper(1, 1)
                tr.keep_peak()
                on_decode[0] = tr.restart
                whisper(ctx - 1, 2)     # one call over ctx - 1 tokens (not counted), then the last step
                on_decode[0] = None
            return

        def gen(prompt, n):
            calls[0] = 0
            tr.marks.clear()
            total[0] = prompt + n
            x = torch.randint(0, cfg.vocab_size, (b, prompt))
            gc = transformers.GenerationConfig(max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                               eos_token_id=None, pad_token_id=0)
            out = model.generate(x, attention_mask=torch.ones_like(x), generation_config=gc)
            assert out.shape[1] == prompt + n, out.shape
            assert calls[0] == n, (calls[0], n)

        # a sliding window the cache fills during the decode changes the steps' ops: run every step then
        window = getattr(cfg, "sliding_window", None) if getattr(cfg, "use_sliding_window", True) else None
        crosses = bool(window) and ctx - new < window <= ctx + 1
        if decode == "synth" and new > SYNTH_RECORDED and not crosses:
            tr.synth_calls = new
            gen(ctx - new, SYNTH_RECORDED)
        elif decode in ("all", "synth") or new <= 2:
            gen(ctx - new, new)
        else:
            gen(ctx - new, 1)
            tr.keep_peak()
            on_decode[0] = tr.restart
            gen(ctx - 2, 2)
            on_decode[0] = None


def run_training(model, cfg, c, b, ctx, dtype, tr):
    params = [p for p in model.parameters() if p.requires_grad]
    opt_name = c.get("optimizer") or "adamw"
    # On CUDA tensors torch defaults to the foreach implementations; on CPU it would pick the per-tensor
    # loop, whose temporaries differ: ask for what CUDA picks.
    if opt_name == "sgd":
        opt = torch.optim.SGD(params, lr=1e-5, momentum=0.9, foreach=True)
    elif opt_name == "adamw-fused":
        opt = torch.optim.AdamW(params, lr=1e-5, fused=True)
    elif opt_name == "adamw-loop":
        # The per-tensor loop (`_single_tensor_adam`): what `AdamW(params, fused=False)` runs, as
        # tools/measure/measure.py (and the shared rows' script) build it: `adam()` asks
        # `_default_to_fused_or_foreach` only when both `fused` and `foreach` are None.
        opt = torch.optim.AdamW(params, lr=1e-5, foreach=False)
    else:
        opt = torch.optim.AdamW(params, lr=1e-5, foreach=True)
    x = torch.randint(0, cfg.vocab_size, (b, ctx))

    def pack(t):
        tr.tag(t, "activations")
        return t

    # measure.py runs 3 steps. Step 3 repeats step 2 tensor for tensor (the optimizer state exists in both,
    # gradients are set to None after each), so 2 steps have the same peak; the grid uses steps=2.
    # `engine: hf-trainer` under autocast: accelerate wraps the forward in `convert_outputs_to_fp32` (outside
    # autocast) and `Trainer.compute_loss` keeps the loss alone, the outputs dropped before backward.
    trainer = c.get("engine") == "hf-trainer" and dtype == "fp16-amp"
    for _ in range(int(c.get("steps") or 3)):
        tr.phase = "forward"
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            if trainer:
                with torch.autocast("cpu", dtype=torch.bfloat16), CudaAutocastPolicy():
                    out = model(input_ids=x, labels=x)
                out = convert_to_fp32(out)
                loss = out["loss"]
                del out
            elif dtype == "fp16-amp":
                with torch.autocast("cpu", dtype=torch.bfloat16), CudaAutocastPolicy():
                    loss = model(input_ids=x, labels=x).loss
            else:
                loss = model(input_ids=x, labels=x).loss
        tr.phase = "backward"
        loss.backward()
        del loss
        for p in params:
            tr.tag(p.grad, "gradients")
        tr.phase = "optimizer step"
        opt.step()
        for st in opt.state.values():
            for v in st.values():
                if isinstance(v, torch.Tensor) and v.numel() > 1:
                    tr.tag(v, "optimizer")
        opt.zero_grad(set_to_none=True)


def optimizer_run(r):
    """The optimizer a measured row ran: its `optimizer` column, or `adamw-loop` where the notes' `path`
    names torch's per-tensor loop (`_single_tensor_adam`: `AdamW(params, fused=False)`, tests/data/h200c
    SOURCES.md); older folders' notes do not say, and are read as the column says."""
    if r["optimizer"] == "adamw" and "_single_tensor_adam" in r["notes"]:
        return "adamw-loop"
    return r["optimizer"] or None


def visible_cases(d):
    import csv
    import re
    import glob
    # The measured rows of a real-GPU folder (tests/data/h200, tests/data/h100): its one
    # `*-2026-11.csv` (the `-oom.csv` beside it lists cases that did not fit, with no counters).
    (path,) = [p for p in glob.glob(f"{d}/*.csv") if not p.endswith("-oom.csv")]
    rows = list(csv.DictReader(open(path)))
    out = []
    for r in rows:
        m = re.search(r"prompt (\d+) \+ (\d+) new tokens", r["notes"])
        c = dict(id=r["id"], config=f"{d}/configs/{r['id']}.json", workload=r["workload"], dtype=r["dtype"],
                 batch=int(r["batch"]), context_tokens=int(r["context_tokens"]),
                 new_tokens=int(m.group(2)) if m else None,
                 gradient_checkpointing=r["gradient_checkpointing"] or "none", optimizer=optimizer_run(r),
                 lora_rank=int(r["lora_rank"]) if r["lora_rank"] else None, attention=r["attention"] or "sdpa",
                 measured_gib=float(r["max_allocated_gib"]),
                 measured_reserved_gib=float(r["max_reserved_gib"] or "nan"),
                 measured_weights_gib=float(r["weights_gib"]))
        out.append(c)
    return out


def visible(a):
    cases = [c for c in visible_cases(a.dir) if not a.only or c["id"] in a.only]
    sink = open(a.jsonl, "a") if a.jsonl else None
    print(f"{'case':36s} {'allocated m / oracle':>21s} {'error':>8s}  {'reserved m / oracle':>21s} {'error':>8s}  "
          f"{'peak phase':15s} {'reserved phase':15s} seconds")
    errs, rerrs = [], []
    for c in cases:
        try:
            r = run_case(dict(c, reserved=not a.no_reserved))
        except Exception as e:
            print(f"{c['id']:36s} FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)
            continue
        err = 100.0 * (r["peak_allocated_gib"] - c["measured_gib"]) / c["measured_gib"]
        errs.append(err)
        line = f"{c['id']:36s} {c['measured_gib']:9.3f} / {r['peak_allocated_gib']:9.3f} {err:+7.2f}%  "
        if "peak_reserved_bytes" in r and c["measured_reserved_gib"] == c["measured_reserved_gib"]:
            rerr = 100.0 * (r["peak_reserved_bytes"] / GIB - c["measured_reserved_gib"]) / c["measured_reserved_gib"]
            rerrs.append(rerr)
            line += (f"{c['measured_reserved_gib']:9.3f} / {r['peak_reserved_bytes'] / GIB:9.3f} {rerr:+7.2f}%  "
                     f"{r['peak_phase']:15s} {r['reserved_phase']:15s}")
        else:
            line += f"{'':31s}  {r['peak_phase']:15s} {'':15s}"
        print(f"{line} {r['seconds']:7.1f}", flush=True)
        if sink:
            sink.write(json.dumps(r) + "\n")
            sink.flush()
    for name, e in (("allocated", errs), ("reserved", rerrs)):
        if e:
            a_ = sorted(abs(x) for x in e)
            print(f"{name}: {len(e)} rows, median |error| {a_[len(a_) // 2] if len(a_) % 2 else (a_[len(a_) // 2 - 1] + a_[len(a_) // 2]) / 2:.2f}%, "
                  f"worst |error| {a_[-1]:.2f}%, signed median {sorted(e)[len(e) // 2]:+.2f}%, lowest {min(e):+.2f}%")
    return 0


# --------------------------------------------------------------------------- CLI
def case_from_args(a):
    return dict(config=a.config, workload=a.workload, dtype=a.dtype, batch=a.batch, context_tokens=a.context_tokens,
                new_tokens=a.new_tokens, gradient_checkpointing=a.gradient_checkpointing, optimizer=a.optimizer,
                lora_rank=a.lora_rank, attention=a.attention, kind=a.kind, reserved=not a.no_reserved)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("case", help="one workload; prints its JSON result")
    p.add_argument("--config", required=True)
    p.add_argument("--workload", choices=["inference", "training", "lora"], default="inference")
    p.add_argument("--dtype", choices=list(DTYPES), default="bf16")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--context-tokens", type=int, required=True)
    p.add_argument("--new-tokens", type=int, default=None)
    p.add_argument("--gradient-checkpointing", choices=["none", "full"], default="none")
    p.add_argument("--optimizer", choices=["adamw", "adamw-loop", "adamw-fused", "sgd"], default="adamw")
    p.add_argument("--lora-rank", type=int, default=None)
    p.add_argument("--attention", choices=["sdpa", "eager"], default="sdpa")
    p.add_argument("--kind", choices=["causal", "encoder", "whisper"], default=None)
    p.add_argument("--no-reserved", action="store_true",
                   help="skip the caching-allocator replay (and the every-step generate run it needs)")
    p3 = sub.add_parser("visible", help="a real-GPU folder's measured rows (--dir tests/data/h200 or tests/data/h100): oracle vs max_allocated and max_reserved")
    p3.add_argument("--dir", default="../shared/data/gpu-measurements")
    p3.add_argument("--only", nargs="*", default=None)
    p3.add_argument("--jsonl", default=None, help="also write each result here")
    p3.add_argument("--no-reserved", action="store_true", help="skip the caching-allocator replay")
    p2 = sub.add_parser("batch", help="JSON lines in, JSON lines out (one process for many cases)")
    p2.add_argument("cases")
    a = ap.parse_args(argv)
    if a.cmd == "case":
        c = case_from_args(a)
        if c["workload"] == "inference" and model_kind(json.load(open(a.config))) == "causal" and not c["new_tokens"]:
            ap.error("--new-tokens is required for generate")
        print(json.dumps(run_case(c), indent=1))
        return 0
    if a.cmd == "visible":
        return visible(a)
    with open(a.cases) as f:
        for line in f:
            if not line.strip():
                continue
            c = json.loads(line)
            try:
                r = run_case(c)
                r["ok"] = True
            except Exception as e:  # report, keep going
                r = dict(c, ok=False, error=f"{type(e).__name__}: {str(e)[:300]}")
            print(json.dumps(r), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
