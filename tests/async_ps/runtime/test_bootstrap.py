import pytest
import torch

from lightning_hetero.asp.layout import flatten_model
from lightning_hetero.async_ps.runtime.bootstrap import connect_store


def test_flatten_model_binds_the_trainable_parameters_to_one_buffer():
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))
    model[0].bias.requires_grad_(False)
    flat = flatten_model(model)
    assert flat.layout.names == ("0.weight", "1.weight", "1.bias")
    assert flat.flat.numel() == 6 + 2 + 1
    flat.flat.fill_(3.0)
    assert all(bool((p == 3.0).all()) for p in flat.params)
    assert not bool((model[0].bias == 3.0).any())  # frozen parameters stay out of the buffer


@pytest.mark.parametrize(
    ("model", "match"),
    [
        (torch.nn.Linear(2, 1).requires_grad_(False), "no trainable parameters"),
        (torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1).double()), "one floating dtype"),
    ],
)
def test_flatten_model_names_what_cannot_be_flattened(model, match):
    with pytest.raises(ValueError, match=match):
        flatten_model(model)


def test_connect_store_hosts_the_store_on_rank_0_and_shares_its_port():
    sent = []

    def broadcast(obj, src):
        sent.append((obj, src))
        return obj

    store = connect_store("127.0.0.1", 0, timeout_s=5.0, broadcast=broadcast)
    [(port, src)] = sent
    assert src == 0 and port == store.port
    assert store.add("claims/epoch0", 4) == 4
