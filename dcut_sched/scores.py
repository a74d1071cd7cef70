"""Slot scores and global top-K selection: the pure core of D-Cut.

Every function here works on numpy arrays and on torch tensors (CPU or CUDA) alike and returns the
same kind it was given. Nothing here does I/O or touches a cost curve.

Contract (terms: ``docs/design.md`` §1; why the sums and the prefix property hold: §1.1):

- ``conf[i, t]``, t = 0..B-2: the draft's confidence in the draft token it put in slot t+2 (slot 1 is
  the anchor). A float in [0, 1].
- ``s[i, 0] = 1`` and ``s[i, k] = prod_{t<k} conf[i, t]``: the estimated probability that slot k+1
  (1-based) is useful, i.e. that drafts 1..k are all accepted. Non-increasing in k; a global top-K
  over the batch breaks ties by the earlier slot and then the lower request index, and keeps a
  prefix of every request.
- The expected number of tokens a selection produces is the sum of its selected scores (exact when
  the confidences are calibrated acceptance probabilities).
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
    "expected_tokens",
    "global_topk",
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
    """The ``torch`` module, for code that holds a tensor: already imported (a tensor exists only once
    it is), so the numpy paths never import it."""
    return sys.modules["torch"]


def check_confidences(conf: Array, *, name: str = "conf") -> None:
    """Raise ``ValueError`` unless ``conf`` is a non-empty ``[bs, B-1]`` float array in [0, 1].

    Checks, in order: two dimensions, bs >= 1, B-1 >= 1, a floating dtype, every value finite, every
    value in [0, 1]. On a CUDA tensor this synchronises with the host (one reduction); the online
    controller sanitises on the device instead and skips this check.

    Raises:
        ValueError: naming the failed condition, the shape, and for bad values the first offending
            (request, draft slot) and its value.
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
    """Raise ``ValueError`` unless ``scores`` is a ``[bs >= 1, B >= 1]`` float array, free of NaN, and
    non-increasing along every row (what makes a global top-K a prefix of every request).

    On a CUDA tensor this synchronises with the host (one reduction).
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
    """Prefix-product slot scores.

    Args:
        conf: ``[bs, B-1]`` float confidences in [0, 1] (numpy array or torch tensor, any device).
        validate: check ``conf`` first (see :func:`check_confidences`).

    Returns:
        ``[bs, B]`` scores of the same kind, dtype and device: column 0 is 1 (the anchor), column k is
        ``prod_{t<k} conf[:, t]``. Source: D-Cut (prefix product of draft confidences).

    Raises:
        ValueError: bad shape, empty batch, NaN/inf or out-of-range confidences (when ``validate``).
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
    """Ascending distinct verification budgets, prepared once for many :meth:`ScoreRanking.expected_tokens_at` calls.

    A policy that asks for the same few budgets every step (``dcut``'s buckets) keeps one per batch
    shape, so the per-step query skips converting, sorting and offsetting them.

    Attributes:
        array: ``[n]`` int64, read-only, ascending, distinct.
        values: the same budgets as a tuple of ints.
        kth: ``array - 1`` (int64, read-only): the ranks ``np.partition`` puts in place.

    Raises:
        ValueError: empty, not ascending and distinct, or not integers.
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
    """All global top-K selections of one batch, from a single sort.

    Sorting the ``bs*B`` scores once answers, for every budget K, both the expected tokens of the
    top-K selection (a prefix sum of the sorted scores) and the per-request lengths (a count of the
    first K sorted entries per request). The D-Cut bucket choice and the fine-grained policy ask for
    many K per step, so they share this object.

    Ties are broken by earlier slot, then by lower request index: the scores are flattened slot-major
    (index ``k * bs + i``) and sorted stably on the negated score.

    Args:
        scores: ``[bs, B]`` slot scores (numpy or torch), non-increasing along each row.
    """

    # Up to this many budgets per query, a numpy ranking answers with one ``np.partition`` (O(bs*B))
    # instead of a full sort (the D-Cut buckets ask for 4); more budgets (``fine``) sort once.
    PARTITION_MAX_BUDGETS: ClassVar[int] = 8

    def __init__(self, scores: Array):
        if len(scores.shape) != 2 or scores.shape[0] < 1 or scores.shape[1] < 1:
            raise ValueError(f"scores must have shape [batch_size >= 1, B >= 1]; got {tuple(scores.shape)}")
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
        """Negated flat scores with the entry of each rank ``K - 1`` (K in ``ks``) in sorted place.

        ``np.partition`` puts each requested rank where a sort would, with only smaller (negated)
        values before it, so the first K entries are the top-K scores (their sum is E(K)) and entry
        K - 1 is the K-th largest score, the selection threshold. Kept for :meth:`lengths`.
        ``kth``: ``ks - 1`` as an int64 array, when the caller has it.
        """
        part = np.partition(-self._scores.reshape(-1), np.array(ks) - 1 if kth is None else kth)
        self._part, self._part_ks = part, frozenset(ks)
        return part

    def _partitioned_expected(self, budgets: Sequence[int], kth: np.ndarray) -> np.ndarray:
        """E(K) for ascending distinct ``budgets`` (``kth = budgets - 1``): the running float64 sum of
        the partitioned scores read at each K - 1 (the entries before K - 1 are exactly the K - 1
        larger scores, in some order)."""
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
        """Expected tokens of the top-K selection for each K in ``ks``.

        Args:
            ks: budgets (any int array-like, any order, repeats allowed), or a :class:`Budgets`
                (ascending distinct, prepared once: the fast path of a per-step query).

        Returns a float64 numpy array on the host (one device-to-host copy for a torch ranking).
        Every K must satisfy ``bs <= K <= bs*B`` (``ValueError`` otherwise).
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
        """Per-request lengths ``[bs]`` (int64, same kind/device as the scores) of the top-``k``.

        Each length is >= 1 and they sum to ``k``; slots kept are a prefix of each request.
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

    def _threshold_lengths(self, k: int) -> np.ndarray:
        """Top-``k`` lengths from the k-th largest score ``v``, without a sort.

        Every score above ``v`` is selected; rows are non-increasing, so a row's count of them is its
        prefix length. The ``need`` remaining slots come from the scores equal to ``v`` in the
        ranking's tie order (earlier slot first, then lower request index: slot-major order).
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
    """Per-request verification lengths of the global top-``k`` slots of the batch.

    Args:
        scores: ``[bs, B]`` slot scores from :func:`slot_scores` (numpy or torch).
        k: the verification budget in slots (tokens), ``bs <= k <= bs*B``.
        validate: check ``scores`` first (:func:`check_scores`: NaN or scores that rise along a row
            raise; one host sync on CUDA).

    Returns:
        ``[bs]`` int64 lengths, each >= 1, summing to ``k``, each a prefix of its request; ties go to
        the earlier slot, then the lower request index. Source: D-Cut global top-K.

    Raises:
        ValueError: ``k`` outside ``[bs, bs*B]`` (the message names the bounds) or bad ``scores``
            (shape, NaN, rising along a row).
    """
    if validate:
        check_scores(scores)
    return ScoreRanking(scores).lengths(k)


