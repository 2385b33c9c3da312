"""TF32 off in the equivalence checks (wellfno.device.exact_float32).

On NVIDIA GPUs from Ampere on, cuDNN runs float32 convolutions in TF32 unless told otherwise
(torch.backends.cudnn.allow_tf32 is True by default): the FNO's 1x1 convolutions are then good to
about 1e-3, and a check of 2 ranks against 1 at float32's 1e-5 fails on a correct program. The
flags are torch's on every build, so a CPU run sees whether a check turned them off.
"""
from __future__ import annotations

import socket

import pytest
import torch

from wellfno import complex_ddp_check as ddp
from wellfno.device import exact_float32


@pytest.fixture
def tf32_on():
    """TF32 allowed, as a GPU process starts (cuDNN) or a site sets it (matmuls); restored after."""
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
              torch.get_float32_matmul_precision())
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before[:2]
    torch.set_float32_matmul_precision(before[2])


def assert_tf32_off():
    assert torch.backends.cuda.matmul.allow_tf32 is False, "cuBLAS matmuls may still use TF32"
    assert torch.backends.cudnn.allow_tf32 is False, "cuDNN convolutions may still use TF32"
    assert torch.get_float32_matmul_precision() == "highest"


def test_exact_float32_turns_tf32_off_and_says_so(tf32_on):
    line = exact_float32()
    assert_tf32_off()
    assert "TF32 off" in line and "\n" not in line


def test_the_ddp_check_runs_with_tf32_off(tf32_on, tmp_path, monkeypatch, capsys):
    """python -m wellfno.complex_ddp_check (the day-0 DDP check), one gloo rank in this process:
    it turns TF32 off before its steps and prints that it did."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for name, value in dict(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                            MASTER_PORT=str(port)).items():
        monkeypatch.setenv(name, value)
    ddp.main(["--out", str(tmp_path / "check"), "--backend", "gloo", "--batch-size", "1",
              "--grid", "8", "--width", "4", "--modes", "4"])
    assert_tf32_off()
    assert "TF32 off" in capsys.readouterr().out
