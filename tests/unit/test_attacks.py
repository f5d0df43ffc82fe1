"""Unit tests for the Byzantine attacks (peer.attacks)."""

from __future__ import annotations

import warnings
from statistics import NormalDist

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dfedrw.peer.attacks import ALIE, ATTACK_REGISTRY, IPM, Gaussian, SignFlip, make_attack
from dfedrw.peer.attacks.classic import alie_z_max

NAN = float("nan")
ALL_ATTACKS = [Gaussian(), Gaussian(std=1.0, center="zero"), SignFlip(), ALIE(), ALIE(z=1.5)]
ATTACK_IDS = [repr(a) for a in ALL_ATTACKS]


def seeded(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


RECEIVED = torch.tensor([[1.0, 2.0], [3.0, -4.0]])  # mean (2, -1); population std (1, 3)


# ---------------------------------------------------------------- shapes and determinism


@pytest.mark.parametrize("attack", ALL_ATTACKS, ids=ATTACK_IDS)
def test_message_is_float32_vector_of_model_size(attack):
    # Prepare
    received = torch.randn(3, 17, generator=seeded(1))

    # Execute
    message = attack(received, 4, seeded())

    # Assert
    assert message.dtype == torch.float32 and message.shape == (17,)
    assert bool(torch.isfinite(message).all())


@pytest.mark.parametrize("attack", ALL_ATTACKS, ids=ATTACK_IDS)
def test_same_seed_gives_same_message(attack):
    # Prepare
    received = torch.randn(3, 50, generator=seeded(2))

    # Execute
    first = attack(received, 1, seeded(9))
    second = attack(received, 1, seeded(9))

    # Assert
    assert torch.equal(first, second)


# ---------------------------------------------------------------- Gaussian


def test_gaussian_is_received_mean_plus_scaled_normal_draw():
    # Prepare: the same generator state the attack will use
    expected_noise = torch.randn(2, generator=seeded(3), dtype=torch.float32)

    # Execute
    message = Gaussian()(RECEIVED, 0, seeded(3))

    # Assert: mean (2, -1) + 30 z
    expected = (torch.tensor([2.0, -1.0], dtype=torch.float64)
                + 30.0 * expected_noise.double()).float()
    assert torch.equal(message, expected)


def test_gaussian_fresh_noise_per_receiver():
    # Prepare: one generator shared across the receivers of one round
    generator = seeded(4)

    # Execute
    first = Gaussian()(RECEIVED, 1, generator)
    second = Gaussian()(RECEIVED, 2, generator)

    # Assert
    assert not torch.equal(first, second)


@pytest.mark.parametrize("center", ["zero", "received_mean"])
def test_gaussian_empirical_std_is_30(center):
    # Prepare: received models with mean 5 everywhere; std error of the std ~ 30/sqrt(2e5)
    dim = 100_000
    received = torch.full((2, dim), 5.0)
    offset = 0.0 if center == "zero" else 5.0

    # Execute
    message = Gaussian(center=center)(received, 0, seeded(5))

    # Assert
    assert (message - offset).std().item() == pytest.approx(30.0, abs=0.5)
    assert message.mean().item() == pytest.approx(offset, abs=0.5)


def test_gaussian_with_nothing_received_uses_zero_center():
    # Prepare
    expected = (30.0 * torch.randn(4, generator=seeded(6)).double()).float()

    # Execute
    message = Gaussian()(torch.empty(0, 4), 0, seeded(6))

    # Assert
    assert torch.equal(message, expected)


# ---------------------------------------------------------------- SignFlip


def test_sign_flip_exact_values():
    # Execute: -10 * (2, -1)
    message = SignFlip()(RECEIVED, 0, seeded())

    # Assert
    assert message.tolist() == [-20.0, 10.0]


def test_sign_flip_custom_scale():
    # Execute: -2 * (2, -1)
    message = SignFlip(scale=-2)(RECEIVED, 0, seeded())

    # Assert
    assert message.tolist() == [-4.0, 2.0]


# ---------------------------------------------------------------- ALIE


def test_alie_exact_values():
    # Execute: mean (2, -1) - 1.5 * std (1, 3) = (0.5, -5.5)
    message = ALIE(z=1.5)(RECEIVED, 0, seeded())

    # Assert
    assert message.tolist() == [0.5, -5.5]


def test_alie_z_for_paper_setting():
    # Prepare: n = 12, f = 2 -> s = floor(12/2 + 1) - 2 = 5 -> z = Phi^-1((12 - 5)/12)
    expected = NormalDist().inv_cdf(7 / 12)

    # Execute
    z = alie_z_max(12, 2)

    # Assert
    assert z == pytest.approx(expected, abs=1e-15)
    assert z == pytest.approx(0.2104284, abs=1e-6)
    assert ALIE().z_used == z


def test_alie_default_message_uses_z_max():
    # Execute
    message = ALIE()(RECEIVED, 0, seeded())

    # Assert: (2 - z, -1 - 3z)
    z = NormalDist().inv_cdf(7 / 12)
    assert message.tolist() == pytest.approx([2 - z, -1 - 3 * z], abs=1e-6)


def test_alie_single_received_model_is_sent_back():
    # Prepare: one model -> std 0
    received = torch.tensor([[0.25, -3.0, 7.0]])

    # Execute
    message = ALIE(z=2.0)(received, 0, seeded())

    # Assert
    assert message.tolist() == [0.25, -3.0, 7.0]


@pytest.mark.parametrize(
    ("num_clients", "num_byzantine", "message"),
    [
        (12, 7, r"s = .* = 0"),  # s = 7 - 7
        (12, 0, "num_byzantine must be >= 1"),
        (12, 12, "num_byzantine must be < num_clients"),
        (1, 1, "num_clients must be >= 2"),
        (12.0, 2, "num_clients must be an integer"),
    ],
)
def test_alie_rejects_invalid_population(num_clients, num_byzantine, message):
    with pytest.raises(ValueError, match=message):
        ALIE(num_clients=num_clients, num_byzantine=num_byzantine)


def test_alie_rejects_non_finite_z():
    with pytest.raises(ValueError, match="z must be finite"):
        ALIE(z=NAN)


# ---------------------------------------------------------------- silence and validation


@pytest.mark.parametrize("attack", [SignFlip(), ALIE(), ALIE(z=1.0)], ids=repr)
def test_attacks_needing_models_stay_silent_when_nothing_received(attack):
    # Execute
    message = attack(torch.empty(0, 5), 0, seeded())

    # Assert
    assert message is None


@pytest.mark.parametrize("attack", ALL_ATTACKS, ids=ATTACK_IDS)
def test_attacks_validate_their_call(attack):
    with pytest.raises(ValueError, match="2-D"):
        attack(torch.zeros(5), 0, seeded())
    with pytest.raises(ValueError, match="generator"):
        attack(RECEIVED, 0, 123)


@pytest.mark.parametrize(
    ("factory", "kwargs", "message"),
    [
        (Gaussian, {"std": 0.0}, "std must be > 0"),
        (Gaussian, {"center": "median"}, r"center must be one of \['received_mean', 'zero'\]"),
        (SignFlip, {"scale": float("inf")}, "scale must be finite"),
    ],
)
def test_attack_parameter_validation(factory, kwargs, message):
    with pytest.raises(ValueError, match=message):
        factory(**kwargs)


def test_make_attack_registry_and_errors():
    # Execute
    built = {name: make_attack(name) for name in ATTACK_REGISTRY}

    # Assert
    assert {k: built[k] for k in ("gaussian", "sign_flip", "alie")} == {"gaussian": Gaussian(), "sign_flip": SignFlip(), "alie": ALIE()}
    assert make_attack("alie", z=1.0).z_used == 1.0
    with pytest.raises(ValueError, match=r"unknown attack 'lie'.*'alie',.*'gaussian'.*'sign_flip'"):
        make_attack("lie")
    with pytest.raises(ValueError, match=r"no setting 'sigma'; settings: std, center"):
        make_attack("gaussian", sigma=1.0)
    with pytest.raises(ValueError, match=r"attack 'alie' has no setting 'z_used'; settings: z"):
        make_attack("alie", z_used=1.0)


# ---------------------------------------------------------------- property tests


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), count=st.integers(1, 6), dim=st.integers(1, 20),
       z=st.floats(0.0, 3.0))
