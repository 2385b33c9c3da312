"""wellfno.memory: the estimate of a step's memory against the peak a CPU step really takes."""
import json
import os
import subprocess
import sys

import pytest
import torch

from wellfno.cli import UserError
from wellfno.memory import check_step_fits, rollout_steps, step_bytes
from wellfno.model import NextFrameFNO

# One training step in a fresh process; its peak is the rise of the peak resident set size over
# the resident size just before the step: every page the step touched at once. Linux resets the
# peak (VmHWM) on writing 5 to /proc/self/clear_refs, so what imports touched earlier is not counted.
MEASURE = r"""
import json, sys
import torch
from wellfno.model import NextFrameFNO
from wellfno.memory import step_bytes

def status(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))

batch, channels, constant, width, layers, modes = map(int, sys.argv[1:7])
res = tuple(map(int, sys.argv[7].split("x")))
checkpointed = sys.argv[8:] == ["checkpointed"]
torch.set_num_threads(1)
stats = {k: torch.ones(channels) for k in ("mean", "std", "mean_delta", "std_delta")}
model = NextFrameFNO(channels, 1, stats, n_spatial_dims=len(res), constant_channels=constant, resolution=res,
                     modes=modes, width=width, layers=layers)
if checkpointed:
    from wellfno.checkpointing import checkpoint_blocks
    checkpoint_blocks(model.fno)
optimizer = torch.optim.Adam(model.parameters())
x, y = torch.randn(batch, channels + constant, *res), torch.randn(batch, channels, *res)
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # peak RSS := current RSS
before = status("VmRSS")
stale = status("VmHWM") - before
loss = model.loss(model(x), y)
optimizer.zero_grad()
loss.backward()
optimizer.step()
peak = status("VmHWM")
n_parameters = sum(p.numel() for p in model.parameters())
# the parameters were resident before `before`: the step's peak holds them too
resident = sum(p.numel() * p.element_size() for p in model.parameters())
print(json.dumps(dict(measured=peak - before + resident, stale=stale,
                      estimate=step_bytes(n_parameters, batch, res, channels + constant, channels, width, layers,
                                                checkpointed))))
"""


@pytest.mark.slow
@pytest.mark.parametrize("config", [
    "8 3 0 32 4 12 64x64",  # 2-D, the course's default model
    "4 4 2 32 4 12 96x48",  # 2-D, rectangular, with constant fields
    "2 7 0 32 4 12 32x32x32",  # 3-D (MHD's channels)
    "4 7 0 16 2 8 24x32x16",  # 3-D, narrower and shallower
    "8 3 0 32 8 12 64x64 checkpointed",  # activation checkpointing (wellfno.checkpointing), 8 blocks
    "4 7 0 16 4 8 24x32x16 checkpointed",  # 3-D
])
def test_estimate_within_a_factor_of_measured_peak(config):
    if not os.path.exists("/proc/self/clear_refs"):
        pytest.skip("measures the peak resident size with Linux's /proc/self/clear_refs")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if config.endswith("checkpointed"):
        # glibc keeps freed blocks in its heap and hands the backward's recomputed activations fresh
        # pages: the peak RSS then counts memory no tensor holds (measured: 266 MB for 146 MB of live
        # tensors at 64x64, 8 blocks). A fixed mmap threshold returns every freed tensor to the OS,
        # so that the peak RSS is the peak of live tensors, as a GPU's caching allocator reports it.
        env["MALLOC_MMAP_THRESHOLD_"] = "65536"
    result = subprocess.run([sys.executable, "-c", MEASURE, *config.split()], capture_output=True, text=True,
                            timeout=300, env=env)
    assert result.returncode == 0, result.stderr
    got = json.loads(result.stdout)
    assert got["stale"] < 0.05 * got["measured"], "the process peaked before the step: the measurement is void"
    assert got["measured"] > 50e6  # large enough that allocator noise does not decide the ratio
    # Within 1.5x either way: the allocator rounds and caches blocks and FFT workspaces come and go;
    # a factor of 1.5 still tells a laptop's 16 GB from a step that needs 40. The checkpointed peak
    # RSS depends on the machine even so: 75 MB here, 113 MB on the CI machine for the 3-D config
    # (estimate 94 MB: 1.25x and 0.83x). The peak of live tensors (torch.profiler's memory events)
    # does not: the estimate is 1.56-1.81x above it for all six configs alike, which says the
    # checkpointed model is the plain one's, not a different fit.
    assert 1 / 1.5 < got["estimate"] / got["measured"] < 1.5, got


