"""Bundles (docs/study-design.md): each worker answers one bundle; every task is answered R times,
no bundle holds two tasks of one sample, and every bundle mixes methods and k evenly."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from saleval.config.crowd import DesignError
from saleval.crowd.seeding import seeded_rng


def _divisors_up_to(total: int, limit: int) -> list[int]:
    return [d for d in range(limit, 0, -1) if total % d == 0][:4]


def assign_bundles(
    tasks: pd.DataFrame,
    orders: Sequence[Sequence[str]],
    methods: Sequence[str],
    ks: Sequence[int],
    bundle_size: int,
    repeats: int,
    seed: int = 0,
    gold_ids: Sequence[str] = (),
    gold_per_bundle: int = 0,
) -> pd.DataFrame:
    """Bundles in which every task appears ``repeats`` times (docs/study-design.md#bundles).

    Construction. Think of the study as ``P·R`` *laps*, each a pass over the N samples
    in a fixed order; lap ``c`` (``c1 = c mod M``, ``c2 = c div M``) gives the sample
    at position j the method ``(j + c1) mod M`` and the k ``(j + c2) mod K``. Over the
    P laps of one repeat a sample gets every (method, k) pair exactly once; any run
    of consecutive positions in a lap cycles through methods and ks, so it is
    balanced in both. Bundles are consecutive runs of B slots of the laps: with
    B ≤ N a run never holds a sample twice. ``orders`` holds one sample order per
    repeat (class-interleaved), so the R copies of a task land in different company;
    when the laps of one repeat do not fill whole bundles, the first order serves all
    repeats, which keeps runs that cross a repeat free of duplicate samples.
    Positions inside a bundle are shuffled (seeded); ``gold_per_bundle`` gold
    questions, cycling through ``gold_ids``, are mixed in.
    """
    methods, ks = list(methods), sorted({int(k) for k in ks})
    n_m, n_k = len(methods), len(ks)
    n_pairs = n_m * n_k
    n = len(orders[0])
    total = n * n_pairs * repeats
    if bundle_size > n:
        raise DesignError(
            f"bundle size B={bundle_size} exceeds the N={n} samples: a bundle may not hold two "
            f"tasks of one sample; use B <= {n}"
        )
    if total % bundle_size:
        raise DesignError(
            f"{n} samples x {n_m} methods x {n_k} k values x R={repeats} = {total} answers do "
            f"not fill bundles of B={bundle_size}; choose B dividing {total}, at most {n} "
            f"(e.g. {_divisors_up_to(total, n)})"
        )
    if gold_per_bundle > len(gold_ids):
        raise DesignError(
            f"{gold_per_bundle} gold questions per bundle need at least as many gold items; "
            f"have {len(gold_ids)} (study.gold_pool)"
        )
    per_repeat = (n * n_pairs) % bundle_size == 0 and len(orders) >= repeats
    lookup = {
        (s, m, int(k)): t
        for t, s, m, k in tasks[["task_id", "sample_id", "method", "k"]].itertuples(index=False)
    }
    stream: list[str] = []
    for a in range(repeats):
        order = orders[a] if per_repeat else orders[0]
        if len(order) != n or len(set(order)) != n:
            raise DesignError("every repeat's sample order must list the same N distinct samples")
        for c in range(n_pairs):
            c1, c2 = c % n_m, c // n_m
            for j, sid in enumerate(order):
                key = (sid, methods[(j + c1) % n_m], ks[(j + c2) % n_k])
                if key not in lookup:
                    raise DesignError(
                        f"no task for sample {key[0]!r}, method {key[1]!r}, k={key[2]}"
                    )
                stream.append(lookup[key])
    n_bundles = total // bundle_size
    width = max(3, len(str(n_bundles)))
    rows: list[dict[str, object]] = []
    for b in range(n_bundles):
        bid = f"b{b + 1:0{width}d}"
        items = [(t, False) for t in stream[b * bundle_size : (b + 1) * bundle_size]]
        items += [
            (gold_ids[(b * gold_per_bundle + g) % len(gold_ids)], True)
            for g in range(gold_per_bundle)
        ]
        perm = seeded_rng(seed, "bundle", bid).permutation(len(items))
        rows.extend(
            {"bundle_id": bid, "position": pos + 1, "task_id": items[i][0], "is_gold": items[i][1]}
            for pos, i in enumerate(perm)
        )
    return pd.DataFrame(rows)
