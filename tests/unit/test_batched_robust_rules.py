"""The batched paths of the baseline robust rules (Median, TrimmedMean, Krum, MultiKrum, Flame,
BALANCE, NormBound): each must give every client exactly what the rule's own call gives it, bit
for bit (the model's bits, the weights and their order), whatever the candidates: counts that
differ between clients, non-finite rows (the own one too), exact copies, ties, -0.0 next to +0.0,
trims reduced for too few candidates, float32 or float64 models. Also the parts they rest on:
the sorting network, and the HDBSCAN labels Flame computes without the estimator."""

from __future__ import annotations

import dataclasses

import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from dfedrw.peer.aggregation import Aggregate, Balance, Flame, Krum, Median, MultiKrum, NormBound, RoundBatch, TrimmedMean
from dfedrw.peer.aggregation.coordinate import signed_zero_columns, sorted_columns, sorting_network
from dfedrw.peer.aggregation.flame import hdbscan_labels
from tests.support.rules import median_of, trimmed_mean_of

NAN, INF = float("nan"), float("inf")

RULES = [
    Median(),
    TrimmedMean(0),
    TrimmedMean(1),
    TrimmedMean(2),
    TrimmedMean(6),  # more than half of any pool here: reduced to the median
    Krum(0),
    Krum(2),
    MultiKrum(0),
    MultiKrum(1),
    MultiKrum(3),
    MultiKrum(1, m=2),
    MultiKrum(2, m=20),
    Flame(),
    Flame(seed=5, cluster_on="models"),
    Flame(noise=0.0, min_cluster_size=2),
    Balance(),
    Balance(gamma=0.5, kappa=2.0, alpha=0.3),
    NormBound(),
    NormBound(bound=0.5, noise=0.01, weighting="uniform", seed=2),
]


def same_bits(left: torch.Tensor, right: torch.Tensor) -> bool:
    """Equal to the bit (NaN payloads and the sign of zero included)."""
    if left.dtype != right.dtype or left.shape != right.shape:
        return False
    as_int = {torch.float32: torch.int32, torch.float64: torch.int64}[left.dtype]
    return torch.equal(left.view(as_int), right.view(as_int))


def assert_same(together: Aggregate, alone: Aggregate, c: int) -> None:
    assert same_bits(together.model, alone.model), c
    assert list(together.weights.items()) == list(alone.weights.items()), c
    assert together.scores == alone.scores, c


def column_values(data, count: int, dim: int, generator: torch.Generator) -> torch.Tensor:
    """``count`` rows of ``dim`` values of a drawn kind: spread, few distinct values (ties),
    signed zeros, or a mix."""
    kind = data.draw(st.sampled_from(["normal", "ties", "zeros", "mixed"]), label="values")
    normal = torch.randn(count, dim, generator=generator, dtype=torch.float64)
    ties = torch.randint(-2, 3, (count, dim), generator=generator).to(torch.float64)
    zeros = torch.tensor([0.0, -0.0], dtype=torch.float64)[torch.randint(0, 2, (count, dim), generator=generator)]
    if kind == "normal":
        return normal
    if kind == "ties":
        return ties
    if kind == "zeros":
        return torch.where(torch.rand(count, dim, generator=generator) < 0.8, zeros, ties)
    pick = torch.randint(0, 3, (count, dim), generator=generator)
    return torch.where(pick == 0, normal, torch.where(pick == 1, ties, zeros))


def random_batch(data, *, references: bool | None = None) -> RoundBatch:
    """A pool of models (each client's own row first among its candidates, the others drawn),
    ids that are not the pool order, non-finite rows and exact copies possible."""
    clients = data.draw(st.integers(1, 6), label="clients")
    pool = clients + data.draw(st.integers(0, 8), label="extra rows")
    dim = data.draw(st.integers(1, 24), label="dim")
    generator = torch.Generator().manual_seed(data.draw(st.integers(0, 2**31 - 1), label="seed"))
    vectors = column_values(data, pool, dim, generator)
    for _ in range(data.draw(st.integers(0, 2), label="broken rows")):
        vectors[data.draw(st.integers(0, pool - 1), label="which broken"), 0] = data.draw(st.sampled_from([NAN, INF, -INF]))
    for _ in range(data.draw(st.integers(0, 3), label="copies")):
        vectors[data.draw(st.integers(0, pool - 1))] = vectors[data.draw(st.integers(0, pool - 1))]
    dtype = data.draw(st.sampled_from([torch.float32, torch.float64]), label="dtype")
    vectors = vectors.to(dtype)
    id_of = data.draw(st.permutations(range(200, 200 + pool)), label="ids")
    rows, ids = [], []
    for c in range(clients):
        others = data.draw(
            st.lists(st.sampled_from([r for r in range(pool) if r != c]), unique=True, max_size=pool - 1) if pool > 1 else st.just([]),
            label=f"rows of {c}",
        )
        rows.append((c, *others))
        ids.append(tuple(id_of[r] for r in rows[-1]))
    with_references = data.draw(st.booleans(), label="references") if references is None else references
    return RoundBatch(
        round=data.draw(st.integers(0, 9), label="round"), vectors=vectors, rows=tuple(rows), ids=tuple(ids),
        num_samples=tuple((10,) * len(r) for r in rows),
        references=(vectors[:clients] + 0.25).to(torch.float32) if with_references else None,
        total_rounds=data.draw(st.sampled_from([0, 10])), finite_pool=torch.isfinite(vectors).all(dim=1) if data.draw(st.booleans()) else None,
    )


