import math

import pytest
import torch
from torch.nn import functional as F

from dfedrw.peer.learning.data import Dataset
from dfedrw.peer.learning.models import build_model, get_vector, set_vector
from dfedrw.peer.learning.training import BatchOrder, LocalTrainer, evaluate
from dfedrw.peer.learning.model_matrix import VectorEvaluator


def data(n=50, d=6, k=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return Dataset(torch.rand(n, d, generator=g), torch.randint(0, k, (n,), generator=g), k)


def test_batched_evaluation_matches_one_model_at_a_time():
    ds = data()
    for name in ("softmax_regression", "mlp"):
        model = build_model(name, 6, 3, hidden=5, seed=1)
        base = get_vector(model)
        vectors = torch.stack([base, base * 0.5, base + 1.0, torch.full_like(base, float("nan"))])
        got = VectorEvaluator(model, ds)(vectors)
        for i in range(3):
            probe = build_model(name, 6, 3, hidden=5, seed=1)
            set_vector(probe, vectors[i])
            want = evaluate(probe, ds)
            assert abs(got["accuracy"][i].item() - want["accuracy"]) < 1e-9
            assert abs(got["loss"][i].item() - want["loss"]) < 1e-5
        assert torch.isnan(got["accuracy"][3]) and torch.isnan(got["loss"][3])
        assert torch.equal(get_vector(model), base), "the client's own model must not change"


def test_sgd_step_reduces_loss_and_is_seeded():
    ds = data(n=64)
    runs = []
    for _ in range(2):
        model = build_model("softmax_regression", 6, 3, seed=0)
        trainer = LocalTrainer(model, ds, lr=0.5, batch_size=64, local_steps=1, seed=7)
        losses = [trainer.step() for _ in range(30)]
        runs.append(losses)
        assert losses[-1] < losses[0]
    assert runs[0] == runs[1]


def test_model_init_is_seeded_and_leaves_global_rng_alone():
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a = get_vector(build_model("mlp", 4, 2, hidden=3, seed=9))
    after = torch.rand(1)
    assert torch.equal(before, after)
    assert torch.equal(a, get_vector(build_model("mlp", 4, 2, hidden=3, seed=9)))


def _autograd_grads(flat, models, x, y, weight):
    from torch.nn import functional as F

    models = models.detach().clone().requires_grad_()
    per = F.cross_entropy(flat.class_first_logits(models, x), y, reduction="none")
    losses = per.mean(1) if weight is None else (per * weight).sum(1)
    (grads,) = torch.autograd.grad(losses.sum(), models)
    return losses.detach(), grads


def test_softmax_regression_grads_are_autograds_bit_for_bit():
    # Prepare: 7 softmax-regression models (with and without a bias), each its own minibatch of
    # 30 rows (not a power of two, so 1/30 is rounded), and the same with padded rows weighted 0
    from torch import nn

    from dfedrw.peer.learning.model_matrix import FlatModel, softmax_regression_grads

    g = torch.Generator().manual_seed(3)
    x = torch.rand(7, 30, 20, generator=g)
    y = torch.randint(0, 4, (7, 30), generator=g)
    padded = torch.zeros(7, 30)
    padded[:, :17] = 1.0 / 17
    for bias in (True, False):
        flat = FlatModel(nn.Sequential(nn.Linear(20, 4, bias=bias)), torch.device("cpu"))
        models = torch.randn(7, 20 * 4 + (4 if bias else 0), generator=g)
        for weight in (None, padded):
            # Execute
            losses, grads = softmax_regression_grads(flat, models, x, y, weight)

            # Assert: the very numbers autograd gives
            want_losses, want_grads = _autograd_grads(flat, models, x, y, weight)
            assert torch.equal(losses, want_losses)
            assert torch.equal(grads, want_grads)


def test_softmax_regression_grads_leave_other_models_to_autograd():
    # Prepare: a two-layer model
    from dfedrw.peer.learning.model_matrix import FlatModel, softmax_regression_grads

    flat = FlatModel(build_model("mlp", 6, 3, hidden=5, seed=1), torch.device("cpu"))
    models = torch.stack([get_vector(build_model("mlp", 6, 3, hidden=5, seed=s)) for s in range(3)])

    # Execute / Assert
    assert softmax_regression_grads(flat, models, torch.rand(3, 4, 6), torch.zeros(3, 4, dtype=torch.long), None) is None


# -- momentum, weight decay, local epochs, learning-rate schedules ---------------------------------


def test_the_learning_rate_schedules_by_hand():
    from dfedrw.peer.learning.training import learning_rate

    assert learning_rate(0.1, "constant", 57, 100) == 0.1
    assert [learning_rate(0.1, "step", r, 100, gamma=0.5, step=3) for r in (0, 2, 3, 5, 6, 9)] == [0.1, 0.1, 0.05, 0.05, 0.025, 0.0125]
    assert learning_rate(0.2, "cosine", 0, 10) == 0.2
    assert learning_rate(0.2, "cosine", 5, 10) == pytest.approx(0.1)
    assert learning_rate(0.2, "cosine", 9, 10) == pytest.approx(0.2 * (1 + math.cos(math.pi * 0.9)) / 2)
    with pytest.raises(ValueError, match="schedule 'linear' is not valid; choose one of: constant, step, cosine"):
        learning_rate(0.1, "linear", 0, 10)


def test_local_step_count_by_hand():
    from dfedrw.peer.learning.training import local_step_count

    assert local_step_count(3, 0.0, 100, 32) == 3
    assert local_step_count(3, 1.0, 100, 32) == 4  # ceil(100 / 32)
    assert local_step_count(3, 1.0, 96, 32) == 3
    assert local_step_count(3, 0.5, 100, 32) == 2
    assert local_step_count(3, 2.0, 10, 32) == 2  # the batch capped at the shard: one step an epoch
    assert local_step_count(3, 0.01, 100, 32) == 1


@pytest.mark.parametrize(("momentum", "weight_decay"), [(0.0, 0.01), (0.9, 0.0), (0.9, 5e-4)])
def test_sgd_update_is_torch_optim_sgd_bit_for_bit(momentum, weight_decay):
    from dfedrw.peer.learning.training import sgd_update

    torch.manual_seed(3)
    ours, theirs = torch.randn(50), None
    theirs = ours.clone().requires_grad_()
    optimizer = torch.optim.SGD([theirs], lr=0.07, momentum=momentum, weight_decay=weight_decay)
    buffer = None
    for _ in range(5):
        grad = torch.randn(50)
        theirs.grad = grad.clone()
        optimizer.step()
        buffer = sgd_update(ours, grad, buffer, lr=0.07, momentum=momentum, weight_decay=weight_decay)
        assert torch.equal(ours, theirs.detach())
    assert (buffer is None) == (momentum == 0)


def test_the_local_trainer_takes_the_optimizers_steps_and_the_rounds_learning_rate():
    data = Dataset(x=torch.randn(40, 6), y=torch.randint(0, 3, (40,)), num_classes=3)
    model = build_model("mlp", 6, 3, hidden=4, seed=2)
    reference = build_model("mlp", 6, 3, hidden=4, seed=2)
    trainer = LocalTrainer(model, data, lr=0.1, batch_size=8, local_steps=1, seed=4, momentum=0.8, weight_decay=0.01, local_epochs=0.5)
    assert trainer.local_steps == 3  # ceil(0.5 * 40 / 8)
    order = BatchOrder(40, 8, 4)
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.8, weight_decay=0.01)
    for lr in (0.1, 0.05):
        trainer.step(lr)
        for group in optimizer.param_groups:
            group["lr"] = lr
        for _ in range(3):
            idx = order.next()
            optimizer.zero_grad()
            F.cross_entropy(reference(data.x[idx]), data.y[idx]).backward()
            optimizer.step()
    assert torch.equal(get_vector(model), get_vector(reference))


def test_training_settings_are_checked():
    from dfedrw.peer.config.scenario import ScenarioError, load_scenario

    for override, message in [
        ("train.momentum=1.0", r"train.momentum=1.0 must be a finite number in \[0, 1\)"),
        ("train.lr_schedule=linear", "train.lr_schedule"),
        ("train.local_epochs=-1.0", "train.local_epochs"),
        ("train.lr_step=0", "train.lr_step"),
        ("train.lr_gamma=0.0", "train.lr_gamma"),
    ]:
        with pytest.raises(ScenarioError, match=message):
            load_scenario(None, [override])
    scenario = load_scenario(None, ["train.lr_schedule=step", "train.lr_step=2", "train.lr_gamma=0.5", "train.lr=0.4", "rounds=10"])
    assert [scenario.train.lr_at(r, scenario.rounds) for r in range(5)] == [0.4, 0.4, 0.2, 0.2, 0.1]
