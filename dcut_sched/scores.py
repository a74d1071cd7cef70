"""Slot scores and global top-K selection, the pure core of D-Cut (terms: docs/design.md §1, §1.1).

Works on numpy arrays and torch tensors (any device) alike, returns the kind it was given, no I/O.
Indexing from 0: ``conf[i, t]`` is the confidence of the draft in slot t+2, ``s[i, 0] = 1`` and
``s[i, k] = prod_{t<k} conf[i, t]``; a global top-K breaks ties by earlier slot, then lower request.
"""

from __future__ import annotations

import math
import sys
from typing import TYPE_CHECKING, Any, ClassVar, Sequence, Union

import numpy as np

if TYPE_CHECKING:
    import torch

# numpy array or torch tensor. torch is never imported here: a tensor can only exist once the
# caller has imported torch, so the numpy paths (the simulator) run without it.
Array = Union[np.ndarray, "torch.Tensor"]

__all__ = [
    "Array",
    "Budgets",
    "ScoreRanking",
    "check_confidences",
    "check_scores",
    "drain_progress",
    "drain_slots",
    "expected_tokens",
    "global_topk",
    "host_remaining",
    "is_tensor",
    "tensor_module",
    "slot_scores",
    "verified_prefix_tokens",
]


def is_tensor(x: Any) -> bool:
    """Whether ``x`` is a torch tensor, without importing torch (no tensor exists before it is)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


_is_torch = is_tensor


def tensor_module() -> Any:
    """The imported ``torch`` module, for code that holds a tensor (so numpy paths never import it)."""
    return sys.modules["torch"]


def check_confidences(conf: Array, *, name: str = "conf") -> None:
    """Raise ``ValueError`` unless ``conf`` is a non-empty ``[bs, B-1]`` float array with every value in
    [0, 1]; the message names the condition, or the first bad (request, draft slot). Syncs on CUDA.
    """
    if not (isinstance(conf, np.ndarray) or _is_torch(conf)):
        raise ValueError(f"{name} must be a numpy array or torch tensor of shape [batch_size, block_size - 1]; "
                         f"got {type(conf).__name__} (wrap it with np.asarray / torch.as_tensor)")
    shape = tuple(conf.shape)
    if len(shape) != 2:
        raise ValueError(
            f"{name} must have shape [batch_size, block_size - 1]; got {len(shape)} dims {shape}"
        )
    if shape[0] < 1:
        raise ValueError(f"{name} is an empty batch (shape {shape}); batch_size must be >= 1")
    if shape[1] < 1:
        raise ValueError(
            f"{name} has no draft slots (shape {shape}); block_size must be >= 2 for speculation"
        )
    if _is_torch(conf):
        torch = tensor_module()
        if not conf.is_floating_point():
            raise ValueError(f"{name} must be a floating tensor; got dtype {conf.dtype}")
        bad = ~((conf >= 0) & (conf <= 1))  # False for NaN too, and +-inf fails one side
        if bool(bad.any()):
            i, t = (int(v) for v in torch.nonzero(bad)[0])
            value = float(conf[i, t])
            raise ValueError(_bad_value_message(name, i, t, value))
    else:
        conf = np.asarray(conf)
        if not np.issubdtype(conf.dtype, np.floating):
            raise ValueError(f"{name} must be a floating array; got dtype {conf.dtype}")
        # Fast path: NaN makes min/max NaN and every comparison with NaN is False, so two reductions
        # reject NaN, +-inf and out-of-range values alike.
        if not (conf.min() >= 0 and conf.max() <= 1):
            bad = ~((conf >= 0) & (conf <= 1))
            i, t = np.argwhere(bad)[0]
            raise ValueError(_bad_value_message(name, int(i), int(t), float(conf[i, t])))


def _bad_value_message(name: str, i: int, t: int, value: float) -> str:
    what = "not finite" if not math.isfinite(value) else "outside [0, 1]"
    return (
        f"{name}[{i}, {t}] = {value!r} is {what}: confidences must be finite probabilities in "
        f"[0, 1] (request {i}, draft slot {t + 1})"
    )


def check_scores(scores: Array, *, name: str = "scores") -> None:
    """Raise ``ValueError`` unless ``scores`` is a ``[bs >= 1, B >= 1]`` float array free of NaN and
    non-increasing along every row (what makes a top-K a prefix). Syncs on CUDA.
    """
    if not (isinstance(scores, np.ndarray) or _is_torch(scores)):
        raise ValueError(f"{name} must be a numpy array or torch tensor of shape [batch_size, B]; got "
                         f"{type(scores).__name__}")
    shape = tuple(scores.shape)
    if len(shape) != 2 or shape[0] < 1 or shape[1] < 1:
        raise ValueError(f"{name} must have shape [batch_size >= 1, B >= 1]; got {shape}")
    if _is_torch(scores):
        torch = tensor_module()
        if not scores.is_floating_point():
            raise ValueError(f"{name} must be a floating tensor; got dtype {scores.dtype}")
        nan = torch.isnan(scores)
        rising = scores[:, 1:] > scores[:, :-1]
        if bool(nan.any() | rising.any()):
            if bool(nan.any()):
                i, k = (int(v) for v in torch.nonzero(nan)[0])
                raise ValueError(f"{name}[{i}, {k}] is NaN; slot scores must be numbers (check the confidences)")
            i, k = (int(v) for v in torch.nonzero(rising)[0])
            raise ValueError(_rising_message(name, i, k, float(scores[i, k]), float(scores[i, k + 1])))
        return
    if not np.issubdtype(scores.dtype, np.floating):
        raise ValueError(f"{name} must be a floating array; got dtype {scores.dtype}")
    nan = np.isnan(scores)
    if nan.any():
        i, k = np.argwhere(nan)[0]
        raise ValueError(f"{name}[{i}, {k}] is NaN; slot scores must be numbers (check the confidences)")
    rising = scores[:, 1:] > scores[:, :-1]
    if rising.any():
        i, k = np.argwhere(rising)[0]
        raise ValueError(_rising_message(name, int(i), int(k), float(scores[i, k]), float(scores[i, k + 1])))


def _rising_message(name: str, i: int, k: int, a: float, b: float) -> str:
    return (f"{name} rise along row {i}: {name}[{i}, {k}] = {a!r} < {name}[{i}, {k + 1}] = {b!r}; slot scores "
            f"must be non-increasing prefix products (slot_scores(conf)), or the top-K is not a prefix")


def slot_scores(conf: Array, *, validate: bool = True) -> Array:
    """``[bs, B]`` prefix-product scores of ``[bs, B-1]`` confidences, of their kind, dtype and device:
    column 0 is 1 (the anchor), column k is ``prod_{t<k} conf[:, t]``. ``validate``: :func:`check_confidences`.
    """
    if validate:
        check_confidences(conf)
    if _is_torch(conf):
        torch = tensor_module()
        ones = torch.ones((conf.shape[0], 1), dtype=conf.dtype, device=conf.device)
        return torch.cat([ones, torch.cumprod(conf, dim=1)], dim=1)
    conf = np.asarray(conf)
    out = np.empty((conf.shape[0], conf.shape[1] + 1), dtype=conf.dtype)
    out[:, 0] = 1
    np.cumprod(conf, axis=1, out=out[:, 1:])  # exactly the products with the leading 1
    return out


class Budgets:
    """Ascending distinct budgets (``array``: read-only int64; ``values``: ints; ``kth = array - 1``),
    prepared once for many :meth:`ScoreRanking.expected_tokens_at` calls; ``ValueError`` otherwise.
    """

    __slots__ = ("array", "values", "kth")

    def __init__(self, ks: Any):
        arr = np.array(ks, dtype=np.int64).reshape(-1)
        if arr.size == 0 or (arr.size > 1 and not (np.diff(arr) > 0).all()):
            raise ValueError(f"Budgets: need ascending distinct budgets, got {arr.tolist()}")
        arr.setflags(write=False)
        kth = arr - 1
        kth.setflags(write=False)
        self.array, self.values, self.kth = arr, tuple(arr.tolist()), kth

    def __len__(self) -> int:
        return len(self.values)

    def __repr__(self) -> str:
        return f"Budgets({list(self.values)})"


class ScoreRanking:
    """Every global top-K selection of one ``[bs, B]`` batch of scores from one sort: E(K) is a prefix
    sum of the sorted scores, the lengths a per-request count. Ties: the scores are flattened slot-major
    (``k * bs + i``) and sorted stably on the negated score.
    """

    # Up to this many budgets per query, a numpy ranking answers with one ``np.partition`` (O(bs*B))
    # instead of a full sort (the D-Cut buckets ask for 4); more budgets (``fine``) sort once.
    PARTITION_MAX_BUDGETS: ClassVar[int] = 8

    def __init__(self, scores: Array):
        assert len(scores.shape) == 2 and scores.shape[0] >= 1 and scores.shape[1] >= 1, \
            f"scores must have shape [batch_size >= 1, B >= 1]; got {tuple(scores.shape)}"
        self.batch_size = int(scores.shape[0])
        self.block_size = int(scores.shape[1])
        self._torch = _is_torch(scores)
        self._order: Any = None
        self._cumsum: Any = None
        if self._torch:
            torch = tensor_module()
            flat = scores.t().reshape(-1)
            sorted_neg, order = torch.sort(-flat, stable=True)
            self._order = order
            self._cumsum = torch.cumsum(-sorted_neg.to(torch.float64), dim=0)
        else:
            self._scores = np.asarray(scores)
            # Set by _partition: the negated scores partitioned at (budgets - 1), and those budgets.
            self._part: np.ndarray | None = None
            self._part_ks: frozenset[int] = frozenset()

    def _sort(self) -> None:
        """The full stable sort (numpy), done on the first query that needs it."""
        if self._order is None:
            flat = np.ascontiguousarray(self._scores.T).reshape(-1)
            self._order = np.argsort(-flat, kind="stable")
            self._cumsum = np.cumsum(flat[self._order], dtype=np.float64)

    def _partition(self, ks: Sequence[int], kth: np.ndarray | None = None) -> np.ndarray:
        """Negated flat scores with each rank ``K - 1`` (K in ``ks``; ``kth = ks - 1`` if the caller has it)
        in sorted place and only larger scores before it; kept for :meth:`lengths`.
        """
        part = np.partition(-self._scores.reshape(-1), np.array(ks) - 1 if kth is None else kth)
        self._part, self._part_ks = part, frozenset(ks)
        return part

    def _partitioned_expected(self, budgets: Sequence[int], kth: np.ndarray) -> np.ndarray:
        """E(K) for ascending distinct ``budgets``: the running float64 sum of the partitioned scores, read at
        each ``K - 1``.
        """
        part = self._partition(budgets, kth)
        return -np.add.accumulate(part[: budgets[-1]], dtype=np.float64)[kth]

    @property
    def max_tokens(self) -> int:
        """``bs * B``: the largest budget."""
        return self.batch_size * self.block_size

    def check_budget(self, k: int) -> int:
        """Return ``k`` as an int, or raise ``ValueError`` unless ``bs <= k <= bs*B``."""
        k_int = int(k)
        if k_int != k or not (self.batch_size <= k_int <= self.max_tokens):
            raise ValueError(
                f"verification budget k={k} is out of range: need batch_size <= k <= batch_size * "
                f"block_size, i.e. {self.batch_size} <= k <= {self.max_tokens} (every request "
                f"verifies at least its anchor slot)"
            )
        return k_int

    def expected_tokens_at(self, ks: Any) -> np.ndarray:
        """E(K) of the top-K selection for each K in ``ks`` (int array-like in any order, or a
        :class:`Budgets`), a float64 numpy array on the host; ``ValueError`` unless ``bs <= K <= bs*B``.
        """
        if type(ks) is Budgets and not self._torch and self._order is None and len(ks) <= self.PARTITION_MAX_BUDGETS:
            values = ks.values
            if values[0] < self.batch_size or values[-1] > self.max_tokens:
                self.check_budget(values[0] if values[0] < self.batch_size else values[-1])
            return self._partitioned_expected(values, ks.kth)
        if type(ks) is Budgets:
            ks = ks.array
        ks_arr = np.atleast_1d(np.asarray(ks, dtype=np.int64))
        ks_list = ks_arr.tolist()
        if ks_list and (min(ks_list) < self.batch_size or max(ks_list) > self.max_tokens):
            bad = [k for k in ks_list if not (self.batch_size <= k <= self.max_tokens)][0]
            self.check_budget(bad)
        if self._torch:
            torch = tensor_module()
            idx = torch.as_tensor(ks_arr - 1, device=self._cumsum.device)
            return self._cumsum[idx].cpu().numpy()
        if self._order is None and 0 < len(ks_list) <= self.PARTITION_MAX_BUDGETS:
            budgets = sorted(set(ks_list))
            # The usual query is ascending distinct budgets (the D-Cut buckets): reuse its array.
            kth = ks_arr - 1 if budgets == ks_list else np.array(budgets, dtype=np.int64) - 1
            expected = self._partitioned_expected(budgets, kth)
            if budgets == ks_list:
                return expected
            at = dict(zip(budgets, expected.tolist()))
            return np.array([at[k] for k in ks_list], dtype=np.float64)
        self._sort()
        return self._cumsum[ks_arr - 1]

    def lengths(self, k: int) -> Array:
        """Per-request lengths ``[bs]`` of the top-``k`` (int64, the scores' kind): each >= 1, a prefix of
        its request, summing to ``k``.
        """
        k = self.check_budget(k)
        if self._torch:
            torch = tensor_module()
            chosen = self._order[:k] % self.batch_size
            # scatter-add into zeros(bs): torch.bincount would read max() on the host (a CUDA sync)
            counts = torch.zeros(self.batch_size, dtype=torch.int64, device=chosen.device)
            return counts.index_add_(0, chosen, torch.ones_like(chosen))
        if self._order is not None:
            chosen = self._order[:k] % self.batch_size
            return np.bincount(chosen, minlength=self.batch_size).astype(np.int64)
        return self._threshold_lengths(k)

    def lengths_at(self, ks: Any) -> np.ndarray:
        """The top-K lengths for each K in ``ks`` at once: ``[len(ks), bs]`` int64 on the host (one sort;
        row c equals :meth:`lengths` ``(ks[c])``). ``ValueError`` unless ``bs <= K <= bs*B``.
        """
        ks_arr = np.atleast_1d(np.asarray(ks, dtype=np.int64))
        self.check_budget(int(ks_arr.min()))
        self.check_budget(int(ks_arr.max()))
        if self._torch:
            order = self._order.cpu().numpy()
        else:
            self._sort()
            order = self._order
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        rank = rank.reshape(self.block_size, self.batch_size)  # slot-major: [B, bs]
        return (rank[None, :, :] < ks_arr[:, None, None]).sum(axis=1, dtype=np.int64)

    def _threshold_lengths(self, k: int) -> np.ndarray:
        """Top-``k`` lengths without a sort: every score above the k-th largest ``v`` (a prefix per row),
        then the slots still needed from the scores equal to ``v`` in tie order.
        """
        part = self._part if k in self._part_ks else self._partition([k])
        v = -part[k - 1]
        scores = self._scores
        lengths = (scores >= v).sum(axis=1)
        if int(lengths.sum()) != k:  # more slots tie at v than the budget has room for
            lengths = (scores > v).sum(axis=1)
            need = k - int(lengths.sum())
            _, rows = np.nonzero((scores == v).T)  # slot-major: earlier slot, then lower request
            lengths += np.bincount(rows[:need], minlength=self.batch_size)
        return lengths.astype(np.int64, copy=False)


def global_topk(scores: Array, k: int, *, validate: bool = True) -> Array:
    """``[bs]`` int64 lengths of the global top-``k`` slots (``bs <= k <= bs*B``; see :meth:`ScoreRanking.lengths`).
    ``validate``: :func:`check_scores` first. Raises ``ValueError`` on a bad ``k`` or bad scores.
    """
    if validate:
        check_scores(scores)
    return ScoreRanking(scores).lengths(k)


def expected_tokens(scores: Array, lengths: Array, *, per_request: bool = False, validate: bool = True) -> Any:
    """Expected tokens when request i verifies its first ``lengths[i]`` slots, ``sum_i sum_{k < L[i]} s[i, k]``:
    a float, or the ``[bs]`` values (the scores' kind) with ``per_request``. ``validate`` checks the
    shapes and ``0 <= lengths <= B`` (``ValueError``; syncs on CUDA).
    """
    if validate:
        _check_lengths(scores, lengths)
    block = scores.shape[1]
    if _is_torch(scores):
        torch = tensor_module()
        lengths = torch.as_tensor(lengths, device=scores.device)
        mask = torch.arange(block, device=scores.device)[None, :] < lengths[:, None]
        per = (scores * mask).sum(dim=1)
        return per if per_request else float(per.sum())
    scores = np.asarray(scores)
    mask = np.arange(block)[None, :] < np.asarray(lengths)[:, None]
    per = (scores * mask).sum(axis=1)
    return per if per_request else float(per.sum())


def host_remaining(remaining: Any, batch_size: int, where: str) -> np.ndarray:
    """``remaining`` (numpy, torch on any device, or a list: ``[batch_size]`` integers, each request's
    tokens still to generate at most) as host int64, each at least 1; an unsigned value beyond int64
    counts as its largest (a cast would wrap it below 1: "ends this step"). ``where`` names the caller.

    Raises:
        TypeError: not integers. ValueError: not ``[batch_size]``.
    """
    if _is_torch(remaining):
        remaining = remaining.cpu().numpy()
    arr = np.asarray(remaining)
    if arr.dtype.kind not in "iu":
        raise TypeError(f"{where}: remaining must be integers (tokens each request still generates at most); "
                        f"got dtype {arr.dtype}")
    if arr.shape != (batch_size,):
        raise ValueError(f"{where}: remaining must have shape [{batch_size}] (one per request of conf); "
                         f"got {arr.shape}")
    if arr.dtype == np.uint64:
        arr = np.minimum(arr, np.uint64(np.iinfo(np.int64).max))
    return np.maximum(arr.astype(np.int64), 1)


def drain_slots(remaining: np.ndarray, block_size: int) -> np.ndarray:
    """``[bs, B]`` bool: the slots of a draining batch (no request waits) whose acceptance can bring its
    end closer this step, for ``remaining [bs]`` (>= 1) tokens each request still generates at most:
    slot ``a`` of request i when ``a < R_i - R_max + min(B, R_max)``, and every anchor (docs/design.md
    §2.1, "A draining batch").
    """
    r = np.asarray(remaining, dtype=np.int64)
    r_max = int(r.max())
    room = r - r_max + min(block_size, r_max)
    slot = np.arange(block_size)[None, :]
    return (slot == 0) | (slot < room[:, None])


def drain_progress(scores: np.ndarray, lengths: np.ndarray, remaining: np.ndarray) -> np.ndarray:
    """Expected steps one step takes off a draining batch's end, per candidate: ``R_max - E[max_i
    max(R_i - 1 - A_i, 0)]`` for ``lengths [n, bs]``, independent requests with ``P(A_i >= a) =
    scores[i, a]`` for ``a < lengths[c, i]`` (0 beyond) and ``remaining [bs]`` (>= 1) tokens each
    still generates at most. ``[n]`` float64, each in ``[1, min(B, R_max)]``; host numpy (docs/design.md
    §2.1, "A draining batch"). One request: the expected tokens, capped at ``R``.
    """
    scores = np.asarray(scores, dtype=np.float64)
    bs, block = scores.shape
    r = np.asarray(remaining, dtype=np.int64)
    r_max = int(r.max())
    # a[i, d]: request i is within R_max - d - 1 tokens of its end after this step iff A_i >= a[i, d]
    a = r[:, None] - r_max + np.arange(min(block, r_max))[None, :]
    p = np.where(a <= 0, 1.0, scores[np.arange(bs)[:, None], np.clip(a, 0, block - 1)])
    within = a[None, :, :] < np.asarray(lengths, dtype=np.int64)[:, :, None]  # [n, bs, D]
    return np.where(within, p[None, :, :], 0.0).prod(axis=1).sum(axis=1)


def verified_prefix_tokens(accept_len: Array, lengths: Array) -> Array:
    """Tokens a request makes verifying its first ``lengths`` slots, ``1 + min(accept_len, lengths - 1)``
    (int64, the inputs' kind): the one implementation of the rule (docs/design.md §1.1).
    """
    if _is_torch(accept_len):
        torch = tensor_module()
        lengths = torch.as_tensor(lengths, device=accept_len.device)
        return 1 + torch.minimum(accept_len.long(), lengths.long() - 1)
    return 1 + np.minimum(np.asarray(accept_len, dtype=np.int64), np.asarray(lengths, dtype=np.int64) - 1)


def _check_lengths(scores: Array, lengths: Any) -> None:
    if not hasattr(scores, "shape") or len(scores.shape) != 2:
        raise ValueError(f"scores must have shape [batch_size, B]; got {getattr(scores, 'shape', type(scores).__name__)}")
    bs, block = int(scores.shape[0]), int(scores.shape[1])
    if _is_torch(lengths):
        torch = tensor_module()
        shape, lo, hi = tuple(lengths.shape), None, None
        if shape == (bs,) and bs:
            lo, hi = (int(v) for v in torch.aminmax(lengths))
    else:
        arr = np.asarray(lengths)
        shape = arr.shape
        if arr.dtype.kind not in "iub" and not (arr.dtype.kind == "f" and np.all(arr == np.round(arr))):
            raise ValueError(f"lengths must be integers in [0, {block}]; got dtype {arr.dtype}")
        lo, hi = (int(arr.min()), int(arr.max())) if shape == (bs,) and bs else (None, None)
    if shape != (bs,):
        raise ValueError(f"lengths must have shape [{bs}] (one per request of scores {tuple(scores.shape)}); got {shape}")
    if lo is not None and (lo < 0 or hi > block):
        raise ValueError(f"lengths must be in [0, {block}] (B = {block} slots); got range [{lo}, {hi}]")