@settings(max_examples=150, deadline=None)
@given(data=st.data(), rule=st.sampled_from(RULES))
def test_batched_gives_each_client_exactly_what_its_own_call_gives(data, rule):
    # Prepare
    batch = random_batch(data)

    # Execute
    together = rule.batched(batch)

    # Assert
    assert len(together) == len(batch)
    for c, aggregate in enumerate(together):
        assert_same(aggregate, rule(batch.one(c)), c)


@settings(max_examples=150, deadline=None)
@given(data=st.data(), trim=st.sampled_from([None, 0, 1, 2, 6]))
def test_the_coordinate_rules_give_each_client_what_a_plain_sort_of_its_candidates_gives(data, trim):
    # Prepare: the median (trim None) or a trimmed mean, and its plain one-client oracle
    batch = random_batch(data)
    rule = Median() if trim is None else TrimmedMean(trim)

    # Execute
    together = rule.batched(batch)

    # Assert: bit for bit, the sorting networks and the grouping of clients as a plain sort
    for c, aggregate in enumerate(together):
        alone = median_of(batch.one(c)) if trim is None else trimmed_mean_of(batch.one(c), trim)
        assert_same(aggregate, alone, c)


# Rules of one batch group that differ in what the group leaves out: drawn per client.
FAMILIES = {
    "flame-updates": lambda n: Flame(seed=n),
    "flame-models": lambda n: Flame(seed=n, cluster_on="models"),
    "norm-bound": lambda n: NormBound(bound=0.5, noise=0.01, seed=n),
    "krum": lambda n: Krum(n),
    "multi-krum": lambda n: MultiKrum(n),
    "multi-krum-m": lambda n: MultiKrum(n, m=2),
    "trimmed-mean": lambda n: TrimmedMean(n),
}


@settings(max_examples=60, deadline=None)
@given(data=st.data(), family=st.sampled_from(sorted(FAMILIES)))
def test_one_batched_call_takes_clients_of_one_group_each_with_its_own_rule(data, family):
    """Flames that differ only in their seed, Krums and trimmed means only in the Byzantine count
    they are told, share one batched call (``batch.rules``): each client gets what its own rule's call
    gives (its own noise, its own count)."""
    # Prepare
    batch = random_batch(data)
    rules = tuple(FAMILIES[family](data.draw(st.integers(0, 3), label=f"setting of {c}")) for c in range(len(batch)))
    assert len({rule.batch_group() for rule in rules}) == 1

    # Execute
    together = FAMILIES[family](5).batched(dataclasses.replace(batch, rules=rules))

    # Assert
    for c, aggregate in enumerate(together):
        assert_same(aggregate, rules[c](batch.one(c)), c)


@pytest.mark.parametrize("rule", [Median(), TrimmedMean(1), TrimmedMean(3)], ids=repr)
@pytest.mark.parametrize("count", [2, 3, 4, 5, 6, 7, 8])
def test_coordinate_rules_keep_the_sign_of_zero_their_own_call_gives(rule, count):
    # Prepare: every arrangement of -0.0 and +0.0 over `count` candidates, one per coordinate,
    # beside columns of ties and of spread values: where a sort other than the per-client one
    # puts the two zeros the other way round, only re-sorting those columns keeps the bits.
    patterns = torch.tensor(list(itertools.product([0.0, -0.0], repeat=count)), dtype=torch.float32).T
    generator = torch.Generator().manual_seed(count)
    spread = torch.randn(count, 16, generator=generator)
    ties = torch.randint(-1, 2, (count, 16), generator=generator).to(torch.float32)
    vectors = torch.cat([patterns, spread, ties], dim=1)
    rows = (tuple(range(count)), tuple(reversed(range(count))))
    batch = RoundBatch(
        round=0, vectors=vectors, rows=rows, ids=tuple(tuple(10 + r for r in rs) for rs in rows),
        num_samples=tuple((1,) * count for _ in rows),
    )

    # Execute
    together = rule.batched(batch)

    # Assert
    for c, aggregate in enumerate(together):
        assert_same(aggregate, rule(batch.one(c)), c)


