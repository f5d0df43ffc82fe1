"""The built-in models: their sizes, shapes, settings, and what a model may not hold."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dfedrw.peer.learning.models import MODEL_REGISTRY, build_model, make_model


def count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize(
    ("name", "shape", "classes", "parameters"),
    [
        ("lenet5", (1, 28, 28), 10, 61_706),
        ("femnist_cnn", (1, 28, 28), 62, 6_603_710),
        ("resnet20", (3, 32, 32), 10, 269_722),
        ("resnet18", (3, 32, 32), 10, 11_173_962),
    ],
)
def test_each_image_model_has_its_published_size_and_maps_flat_rows_to_logits(name, shape, classes, parameters):
    features = int(torch.Size(shape).numel())
    model = make_model(name, features, classes, input_shape=shape)
    logits = model(torch.rand(3, features))
    assert count(model) == parameters
    assert logits.shape == (3, classes)


def test_lenet5_takes_other_image_sizes_and_channels():
    model = make_model("lenet5", 3 * 32 * 32, 10, input_shape=(3, 32, 32))
    assert model(torch.rand(2, 3 * 32 * 32)).shape == (2, 10)
    assert model[-5].in_features == 16 * 6 * 6


@pytest.mark.parametrize("name", ["lenet5", "resnet20", "resnet18", "femnist_cnn"])
def test_an_image_model_on_a_set_without_an_image_shape_fails_in_one_line(name):
    with pytest.raises(ValueError, match=rf"{name} needs images \(channels, height, width\); the data set declares input_shape = \(64,\)"):
        make_model(name, 64, 10)


def test_too_small_images_are_refused():
    with pytest.raises(ValueError, match="lenet5 needs images at least 12x12; the data set's are 8x8"):
        make_model("lenet5", 64, 10, input_shape=(1, 8, 8))


def test_residual_networks_normalise_with_group_norm_and_keep_no_buffers():
    model = make_model("resnet20", 3072, 10, input_shape=(3, 32, 32))
    norms = [m for m in model.modules() if isinstance(m, nn.GroupNorm)]
    assert len(norms) == 19 and all(m.num_groups == 2 for m in norms)
    assert list(model.buffers()) == []
    plain = make_model("resnet20", 3072, 10, input_shape=(3, 32, 32), params={"norm": "none"})
    assert not any(isinstance(m, nn.GroupNorm) for m in plain.modules())
    assert count(model) - count(plain) == 2 * sum(m.num_channels for m in norms)


def test_group_norm_groups_divide_each_layers_channels():
    model = make_model("resnet20", 3072, 10, input_shape=(3, 32, 32), params={"groups": 32})
    assert sorted({m.num_groups for m in model.modules() if isinstance(m, nn.GroupNorm)}) == [16, 32]


@pytest.mark.parametrize(("params", "message"), [({"norm": "batch"}, "norm='batch' is not valid; choose one of: group, none"), ({"groups": 0}, "groups must be an integer >= 1")])
def test_bad_residual_settings_fail_with_their_name(params, message):
    with pytest.raises(ValueError, match=message):
        make_model("resnet18", 3072, 10, input_shape=(3, 32, 32), params=params)


def test_a_model_with_running_statistics_is_refused_with_the_layer_named(monkeypatch):
    def with_batch_norm(in_features: int, num_classes: int) -> nn.Module:
        return nn.Sequential(nn.Linear(in_features, 8), nn.BatchNorm1d(8), nn.Linear(8, num_classes))

    def stateless_batch_norm(in_features: int, num_classes: int) -> nn.Module:
        return nn.Sequential(nn.Linear(in_features, 8), nn.BatchNorm1d(8, track_running_stats=False), nn.Linear(8, num_classes))

    monkeypatch.setattr(MODEL_REGISTRY, "resolve", {"bn": with_batch_norm, "bn-free": stateless_batch_norm}.__getitem__)
    with pytest.raises(ValueError, match="BatchNorm1d '1' keeps running statistics, which are not model parameters"):
        make_model("bn", 4, 2)
    assert count(make_model("bn-free", 4, 2)) == 4 * 8 + 8 + 16 + 8 * 2 + 2


def test_the_seed_fixes_the_initialisation_and_leaves_the_global_generator_alone():
    before = torch.random.get_rng_state()
    a = build_model("resnet20", 3072, 10, input_shape=(3, 32, 32), seed=5)
    b = build_model("resnet20", 3072, 10, input_shape=(3, 32, 32), seed=5)
    c = build_model("resnet20", 3072, 10, input_shape=(3, 32, 32), seed=6)
    assert torch.equal(torch.random.get_rng_state(), before)
    va, vb, vc = (nn.utils.parameters_to_vector(m.parameters()) for m in (a, b, c))
    assert torch.equal(va, vb) and not torch.equal(va, vc)


def test_input_shape_is_supplied_not_set():
    assert "input_shape" in MODEL_REGISTRY.supplied("lenet5")
    with pytest.raises(ValueError, match="input_shape"):
        make_model("lenet5", 784, 10, input_shape=(1, 28, 28), params={"input_shape": (1, 28, 28)})


@pytest.mark.parametrize("shape", [(3, 2, 8, 8), (2, 3, 7, 9), (1, 1, 2, 2)])
def test_the_2x2_max_pool_gives_max_pool2d_s_values(shape):
    from dfedrw.peer.learning.models import MaxPool2x2

    x = torch.randn(*shape)
    x[0, 0, 0, 0] = float("nan")
    got, want = MaxPool2x2()(x), nn.functional.max_pool2d(x, 2)
    torch.testing.assert_close(got, want, equal_nan=True, rtol=0, atol=0)


def test_the_2x2_max_pool_passes_the_gradient_to_each_windows_unique_maximum():
    from dfedrw.peer.learning.models import MaxPool2x2

    x = torch.randn(2, 3, 6, 6, requires_grad=True)
    y = torch.randn(2, 3, 3, 3)
    (mine,) = torch.autograd.grad((MaxPool2x2()(x) * y).sum(), x)
    (theirs,) = torch.autograd.grad((nn.functional.max_pool2d(x, 2) * y).sum(), x)
    torch.testing.assert_close(mine, theirs, rtol=0, atol=0)
