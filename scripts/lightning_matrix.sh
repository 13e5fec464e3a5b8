#!/usr/bin/env bash
# The version matrix: the fast tests against the oldest Lightning the package declares and against the newest
# release, each in its own venv (.venv-lightning-oldest, .venv-lightning-latest) with the same CPU torch as .venv.
#
#   scripts/lightning_matrix.sh              both ends, oldest first
#   scripts/lightning_matrix.sh oldest       one end only (oldest | latest)
#
# "oldest" is the newest patch release of the floor pyproject declares (lightning>=2.2 -> 2.2.5), "latest" is
# whatever pip resolves with --upgrade; it is skipped when .venv (the suite's venv) already holds that release. The fast tests are every test not marked multiprocess, docker or timing;
# then KEY_MULTIPROCESS (a pytest -k expression) picks a few multi-process trainings that go through Lightning's
# launcher, loops, checkpointing and the private names in _lightning_internals, one per feature path (about 90 s).
# PYTEST_ARGS replaces the fast selection; KEY_MULTIPROCESS="" skips the multi-process tests.
set -uo pipefail
cd "$(dirname "$0")/.."

OLDEST=${LIGHTNING_OLDEST:-2.2.5}
FAST_MARKERS='not multiprocess and not docker and not timing'
KEY_MULTIPROCESS=${KEY_MULTIPROCESS-test_two_rank_ddp_loss_falls or test_loss_weighting_gives_the_big_batch_gradient_across_a_split_change or test_mid_epoch_resume_continues_with_the_learned_split or test_checkpoint_resume_continues_from_the_servers_state or test_switching_mode_between_epochs or test_elastic_asp_under_lightnings_launcher_outlives_its_process_observer}
status=0

# The newest Lightning on the index, or nothing when the index cannot say.
newest_release() {
    .venv/bin/python -m pip index versions lightning 2>/dev/null | sed -n 's/^lightning (\(.*\))$/\1/p'
}

run_end() {
    local end=$1 venv=.venv-lightning-$1 start
    start=$(date +%s)
    if [ "$end" = latest ] && [ -x .venv/bin/python ]; then
        # `make test` already ran every test on .venv: a second venv with the same release would repeat it
        local main newest
        main=$(.venv/bin/python -c 'import lightning; print(lightning.__version__)' 2>/dev/null)
        newest=$(newest_release)
        if [ -n "$newest" ] && [ "$main" = "$newest" ]; then
            echo "lightning-matrix: latest: .venv already holds the newest release, lightning $main; its run is the suite's"
            return 0
        fi
    fi
    if [ "$end" = oldest ]; then
        # Lightning 2.2's lightning.fabric imports pkg_resources, which setuptools removed in 81
        printf 'lightning==%s\npytorch-lightning==%s\nsetuptools<81\n' "$OLDEST" "$OLDEST" >"/tmp/lightning-matrix-$end.txt"
    else
        : >"/tmp/lightning-matrix-$end.txt"
    fi
    # bootstrap.sh installs the local CPU torch wheel first, then the package with [dev]; the constraint pins Lightning
    if ! PIP_CONSTRAINT="/tmp/lightning-matrix-$end.txt" VENV=$venv bash scripts/bootstrap.sh >"/tmp/lightning-matrix-$end.log" 2>&1; then
        echo "lightning-matrix: $end: venv failed (see /tmp/lightning-matrix-$end.log)"; tail -n 20 "/tmp/lightning-matrix-$end.log"
        return 1
    fi
    if [ "$end" = latest ]; then
        "$venv/bin/python" -m pip install -q --disable-pip-version-check --upgrade lightning \
            >>"/tmp/lightning-matrix-$end.log" 2>&1
    else
        "$venv/bin/python" -m pip install -q --disable-pip-version-check "setuptools<81" \
            >>"/tmp/lightning-matrix-$end.log" 2>&1
    fi
    VENV=$venv bash scripts/bootstrap.sh --check-cpu-only || return 1
    local versions
    if ! versions=$("$venv/bin/python" -c 'import lightning, torch; print(f"lightning {lightning.__version__}, torch {torch.__version__}")'); then
        echo "lightning-matrix: $end: lightning does not import in $venv"
        return 1
    fi
    echo "lightning-matrix: $end: $versions (venv ready in $(($(date +%s) - start)) s)"
    local args
    if [ -n "${PYTEST_ARGS:-}" ]; then
        # shellcheck disable=SC2206
        args=($PYTEST_ARGS)
    else
        args=(-q -p no:cacheprovider -m "$FAST_MARKERS")
    fi
    "$venv/bin/python" -m pytest "${args[@]}" 2>&1 | grep -v pkg_resources | tail -n 15
    local rc=${PIPESTATUS[0]}
    if [ -n "$KEY_MULTIPROCESS" ] && [ -z "${PYTEST_ARGS:-}" ]; then
        "$venv/bin/python" -m pytest -q -p no:cacheprovider -m "multiprocess and not docker and not timing" \
            -k "$KEY_MULTIPROCESS" 2>&1 | grep -v pkg_resources | tail -n 8
        local mp_rc=${PIPESTATUS[0]}
        [ "$mp_rc" -ne 0 ] && rc=$mp_rc
    fi
    echo "lightning-matrix: $end: $versions: pytest exit $rc in $(($(date +%s) - start)) s (venv + tests)"
    return "$rc"
}

ends=("$@")
[ ${#ends[@]} -eq 0 ] && ends=(oldest latest)
for end in "${ends[@]}"; do
    case "$end" in
        oldest | latest) run_end "$end" || status=1 ;;
        *) echo "usage: $0 [oldest] [latest]" >&2; exit 2 ;;
    esac
done
exit "$status"