def model_for(resolution, channels=7, **options):
    stats = {k: torch.ones(channels) for k in ("mean", "std", "mean_delta", "std_delta")}
    return NextFrameFNO(channels, 1, stats, n_spatial_dims=len(resolution), resolution=resolution, **options)


def test_estimate_counts_by_hand():
    """4 copies of the parameters + per sample cells * (6 W L + 20 W + 2 C_in + 4 C_out), float32."""
    assert step_bytes(1000, 2, (4, 5), 3, 2, 8, 1) == 4 * (4 * 1000 + 2 * 20 * (6 * 8 + 20 * 8 + 6 + 8))


def test_mhd_256_on_a_laptop_is_one_sentence():
    model = model_for((256, 256, 256))
    with pytest.raises(UserError) as err:
        check_step_fits(model, 16, torch.device("cpu"), available=16 * 10**9)
    message = str(err.value)
    assert "\n" not in message
    assert "even --batch-size 1 does not fit" in message and "256x256x256" in message


def test_the_largest_batch_that_fits_is_suggested():
    model = model_for((64, 64, 64))
    n_parameters = sum(p.numel() for p in model.parameters())
    one = step_bytes(n_parameters, 1, (64, 64, 64), model.in_channels, 7, model.width, model.layers)
    per_sample = step_bytes(n_parameters, 2, (64, 64, 64), model.in_channels, 7, model.width, model.layers) - one
    available = one + 4 * per_sample + per_sample // 2  # 5 samples fit, 6 do not
    with pytest.raises(UserError, match="lower --batch-size to 5 "):
        check_step_fits(model, 16, torch.device("cpu"), available=available)
    line = check_step_fits(model, 5, torch.device("cpu"), available=available)
    assert line.startswith("a training step needs about")


def test_rollout_steps_fit_the_memory():
    mhd_256 = model_for((256,) * 3)  # 7 channels: 470 MB per frame
    frame = 4 * 256**3 * 7
    # a laptop, 16 GB of RAM: three copies of T frames in half of it
    assert rollout_steps(mhd_256, torch.device("cpu"), available=(16 * 10**9, 0)) == 16 * 10**9 // 2 // (3 * frame)
    # a GPU with 141 GB, a host with 500 GB: two copies on the GPU in half of it: 70.5 GB / 0.94 GB
    assert rollout_steps(mhd_256, torch.device("cuda"), available=(500 * 10**9, 141 * 10**9)) == 75
    # small data: the_well's default of 100 steps
    assert rollout_steps(model_for((64, 64), channels=4), torch.device("cpu"), available=(16 * 10**9, 0)) == 100
    # never less than one step
    assert rollout_steps(mhd_256, torch.device("cpu"), available=(10**6, 0)) == 1


def test_checkpointing_and_domain_ranks_by_hand():
    """Checkpointed: W L + max(20, 6) W instead of 6 W L + 20 W (one block is rebuilt after the
    projection's tensors are freed); P domain ranks: the largest slab's ceil(n0 / P) rows."""
    assert step_bytes(1000, 2, (4, 5), 3, 2, 8, 3, checkpointed=True) == \
        4 * (4 * 1000 + 2 * 20 * (8 * 3 + 20 * 8 + 6 + 8))
    assert step_bytes(1000, 2, (5, 4), 3, 2, 8, 1, domain_size=2) == 4 * (4 * 1000 + 2 * 3 * 4 * (6 * 8 + 20 * 8 + 6 + 8))


@pytest.mark.parametrize("gib, checkpointed, width, ranks", [
    (64, False, 32, 2), (80, False, 32, 2), (80, True, 32, 1), (64, True, 32, 1), (16, False, 32, 6),
    (64, True, 48, 2), (64, False, 48, 3)])