def test_trimmed_mean_reduced_trim_and_a_client_with_nothing_finite():
    # Prepare: client 0 has 3 finite candidates of 5 (b = 2 is reduced to 1: the median),
    # client 1 only its own row, which is NaN (it keeps it), client 2 all five.
    vectors = torch.tensor([[1.0, -0.0], [NAN, 0.0], [3.0, 0.0], [INF, 1.0], [-2.0, -0.0]])
    rows = ((0, 1, 2, 3, 4), (1,), (2, 0, 1, 3, 4))
    batch = RoundBatch(round=0, vectors=vectors, rows=rows, ids=((1, 2, 3, 4, 5), (2,), (3, 1, 2, 4, 5)), num_samples=((1,) * 5, (1,), (1,) * 5))
    rule = TrimmedMean(2)

    # Execute
    first, second, third = rule.batched(batch)

    # Assert: client 0's median of (1, 3, -2) is 1; client 1 keeps its NaN row
    assert_same(first, rule(batch.one(0)), 0)
    assert first.model[0].item() == 1.0 and first.weights[2] == first.weights[4] == 0.0
    assert_same(second, rule(batch.one(1)), 1)
    assert math.isnan(second.model[0].item()) and second.weights == {2: 1.0}
    assert_same(third, rule(batch.one(2)), 2)


@pytest.mark.parametrize("rule", RULES, ids=repr)
def test_batched_takes_models_of_no_coordinates(rule):
    # Prepare: three clients, models of length 0 (nothing to sort, measure or count)
    rows = ((0, 1, 2), (1, 2), (2,))
    batch = RoundBatch(
        round=0, vectors=torch.zeros(3, 0), rows=rows, ids=tuple(tuple(5 + r for r in rs) for rs in rows),
        num_samples=tuple((1,) * len(rs) for rs in rows), references=torch.zeros(3, 0),
    )

    # Execute
    together = rule.batched(batch)

    # Assert
    for c, aggregate in enumerate(together):
        assert_same(aggregate, rule(batch.one(c)), c)


def test_batched_krum_with_threads_and_a_large_model_gives_what_its_own_call_gives():
    # Prepare: a model of 40000 coordinates (more than torch sums in one pass per thread)
    generator = torch.Generator().manual_seed(3)
    vectors = torch.randn(5, 40000, generator=generator)
    rows = ((0, 1, 2, 3), (1, 0, 4), (2, 3, 4, 0, 1))
    batch = RoundBatch(round=0, vectors=vectors, rows=rows, ids=rows, num_samples=tuple((1,) * len(r) for r in rows))
    threads = torch.get_num_threads()
    for count in (1, 2):
        torch.set_num_threads(count)
        try:
            # Execute
            together = MultiKrum(1).batched(batch)

            # Assert
            for c, aggregate in enumerate(together):
                assert_same(aggregate, MultiKrum(1)(batch.one(c)), c)
        finally:
            torch.set_num_threads(threads)