def test_alie_stays_within_z_std_of_the_mean(seed, count, dim, z):
    # Prepare
    received = torch.randn(count, dim, generator=seeded(seed))
    mean = received.double().mean(dim=0)
    std = received.double().std(dim=0, correction=0)

    # Execute
    message = ALIE(z=z)(received, 0, seeded())

    # Assert: |message - mean| = z * std per coordinate
    torch.testing.assert_close((mean - message.double()).abs(), z * std, atol=1e-5, rtol=1e-5)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), count=st.integers(1, 6), dim=st.integers(1, 20))
def test_sign_flip_is_anti_aligned_with_received_mean(seed, count, dim):
    # Prepare
    received = torch.randn(count, dim, generator=seeded(seed))

    # Execute
    message = SignFlip()(received, 0, seeded())

    # Assert
    torch.testing.assert_close(message, -10.0 * received.mean(dim=0), atol=1e-5, rtol=1e-5)


def test_ipm_hand_computed():
    # Prepare: mean of (1, 2) and (3, 4) is (2, 3); epsilon 0.5 -> -(1, 1.5)
    received = torch.tensor([[1.0, 2.0], [3.0, 4.0]])

    # Execute
    message = IPM(epsilon=0.5)(received, 0, torch.Generator().manual_seed(0))

    # Assert
    assert message.dtype == torch.float32 and message.tolist() == [-1.0, -1.5]
    assert IPM()(received, 0, torch.Generator()).tolist() == pytest.approx([-0.2, -0.3])
    assert IPM()(torch.zeros(0, 2), 0, torch.Generator()) is None
    assert make_attack("ipm", epsilon=2) == IPM(2.0)


