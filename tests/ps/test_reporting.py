from lightning_hetero.ps.compensation import AsynchronyCompensator
from lightning_hetero.ps.reporting import LOG_EVERY_N_BATCHES, compensation_message, should_log_hyperparameters


def test_hyperparameters_are_logged_on_the_first_batch_every_n_after_it_and_the_last():
    logged = [n for n in range(1, 3 * LOG_EVERY_N_BATCHES) if should_log_hyperparameters(n, last_batch=False)]
    assert logged == [1, 1 + LOG_EVERY_N_BATCHES, 1 + 2 * LOG_EVERY_N_BATCHES]
    assert should_log_hyperparameters(4, last_batch=True)


def test_the_message_names_the_compensated_values_beside_the_users():
    compensator = AsynchronyCompensator("auto", workers=4)
    compensator.apply([{"lr": 0.1, "momentum": 0.9}])
    message = compensation_message({"lr": 0.1, "momentum": 0.9}, compensator, "auto")
    assert "asynchrony_compensation='auto'" in message and "(yours 0.9)" in message and "(yours 0.1)" in message
    assert f"momentum {compensator.momentum_effective:.4g}" in message