def expected_tokens(scores: Array, lengths: Array, *, per_request: bool = False, validate: bool = True) -> Any:
    """Expected tokens produced when request i verifies its first ``lengths[i]`` slots.

    ``E = sum_i sum_{k < lengths[i]} scores[i, k]`` (derivation: docs/design.md §1.1).

    Args:
        scores: ``[bs, B]`` slot scores (numpy or torch).
        lengths: ``[bs]`` ints in [0, B] (same kind as ``scores``, or anything array-like).
        per_request: return the ``[bs]`` per-request values instead of the total.
        validate: check the shapes and that every length is in ``[0, B]`` (one host sync on CUDA;
            the policies pass False for lengths they built).

    Returns:
        The total as a Python float, or a ``[bs]`` array/tensor of the scores' kind when
        ``per_request``.

    Raises:
        ValueError: ``scores`` not ``[bs, B]``, ``lengths`` not ``[bs]``, or a length outside ``[0, B]``.
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


def verified_prefix_tokens(accept_len: Array, lengths: Array) -> Array:
    """Tokens a request produces when it verifies its first ``lengths`` slots: ``1 + min(a, L - 1)``.

    The one implementation of the rule (docs/design.md §1, §3; why it holds, for greedy verification
    and, with ``a`` drawn per seed, for sampled verification of greedy drafts: §1.1 and
    :mod:`dcut_sched.sampling`).

    Args:
        accept_len: ``[bs]`` ints in ``[0, B-1]`` (numpy or torch).
        lengths: ``[bs]`` ints in ``[1, B]`` (same kind, or array-like).

    Returns:
        ``[bs]`` int64 array/tensor of the inputs' kind.
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
