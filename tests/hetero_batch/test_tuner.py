from lightning_hetero.hetero_batch.tuner import adjustment_metrics, format_summary


def test_summary_shows_times_not_samples_per_second_and_counts_rollbacks():
    text = format_summary(
        [60, 4], [0.031, 0.030], [0.032, float("nan")], [{"reason": "balance"}, {"reason": "rollback"}], 0.033, None
    )
    lines = text.splitlines()
    assert "ms/step" in lines[1] and "samples/s" not in text
    assert lines[3].split() == ["1", "4", "30.0", "n/a"]
    assert "split changes 2 (1 rolled back)" in text and "33.0 ms" in text
    assert "equal batches" not in text  # no model prediction without a fit of the equal split


def test_summary_before_any_fit_says_n_a():
    text = format_summary([32, 32], [], None, [], None, None)
    assert text.count("n/a") == 4 and "synchronous step" not in text


def test_adjustment_metrics_name_each_rank():
    metrics = adjustment_metrics([0.02, 0.04], None, [48, 16])
    assert metrics == {
        "hetero/predicted_step_ms_rank0": 20.0,
        "hetero/predicted_step_ms_rank1": 40.0,
        "hetero/batch_size_rank0": 48.0,
        "hetero/batch_size_rank1": 16.0,
    }