@pytest.mark.parametrize("epsilon", [0, -0.1, float("nan"), float("inf"), True, "0.1"])
def test_ipm_refuses_bad_epsilon(epsilon):
    with pytest.raises(ValueError, match="IPM: epsilon"):
        IPM(epsilon=epsilon)


# ---------------------------------------------------------------- one call per round or per receiver


class _Counting:
    """A per-receiver attack that counts its calls; the class's threat model is set per test."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def __call__(self, received, receiver, generator):
        self.calls.append(receiver)
        return received.mean(dim=0) + float(receiver)


@pytest.mark.parametrize(
    ("declared", "expected_calls"),
    [("untailored", [4]), ("tailored", [4, 6, 9]), ("undeclared", [4, 6, 9])],
)
def test_an_untailored_attack_is_called_once_a_round_and_every_receiver_gets_its_message(declared, expected_calls):
    # Prepare
    from dfedrw.peer.attacks import AttackView, craft_round
    from dfedrw.peer.attacks.base import ThreatModel

    cls = type(f"Counting_{declared}", (_Counting,), {})
    if declared != "undeclared":
        cls.threat_model = ThreatModel(tailored=declared == "tailored")
    attack = cls()
    view = AttackView(round=0, attacker=11, receivers=(4, 6, 9), senders=(0, 1), received=RECEIVED)

    # Execute
    crafted = craft_round(attack, view, seeded())

    # Assert
    assert attack.calls == expected_calls
    sent = {k: crafted.messages[k].tolist() for k in (4, 6, 9)}
    if declared == "untailored":
        assert sent == {k: [6.0, 3.0] for k in (4, 6, 9)}
    else:
        assert sent == {k: [2.0 + k, -1.0 + k] for k in (4, 6, 9)}


def test_the_classic_attacks_declare_whether_they_tailor():
    # Gaussian draws fresh noise per receiver; sign flip, ALIE and IPM send one message.
    from dfedrw.peer.attacks.base import threat_model_of

    assert threat_model_of(Gaussian).tailored
    assert not any(threat_model_of(cls).tailored for cls in (SignFlip, ALIE, IPM))


@pytest.mark.parametrize("center", ["received_mean", "zero"])
@pytest.mark.parametrize("count", [0, 1, 5])
def test_gaussian_for_all_receivers_at_once_is_one_call_per_receiver_bit_for_bit(center, count):
    # Prepare: craft_round calls for_receivers; the same draws one call per receiver makes
    from dfedrw.peer.attacks import AttackView, craft_round

    received = torch.randn(count, 301, generator=torch.Generator().manual_seed(3)) * 0.1
    attack = Gaussian(center=center)
    view = AttackView(round=0, attacker=11, receivers=(2, 4, 9), senders=tuple(range(count)), received=received)
    one_by_one = seeded()

    # Execute
    crafted = craft_round(attack, view, seeded())

    # Assert
    for k in view.receivers:
        assert torch.equal(crafted.messages[k], attack(received, k, one_by_one))
        assert crafted.messages[k].shape == (301,) and crafted.messages[k].dtype == torch.float32


@pytest.mark.parametrize("center", ["received_mean", "zero"])
def test_gaussian_messages_are_the_centre_plus_std_times_each_receivers_draw_in_float64(center):
    # Prepare: the formula written out, from the draws the attack's generator gives in turn
    received = torch.randn(6, 257, generator=torch.Generator().manual_seed(5))
    attack = Gaussian(std=30.0, center=center)
    draws = seeded()
    centre = received.to(torch.float64).mean(dim=0) if center == "received_mean" else torch.zeros(257, dtype=torch.float64)
    expected = [(centre + 30.0 * torch.randn(257, generator=draws, dtype=torch.float32).to(torch.float64)).to(torch.float32) for _ in range(3)]

    # Execute
    messages = attack.for_receivers(received, (1, 4, 8), seeded())

    # Assert
    assert len(messages) == 3
    for message, want in zip(messages, expected, strict=True):
        assert torch.equal(message, want)


@settings(max_examples=100, deadline=None)
@given(
    losses=st.lists(st.one_of(st.floats(0.0, 1e6), st.sampled_from([float("nan"), float("inf")])), max_size=12),
    sizes=st.lists(st.integers(1, 10**6), max_size=12),
)
def test_a_byzantine_client_declares_its_neighbours_mean_size_and_fsum_mean_finite_loss(losses, sizes):
    # Prepare
    import math

    from dfedrw.peer.round.byzantine import byzantine_claims

    finite = [x for x in losses if math.isfinite(x)]

    # Execute
    size, loss = byzantine_claims(sizes, losses)
    size_reversed, loss_reversed = byzantine_claims(sizes[::-1], losses[::-1])

    # Assert: the mean size (1 with nothing heard), the correctly rounded mean of the finite
    # losses (NaN with none), whatever the order the neighbours are listed in
    assert size == (round(sum(sizes) / len(sizes)) if sizes else 1) == size_reversed
    if finite:
        assert loss == math.fsum(finite) / len(finite) == loss_reversed
    else:
        assert math.isnan(loss) and math.isnan(loss_reversed)


@pytest.mark.parametrize("correction", [0, 1])
@pytest.mark.parametrize("rows", [1, 2, 3, 7, 12])
def test_column_std_is_torchs_std_bit_for_bit(rows, correction):
    # Prepare: spreads from tiny to large, a row of NaN/Inf in one column
    from dfedrw.peer.attacks.moments import column_std

    generator = torch.Generator().manual_seed(rows * 10 + correction)
    models = torch.randn(rows, 2000, generator=generator, dtype=torch.float64) * torch.logspace(-6, 3, 2000, dtype=torch.float64)
    models[:, 7] = float("inf")
    models[0, 9] = float("nan")

    # Execute
    fast = column_std(models, correction=correction)

    # Assert: the same bits, NaN where torch gives NaN
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns when rows <= correction
        expected = models.std(dim=0, correction=correction)
    assert torch.equal(fast.isnan(), expected.isnan())
    assert torch.equal(fast.nan_to_num(), expected.nan_to_num())
