from torch import nn

from lightning_hetero.elastic.signature import model_signature, signature_mismatch


def test_a_model_matches_itself_and_a_wider_or_frozen_one_is_named():
    model = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2))
    assert signature_mismatch(model_signature(model), model_signature(model)) is None
    wider = nn.Sequential(nn.Linear(4, 16), nn.Linear(16, 2))
    assert signature_mismatch(model_signature(wider), model_signature(model)) == (
        "parameter 0.weight has shape [16, 4] here and [8, 4] in the running job"
    )
    model[1].bias.requires_grad_(False)  # frozen parameters are not exchanged: not part of the signature
    assert signature_mismatch(model_signature(wider), model_signature(model)) is not None
    assert "1.bias" not in model_signature(model)
    assert (
        signature_mismatch({"a": [1], "extra": [2]}, {"a": [1]}) == "parameter extra is not in the running job's model"
    )
