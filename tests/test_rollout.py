"""Rollout indexing and metrics against independent numpy references."""
import numpy as np
import pytest
import torch

from wellfno.data import rollout_dataset, to_channels
from wellfno.rollout import evaluate_rollouts, persistence, rollout, vrmse


def numpy_vrmse(pred, true, eps=1e-7):
    pred, true = np.asarray(pred, np.float64), np.asarray(true, np.float64)
    mse = ((pred - true) ** 2).mean(axis=(-3, -2))
    return np.sqrt(mse / (true.var(axis=(-3, -2)) + eps))


class Oracle(torch.nn.Module):
    """Returns the true next frame, found by matching the whole input window in the trajectory.

    If the rollout built its window wrongly (order, shift) the match fails loudly.
    """

    def __init__(self, trajectory, n_steps_input):
        super().__init__()
        self.trajectory = trajectory  # (T, H, W, F)
        self.n = n_steps_input

    def forward(self, x):  # (1, T*F, H, W)
        for t in range(self.n, self.trajectory.shape[0]):
            window = to_channels(self.trajectory[t - self.n:t].unsqueeze(0))
            if torch.equal(window, x):
                return self.trajectory[t].permute(2, 0, 1).unsqueeze(0)
        raise AssertionError("the rollout fed a window that is not a stretch of the trajectory")


def test_vrmse_matches_numpy():
    rng = np.random.default_rng(0)
    true, pred = rng.normal(size=(3, 8, 8, 2)), rng.normal(size=(3, 8, 8, 2))
    np.testing.assert_allclose(vrmse(torch.tensor(pred), torch.tensor(true)).numpy(), numpy_vrmse(pred, true),
                               rtol=1e-12)


@pytest.mark.parametrize("n_steps_input", [1, 3])
def test_oracle_scores_zero_and_persistence_matches_numpy(tiny_dataset_dir, n_steps_input):
    ds = rollout_dataset(tiny_dataset_dir, n_steps_input)
    sample = ds[0]
    trajectory = torch.cat([sample["input_fields"], sample["output_fields"]])
    inputs, true = sample["input_fields"].unsqueeze(0), sample["output_fields"].unsqueeze(0)
    n = true.shape[1]
    pred = rollout(Oracle(trajectory, n_steps_input), inputs, n)
    assert pred.shape == true.shape
    torch.testing.assert_close(pred, true, rtol=0, atol=0)
    # persistence at step k compares the last input frame with true frame k
    traj = trajectory.numpy()
    expected = [numpy_vrmse(traj[n_steps_input - 1], traj[n_steps_input - 1 + k]).mean() for k in range(1, n + 1)]
    got = vrmse(persistence(inputs, n), true).mean(-1)[0].numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-5)


def test_evaluate_rollouts_with_an_oracle_is_zero(tiny_dataset_dir):
    ds = rollout_dataset(tiny_dataset_dir, 1)

    class LookupOracle(torch.nn.Module):
        def forward(self, x):
            for s in ds:
                traj = torch.cat([s["input_fields"], s["output_fields"]])
                for t in range(1, traj.shape[0]):
                    if torch.equal(to_channels(traj[t - 1:t].unsqueeze(0)), x):
                        return traj[t].permute(2, 0, 1).unsqueeze(0)
            raise AssertionError("unknown window")

    model_curve, persistence_curve, (true, pred) = evaluate_rollouts(LookupOracle(), ds, "cpu")
    assert len(model_curve) == 11 and max(model_curve) == 0.0
    assert min(persistence_curve) > 0.0
    torch.testing.assert_close(true, pred)