def test_domain_ranks_mhd_256_needs(gib, checkpointed, width, ranks):
    """MHD_256 at width 32, batch 1: about 97 GB, 54 GB checkpointed (exercises 12 and 13): 2 ranks of a
    64 GiB GPU (an MI250X GCD) or of an 80 GiB one (A100/H100), 1 with checkpointing; on 16 GiB, 6
    (slabs of 43 of the 256 rows: 16.4 GB). Width 48 on the GCD: 80 GB checkpointed, 2 ranks; 3 plain."""
    from wellfno.memory import domain_ranks_needed

    model = model_for((256, 256, 256), width=width)
    assert domain_ranks_needed(model, gib * 2**30, 1, checkpointed) == ranks


def test_the_advice_names_only_the_options_the_script_has():
    model = model_for((256, 256, 256))
    plain = pytest.raises(UserError, check_step_fits, model, 1, torch.device("cpu"), available=64 * 2**30)
    assert "--checkpoint-blocks" not in str(plain.value) and "--domain-size" not in str(plain.value)
    both = pytest.raises(UserError, check_step_fits, model, 1, torch.device("cpu"), available=64 * 2**30,
                         checkpointed=False, domain_size=1)
    assert "(--checkpoint-blocks)" in str(both.value) and "across 2 GPUs (--domain-size 2)" in str(both.value)
    line = check_step_fits(model, 1, torch.device("cpu"), available=64 * 2**30, checkpointed=False, domain_size=2)
    assert "a slab of 2 domain ranks" in line


def test_the_global_batchs_noise_is_counted(tmp_path):
    """Solution 14's --input-noise: every rank draws the noise of the whole global batch (data
    groups x batch) over whole frames, before the forward. wellfno.memory.noise_bytes against the
    peak that RolloutLoss.add_noise really allocates (the profiler's memory records of torch's CPU
    allocator), and check_step_fits refusing a step whose noise alone does not fit."""
    import json as _json

    from torch.profiler import ProfilerActivity, profile

    from wellfno.memory import noise_bytes
    from wellfno.unrolled import RolloutLoss

    stats = {k: torch.ones(2) for k in ("mean", "std", "mean_delta", "std_delta")}
    model = NextFrameFNO(2, 2, stats, constant_channels=1, resolution=(32, 32), modes=4, width=8,
                         layers=2)
    groups, batch = 64, 2
    loss = RolloutLoss(model.loss, model.last_frame.stop, 1, noise=0.1, share=(3, groups))
    x = torch.randn(batch, model.in_channels, 32, 32)
    loss.add_noise(x)  # the generator made: what is measured is a step's draw
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        loss.add_noise(x)
    prof.export_chrome_trace(str(tmp_path / "noise.json"))
    records = [e["args"] for e in _json.loads((tmp_path / "noise.json").read_text())["traceEvents"]
               if e.get("name") == "[memory]"]
    peak = max(r["Total Allocated"] for r in records) - (records[0]["Total Allocated"]
                                                         - records[0]["Bytes"])
    counted = noise_bytes(loss, batch, (32, 32), model.in_channels)
    assert peak >= 4 * groups * batch * 4 * 32 * 32  # the global batch's 4 frame channels
    assert peak <= counted <= 1.1 * peak
    assert noise_bytes(RolloutLoss(model.loss, 4, 1, share=(3, groups)), batch, (32, 32), 5) == 0

    def least_available(**options):  # the fewest bytes check_step_fits lets the step run in
        lo, hi = 1, 2**40
        while lo < hi:
            mid = (lo + hi) // 2
            try:
                check_step_fits(model, batch, torch.device("cpu"), available=mid, **options)
                hi = mid
            except UserError:
                lo = mid + 1
        return lo
    plain, noisy = least_available(), least_available(noise_of=loss)
    # at 64 data groups the noise outgrows this small model's step: the noise, beside the weights,
    # Adam's state and the batch, is the peak
    assert noisy > plain and noisy >= counted
    assert least_available(noise_of=RolloutLoss(model.loss, 4, 1, share=(3, 2), noise=0.1)) == plain
