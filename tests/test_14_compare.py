"""Exercise 14's measurement (solutions/14_long_rollouts/compare.py) and its renderers: the
statistics over seeds against float64 numpy, the mean-field baseline on real (tiny) data, the step
a variant falls behind persistence, the default's rule on constructed numbers, the tables and
sentences coursetools.results renders from a results file, wellfno.evaluate --context, and a
tiny whole run (slow)."""
import importlib.util
import json
import math

import numpy as np
import pytest

from tests.conftest import REPO, call_main, exit_of, import_script, run_script

COMPARE = REPO / "solutions/14_long_rollouts/compare.py"


@pytest.fixture(scope="module")
def compare():
    spec = importlib.util.spec_from_file_location("compare14_stats", COMPARE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_t_quantiles_are_students(compare):
    stats = pytest.importorskip("scipy.stats")
    for df in range(1, 61):
        assert compare.t975(df) == pytest.approx(stats.t.ppf(0.975, df), abs=1e-3), df


def synthetic_runs(compare, seed=0, n_seeds=5, steps=20, shift=0.0, step_1=0.08, flops=1e8,
                   samples=100):
    """Runs as compare.read_run returns them, from random per-step curves (float64)."""
    rng = np.random.default_rng(seed)
    runs = []
    for s in range(n_seeds):
        curve = np.linspace(step_1, 1.4, steps) + shift + rng.normal(0, 0.05, steps)
        curve[0] = step_1 + rng.normal(0, 0.003)
        windows = {label: float(curve[a - 1:min(b, steps)].mean())
                   for label, a, b in compare.rollout.PAPER_WINDOWS if a <= steps}
        windows["all"] = float(curve.mean())
        runs.append(dict(seed=s, per_step=curve.tolist(), windows=windows,
                         worst_step_over_persistence=1.0, epochs=4, training_samples=samples,
                         samples_per_second=50.0, flops_per_sample=flops,
                         peak_memory_bytes=5e8, training_flops=flops * samples))
    return runs


def test_statistics_against_numpy(compare):
    """Each window's mean, standard deviation and 95 % half-width over 5 seeds, the mean curve,
    and the paired difference to the reference, against numpy's float64 (scipy's t where there
    is scipy)."""
    ref = synthetic_runs(compare, seed=1)
    other = synthetic_runs(compare, seed=2, shift=-0.1)
    persistence = np.linspace(0.2, 1.2, 20)
    summary = compare.summarize({"one-step": ref, "x": other}, persistence.tolist(),
                                [1.0] * 20)
    try:
        from scipy.stats import t
        t4 = t.ppf(0.975, 4)
    except ImportError:
        t4 = 2.7764451051977987
    for name, runs in (("one-step", ref), ("x", other)):
        for w in ("1", "2", "3:5", "6:12", "13:30", "all"):
            values = np.array([r["windows"][w] for r in runs], dtype=np.float64)
            got = summary[name]["windows"][w]
            assert got["mean"] == pytest.approx(values.mean(), rel=1e-12)
            assert got["sd"] == pytest.approx(values.std(ddof=1), rel=1e-12)
            assert got["half_width"] == pytest.approx(t4 * values.std(ddof=1) / math.sqrt(5),
                                                      rel=1e-3)
            assert (got["min"], got["max"]) == (values.min(), values.max())
        curves = np.array([r["per_step"] for r in runs])
        np.testing.assert_allclose(summary[name]["per_step"], curves.mean(0), rtol=1e-12)
        np.testing.assert_array_equal(summary[name]["per_step_max"], curves.max(0))
    diff = np.array([o["windows"]["all"] - r["windows"]["all"] for o, r in zip(other, ref)])
    paired = summary["x"]["vs_reference"]["all"]
    assert paired["mean"] == pytest.approx(diff.mean(), rel=1e-12)
    assert paired["half_width"] == pytest.approx(t4 * diff.std(ddof=1) / math.sqrt(5), rel=1e-3)
    assert "vs_reference" not in summary["one-step"]
    one = compare.interval([0.5])
    assert one["mean"] == 0.5 and one["half_width"] is None and one["sd"] is None


@pytest.mark.parametrize("curve, expected", [
    ([0.5, 1.2, 0.9, 1.3, 1.4], (2, 4)),  # behind at 2, ahead at 3, behind from 4 on
    ([0.5, 0.6, 0.7], (None, None)),      # never behind
    ([1.5, 1.6, 1.7], (1, 1)),            # behind from the first step
    ([0.5, 1.2, 0.9], (2, None)),         # ahead again at the last step
    ([0.5, 1.0, 1.1], (3, 3)),            # equal is not behind
])
def test_the_step_a_curve_falls_behind(compare, curve, expected):
    assert compare.behind_from(curve, [1.0] * len(curve)) == expected


def rule_summary(compare, **variants):
    """A summary from synthetic runs: variants name -> synthetic_runs options."""
    runs = {name: synthetic_runs(compare, **options) for name, options in variants.items()}
    persistence = (np.linspace(0.2, 1.2, 20) + 0.02).tolist()
    return compare.summarize(runs, persistence, [1.0] * 20)


def test_the_rule_on_constructed_numbers(compare):
    summary = rule_summary(
        compare, **{"one-step": dict(seed=1),
                    "noise-0.1": dict(seed=2, shift=-0.3),             # lower, step 1 alike
                    "unrolled-4": dict(seed=3, shift=-0.35, flops=4e8),  # lower but 4x the cost
                    "pushforward-4": dict(seed=4, shift=-0.3, step_1=0.12),  # step 1 worse
                    "input-4": dict(seed=5, shift=0.0)})               # not lower
    verdict = compare.rule(summary)
    checks = verdict["checks"]
    assert checks["noise-0.1"]["passes"] and checks["unrolled-4"]["passes"]
    assert not checks["pushforward-4"]["step_1_ok"] and not checks["pushforward-4"]["passes"]
    assert not checks["input-4"]["lower"] and not checks["input-4"]["passes"]
    assert verdict["chosen"] == "noise-0.1" and verdict["remedy"]
    assert verdict["agrees"] == (compare.DEFAULT == "noise-0.1")  # solution 14's default is the pick
    # within SAME_COST of the cheapest: the lower whole-trajectory mean wins
    summary["unrolled-4"]["training_flops"] = 1.05 * summary["noise-0.1"]["training_flops"]
    assert compare.rule(summary)["chosen"] == "unrolled-4"
    # a variant behind persistence earlier than the reference fails, whatever its mean
    summary["noise-0.1"]["behind_persistence_from"] = 1
    assert not compare.rule(summary)["checks"]["noise-0.1"]["not_earlier"]
    lines = compare.verdict_lines(compare.rule(summary), 20)
    assert lines[-1].startswith("  verdict: the cheapest that passes: unrolled-4")


def test_the_rule_without_a_remedy_or_a_reference(compare):
    none = compare.rule(rule_summary(compare, **{"one-step": dict(seed=1),
                                                 "noise-0.1": dict(seed=2, shift=0.05)}))
    assert none["chosen"] == "one-step" and not none["remedy"]
    assert none["agrees"] == (compare.DEFAULT == "one-step")
    assert "none passes: no remedy (one-step)" in compare.verdict_lines(none, 20)[-1]
    missing = compare.rule(rule_summary(compare, **{"noise-0.1": dict(seed=2)}))
    assert missing["chosen"] is None and missing["why"] == "one-step was not measured"
    single = compare.rule(rule_summary(compare, **{"one-step": dict(seed=1, n_seeds=1),
                                                   "noise-0.1": dict(seed=2, n_seeds=1)}))
    assert single["why"] == "it needs at least 2 seeds"
    assert "no verdict" in compare.verdict_lines(single, 20)[-1]


def test_the_mean_field_scores_one_on_real_data(compare, tiny_dataset_dir):
    """Each field's spatial mean, scored by The Well's VRMSE (sample variance): sqrt((N-1)/N) at
    every step and field where the field is not flat (16 x 16 points here)."""
    for context in (1, 4):
        errors = compare.mean_field_errors(tiny_dataset_dir, context, 12 - context)
        assert len(errors) == 2 and errors[0].shape == (12 - context, 2)
        for e in errors:
            np.testing.assert_allclose(e.numpy(), math.sqrt(255 / 256), rtol=1e-4)
        field = compare.mean_field(tiny_dataset_dir, context, 12 - context)
        assert field["whole_trajectory"] == pytest.approx(math.sqrt(255 / 256), rel=1e-4)
        assert set(field["windows"]) >= {"1", "2", "3:5", "all"}


@pytest.mark.parametrize("argv, said", [
    (["--seeds", "-1"], "--seeds must be different numbers, 0 or more"),
    (["--seeds", "0", "0"], "--seeds must be different numbers, 0 or more"),
    (["--variants", "one-step", "one-step"], "--variants must be different names"),
    (["--context", "1"], "--context 1: a variant sees 4 input frames"),
    (["--epochs", "0"], "--epochs and --jobs must be at least 1"),
    (["--run-index", "25"], "--run-index 25: there are 25 runs (5 variants x 5 seeds), 0 to 24"),
])
def test_bad_input_is_one_line(compare, argv, said, tmp_path):
    result = exit_of(compare, *argv, "--out", tmp_path / "out", "--data-dir", tmp_path / "data")
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and said in lines[0], lines
    assert not (tmp_path / "out").exists() and not (tmp_path / "data").exists()


def test_the_measured_list_and_the_budget(compare):
    """make results measures MEASURED with seeds 0-4; the job array covers the same list;
    one-step-long trains 15 of 4 epochs (unrolled-4's FLOPs)."""
    args = compare.parse_args(["--out", "x"])
    assert args.variants == list(compare.MEASURED) and args.seeds == [0, 1, 2, 3, 4]
    assert compare.REFERENCE in compare.MEASURED and compare.DEFAULT in compare.MEASURED
    assert compare.epochs_of("one-step-long", 4) == 15 and compare.epochs_of("one-step", 4) == 4
    assert compare.n_steps_input("input-4") == 4 and compare.n_steps_input("noise-0.1") == 1
    runs = len(compare.MEASURED) * 5
    assert f"#SBATCH --array=0-{runs - 1}\n" in (REPO / "slurm/14_long_rollouts.sbatch").read_text()
    commands = compare.run_commands(args, "one-step-long", 3, REPO / "o")
    assert commands[0][commands[0].index("--epochs") + 1] == "15"
    assert commands[1][-2:] == ["--context", "4"]


# ------------------------------------------------------------------ the renderers
def synthetic_result(compare, tmp_path):
    from benchtools.resultfiles import write_result

    runs = {"one-step": synthetic_runs(compare, seed=1),
            "noise-0.1": synthetic_runs(compare, seed=2, shift=-0.1)}
    persistence = (np.linspace(0.2, 1.2, 20) + 0.02).tolist()
    field = dict(per_step=[0.999] * 20, whole_trajectory=0.999,
                 windows={w: 0.999 for w in compare.WINDOWS})
    summary = compare.summarize(runs, persistence, field["per_step"])
    windows = [dict(window=label, first=a, last=min(b, 20), complete=b <= 20)
               for label, a, b in compare.rollout.PAPER_WINDOWS if a <= 20]
    windows.append(dict(window="all", first=1, last=20, complete=True))
    payload = dict(format=2, dataset="gray_scott_embedded", epochs=4, seeds=[0, 1, 2, 3, 4],
                   context=4, windows=windows, jobs=2, threads_per_run=1, steps=20,
                   trajectories=12, default_variant=compare.DEFAULT, reference="one-step",
                   variants={v: dict(flags=list(compare.VARIANTS[v][1]), epochs=4,
                                     script="solutions/14_long_rollouts/fno.py") for v in runs},
                   persistence=dict(per_step=persistence, whole_trajectory=float(
                       np.mean(persistence)), windows={w: 0.5 for w in compare.WINDOWS}),
                   mean_field=field, summary=summary, runs=runs, verdict=compare.rule(summary))
    (tmp_path / "results").mkdir()
    write_result(tmp_path / "results" / "14_long_rollouts.json", "python compare.py", payload)
    return payload


def test_the_renderers_quote_the_results_file(compare, tmp_path):
    from coursetools import results

    payload = synthetic_result(compare, tmp_path)
    table = results.long_rollouts_table(tmp_path)
    s = payload["summary"]["noise-0.1"]
    window = s["windows"]["6:12"]
    assert f"| {window['mean']:.3f} ± {window['half_width']:.3f} |" in table
    assert f"| **{compare.DEFAULT}** (the default) |" in table and "| mean field |" in table
    assert "13:30*" in table and "13:30*: steps 13–20 only." in table
    versus = s["vs_reference"]["all"]
    assert f"{versus['mean']:.3f} ± {versus['half_width']:.3f}" in table
    assert "Student's t with 4 degrees of freedom" in table and "2 runs at a time" in table
    k = s["behind_persistence_from"]
    claims = results.long_rollouts_claims(tmp_path)
    assert f"- **noise-0.1**: ahead of persistence up to step {k - 1}, then behind it" in claims
    agrees = "the rule's pick." if compare.DEFAULT == "noise-0.1" else "**not** the rule's pick."
    assert f"the cheapest, **noise-0.1**. Solution 14's default is {compare.DEFAULT}: {agrees}" \
        in claims
    row = results.long_rollouts_readme_row(results._result(tmp_path, "14_long_rollouts.json"))
    assert f"the default's rule picks **noise-0.1** (5 seeds): ahead of persistence up to step " \
           f"{k - 1} of 20" in row[2]


def test_the_renderers_name_an_old_results_file(tmp_path):
    from benchtools.resultfiles import write_result
    from coursetools import results

    (tmp_path / "results").mkdir()
    write_result(tmp_path / "results" / "14_long_rollouts.json", "python compare.py",
                 dict(summary={}, seeds=[0, 1, 2]))
    for said in (results.long_rollouts_table(tmp_path), results.long_rollouts_claims(tmp_path),
                 results.long_rollouts_readme_row(results._result(
                     tmp_path, "14_long_rollouts.json"))[2]):
        assert "make results ONLY=14_long_rollouts" in said


# ------------------------------------------------------------------ wellfno.evaluate --context
def test_evaluate_scores_a_run_from_a_later_frame(tiny_data_dir, tmp_path):
    """--context 4 on a one-frame run: 8 steps, persistence of frame 3, the model given frame 3
    only; a context shorter than the model's frames, or as long as a trajectory, is one line."""
    import torch

    from wellfno import data, evaluate, rollout


    solution = import_script(REPO / "solutions/14_long_rollouts/fno.py")
    out = tmp_path / "run"
    call_main(solution, "--data-dir", tiny_data_dir, "--out", out, "--max-steps", "2",
              "--epochs", "1", "--bind", "none")
    call_main(evaluate, "--run", out, "--context", "4")
    report = json.loads((out / "evaluation.json").read_text())
    assert report["steps"] == 8 and report["context"] == 4 and report["n_steps_input"] == 1
    dataset_dir = tiny_data_dir / "datasets" / data.EMBEDDED
    trajectories = data.rollout_dataset(dataset_dir, 4, "valid", max_rollout_steps=8)
    expected = []
    for i in range(len(trajectories)):
        sample = trajectories[i]
        true = sample["output_fields"].double()
        expected.append(rollout.well_vrmse(sample["input_fields"][3:4].double().expand_as(true),
                                           true).mean(-1))
    np.testing.assert_allclose(report["persistence"]["per_step"],
                               torch.stack(expected).mean(0).numpy(), rtol=1e-12)
    for context, said in (("0", "--context 0: the run's model sees 1 frame(s)"),
                          ("12", "pass 1 to 11")):
        result = exit_of(evaluate, "--run", out, "--context", context)
        assert result.returncode == 2 and said in result.stderr, result.stderr


# ------------------------------------------------------------------ the whole measurement
@pytest.mark.slow  # 4 training runs and their evaluations (about 2 minutes on 2 busy cores)
def test_compare_end_to_end_on_tiny_data(tiny_data_dir, tmp_path):
    results = tmp_path / "results.json"
    result = run_script(COMPARE, "--variants", "one-step", "input-4", "--seeds", "0", "1",
                        "--epochs", "1", "--data-dir", tiny_data_dir, "--out", tmp_path / "out",
                        "--results", results, "--jobs", "2", timeout=900)
    assert result.returncode == 0, result.stderr[-2000:]
    written = json.loads(results.read_text())
    d = written["data"]
    assert d["format"] == 2 and d["steps"] == 8 and d["context"] == 4 and d["trajectories"] == 2
    assert written["machine"]["torch_threads"] == d["threads_per_run"] == 1
    for variant in ("one-step", "input-4"):
        for r in d["runs"][variant]:
            report = json.loads((tmp_path / "out" / variant / f"seed{r['seed']}" /
                                 "evaluation.json").read_text())
            assert report["context"] == 4 and r["windows"]["all"] == report["model"][
                "whole_trajectory"]
    assert d["mean_field"]["whole_trajectory"] == pytest.approx(math.sqrt(255 / 256), rel=1e-4)
    assert set(d["verdict"]["checks"]) == {"input-4"} and d["verdict"]["reference"] == "one-step"
    assert "the default's rule" in result.stdout and "verdict:" in result.stdout
    assert "issue 36" not in result.stdout
    assert (tmp_path / "out" / "compare.png").stat().st_size > 1000
    assert results.with_suffix(".png").stat().st_size > 1000
