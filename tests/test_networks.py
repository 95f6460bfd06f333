"""networks.py against independently known facts: parameter counts of the
torchvision models and the shape chain through each network."""

import math

import pytest

from mucudnn.networks import DEFAULT_BATCH, NETWORKS, layers, network, unique_problems


def _weights(name):
    return sum(math.prod(p.w_shape) for p in network(name, 1).values())


@pytest.mark.parametrize("name,expected", [
    # torchvision totals minus fc and batch-norm parameters (computed by hand
    # from the published counts: resnet18 11,689,512; resnet50 25,557,032;
    # vgg16 138,357,544 minus classifier and conv biases).
    ("resnet18", 11_689_512 - 513_000 - 2 * 4_800),
    ("resnet50", 25_557_032 - 2_049_000 - 2 * 26_560),
    ("vgg16", 138_357_544 - 123_642_856 - 4_224),
    # Caffe AlexNet without groups: 34848 + 614400 + 884736 + 1327104 + 884736
    ("alexnet", 3_745_824),
])
def test_conv_weight_counts(name, expected):
    assert _weights(name) == expected


@pytest.mark.parametrize("name", list(NETWORKS))
def test_layer_counts_and_batch(name):
    n_conv = {"alexnet": 5, "resnet18": 20, "resnet50": 53, "vgg16": 13}[name]
    probs = network(name, batch=7)
    assert len(probs) == n_conv
    assert all(p.batch == 7 for p in probs.values())
    assert network(name)[next(iter(probs))].batch == DEFAULT_BATCH[name]
    assert sum(len(v) for v in unique_problems(probs).values()) == n_conv


def test_resnet_shapes_chain():
    """Inside a block each conv consumes what the previous one produced."""
    for name in ("resnet18", "resnet50"):
        probs = network(name, 2)
        names = list(probs)
        for a, b in zip(names, names[1:]):
            if "downsample" in a or "downsample" in b or a.split(".")[:2] != b.split(".")[:2]:
                continue
            assert probs[a].output_shape == probs[b].x_shape, (a, b)
        # every stage ends at 7x7 with the right width
        last = [n for n in names if n.startswith("layer4")][-1]
        assert probs[last].output_shape[2:] == (7, 7)


def test_nhwc_and_errors():
    p = network("vgg16", 4, layout="NHWC")["conv3_1"]
    assert p.x_shape == (4, 56, 56, 128) and p.w_shape == (256, 3, 3, 128)
    with pytest.raises(ValueError, match="net"):
        layers("lenet")