@pytest.mark.parametrize("width", [7, 65_535, 65_536])
def test_coordinate_shares_count_every_kept_entry_of_each_member(width):
    # Prepare: 3 candidates of 2 members; member 1's first candidate kept everywhere (past a
    # uint16 count at width 65,536), the others at every other coordinate
    from dfedrw.peer.aggregation.coordinate import _shares

    kept = np.zeros((3, 2 * width), dtype=bool)
    kept[:, ::2] = True
    kept[0, width:] = True

    # Execute
    shares = _shares(kept, 2, width)

    # Assert: per member, the count of each candidate's kept coordinates, as floats (member 0
    # holds the even columns 0, 2, ...; member 1 starts at column ``width``)
    assert shares == [[float((width + 1) // 2)] * 3, [float(width)] + [float(width // 2)] * 2]
    assert all(type(v) is float for client in shares for v in client)


@pytest.mark.parametrize("count", range(1, 13))
def test_sorting_network_sorts_every_zero_one_input(count):
    # The 0-1 principle: a comparator network that sorts every 0/1 input sorts every input.
    network = sorting_network(count)
    for bits in itertools.product([0, 1], repeat=count):
        values = list(bits)
        for i, j in network:
            if values[i] > values[j]:
                values[i], values[j] = values[j], values[i]
        assert values == sorted(values), bits


@settings(max_examples=60, deadline=None)
@given(data=st.data(), count=st.integers(1, 40), columns=st.integers(1, 50))
def test_sorted_columns_give_numpys_sorted_values(data, count, columns):
    # Prepare: float32 values without -0.0 (where any two sorts agree to the bit)
    generator = np.random.default_rng(data.draw(st.integers(0, 2**31 - 1)))
    values = generator.integers(-3, 4, size=(count, columns)).astype(np.float32)
    values[:, ::2] = generator.standard_normal((count, len(range(0, columns, 2)))).astype(np.float32)
    wanted = sorted(set(data.draw(st.lists(st.integers(0, count - 1), min_size=1, max_size=count))))

    # Execute
    every = sorted_columns(values)
    some = sorted_columns(values, wanted)

    # Assert
    expected = np.sort(values, axis=0)
    assert np.array_equal(np.stack(every), expected)
    for r in wanted:
        assert np.array_equal(some[r], expected[r])
    assert signed_zero_columns(values).size == 0


def test_signed_zero_columns_finds_only_negative_zeros():
    values = np.array([[0.0, -0.0, 1.0, -1.0], [2.0, 0.0, -0.0, 0.0]], dtype=np.float32)
    assert signed_zero_columns(values).tolist() == [1, 2]
    assert signed_zero_columns(values.astype(np.float64)).tolist() == [1, 2]


@settings(max_examples=150, deadline=None)
@given(data=st.data(), count=st.integers(3, 13), dim=st.integers(1, 6))
def test_hdbscan_labels_are_the_estimators(data, count, dim):
    # Prepare: cosine distances as Flame computes them, from spread points, rounded points
    # (ties, zero rows) or many copies of one point
    from sklearn.cluster import HDBSCAN

    generator = np.random.default_rng(data.draw(st.integers(0, 2**31 - 1)))
    points = generator.standard_normal((count, dim))
    kind = data.draw(st.sampled_from(["spread", "rounded", "copies"]))
    if kind == "rounded":
        points = np.round(points)
    elif kind == "copies":
        points[generator.integers(0, count, size=count // 2 + 1)] = points[0]
    rows = torch.from_numpy(points)
    norms = torch.linalg.vector_norm(rows, dim=1, keepdim=True)
    unit = rows / torch.where(norms > 0, norms, torch.ones_like(norms))
    distances = (1.0 - unit @ unit.T).clamp(min=0.0, max=2.0)
    distances = (distances + distances.T) / 2
    distances.fill_diagonal_(0.0)
    distances = distances.numpy()
    if data.draw(st.booleans()):
        distances = np.round(distances, 1)
    size = data.draw(st.integers(2, count))

    # Execute: the matrix as an array, and as the lists of floats Flame hands it
    labels = hdbscan_labels(distances, size)
    from_lists = hdbscan_labels(distances.tolist(), size)

    # Assert
    expected = HDBSCAN(metric="precomputed", min_cluster_size=size, min_samples=1, allow_single_cluster=True, copy=True).fit(distances).labels_
    assert labels.tolist() == expected.tolist()
    assert from_lists.tolist() == expected.tolist()


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), count=st.integers(3, 15), blobs=st.integers(1, 4), metric=st.sampled_from(["cosine", "euclidean"]))
def test_small_hdbscan_steps_give_the_estimators_labels(seed, count, blobs, metric):
    # Prepare: points in a few blobs of random spread (several clusters, noise, one cluster),
    # their distances all different so that the Python steps run (not scikit-learn's)
    from sklearn.cluster import HDBSCAN

    from dfedrw.peer.aggregation.flame import _small_hdbscan_labels

    generator = np.random.default_rng(seed)
    centres = generator.standard_normal((blobs, 4)) * 3
    points = centres[generator.integers(0, blobs, count)] + generator.standard_normal((count, 4)) * generator.uniform(0.01, 1.0)
    if metric == "cosine":
        unit = points / np.linalg.norm(points, axis=1, keepdims=True)
        distances = np.clip(1.0 - unit @ unit.T, 0.0, 2.0)
    else:
        distances = np.sqrt(((points[:, None] - points[None]) ** 2).sum(-1))
    distances = (distances + distances.T) / 2
    np.fill_diagonal(distances, 0.0)
    upper = distances[np.triu_indices(count, 1)]
    assume(len(np.unique(upper)) == len(upper))
    size = int(generator.integers(2, count + 1))

    # Execute
    steps = _small_hdbscan_labels(distances.tolist(), size)
    labels = hdbscan_labels(distances, size)

    # Assert
    expected = HDBSCAN(metric="precomputed", min_cluster_size=size, min_samples=1, allow_single_cluster=True, copy=True).fit(distances).labels_
    assert steps == expected.tolist()
    assert labels.tolist() == expected.tolist()
