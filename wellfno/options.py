"""The command line of the course's first steps (fno.py, 01, 02), moved out of the solutions.

From solution 03 on, a solution's parse_args adds only its own step's options: `add_arguments` is
solution 02's options (fno.py's, 01's --profile-*, 02's loader options) and `check_arguments` its
checks of 02's and 01's options, statement for statement (tests/test_drift.py checks both).
"""
import argparse
import os

from wellfno import data
from wellfno.cli import UserError
from wellfno.device import DEVICE_CHOICES


def add_arguments(p):
    """Solution 02's options on the argparse parser `p`."""
    p.add_argument("--dataset", default=data.EMBEDDED,
                   help="embedded dataset or a Well dataset name")
    p.add_argument("--data-dir", default=os.environ.get("WELL_DATA", "data"),
                   help="folder that holds datasets/ (default $WELL_DATA or ./data)")
    p.add_argument("--download", action="store_true", help="fetch a missing Well dataset")
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--max-steps", type=int, default=0,
                   help="stop training after this many steps (0: no limit)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--n-steps-input", type=int, default=1, help="frames the model sees")
    p.add_argument("--width", type=int, default=32,
                   help="FNO channels: memory and compute grow with it")
    p.add_argument("--modes", type=int, default=12, help="Fourier modes kept per spatial axis")
    p.add_argument("--device", choices=DEVICE_CHOICES, default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="runs/baseline", help="output folder")
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt")
    p.add_argument("--profile", action="store_true",
                   help="trace the last steps of a --max-steps run (default 12)")
    p.add_argument("--profile-warmup", type=int, default=2, help="steps traced, then thrown away")
    p.add_argument("--profile-active", type=int, default=5, help="steps recorded into the trace")
    p.add_argument("--profile-memory", action="store_true", help="also record tensor allocations")
    p.add_argument("--with-stack", action="store_true", help="also record Python stacks (slower)")
    p.add_argument("--num-workers", type=int, default=0,
                   help="DataLoader worker processes (0: load in this process)")
    p.add_argument("--prefetch-factor", type=int, default=None,
                   help="batches each worker loads ahead (torch: 2)")
    p.add_argument("--persistent-workers", action="store_true",
                   help="keep the workers from one epoch to the next")
    p.add_argument("--pin-memory", action=argparse.BooleanOptionalAction,
                   help="batches in page-locked memory: faster copies to a GPU (default: on a GPU)")
    p.add_argument("--fast-reader", action="store_true",
                   help="wellfno.fastwell: WellDataset's samples, read faster")


def check_arguments(args):
    """Solution 02's checks of its loader options and 01's --profile window (sets profile_wait)."""
    if args.num_workers < 0 or (args.prefetch_factor is not None and args.prefetch_factor < 1):
        raise UserError("--num-workers must be 0 or more and --prefetch-factor at least 1")
    if args.num_workers == 0 and (args.prefetch_factor is not None or args.persistent_workers):
        print("note: --prefetch-factor and --persistent-workers act on worker processes: ignored "
              "with --num-workers 0")
    # wait out the first steps: they pay one-time costs (allocator, FFT plans, loader start)
    args.profile_wait = 0  # without --profile there is no window to wait for
    if args.profile:
        args.max_steps = args.max_steps or 12
        args.profile_wait = args.max_steps - args.profile_warmup - args.profile_active
        if args.profile_wait < 0 or args.profile_warmup < 0 or args.profile_active < 1:
            raise UserError("--profile needs --max-steps >= --profile-warmup + --profile-active "
                            "(>= 1)")


def check_modes(modes, grid):
    """Solution 10's check of --modes against a frame's grid (solutions 12 on call it here)."""
    if modes > min(grid):  # neuralop keeps modes/2 frequencies each side of 0; a grid has N/2
        raise UserError(f"--modes {modes} is more than the {'x'.join(map(str, grid))} grid "
                        f"holds: use --modes {min(grid)} or fewer")


def check_run_arguments(args):
    """The numbers and combinations of a training run's own options (--nvtx, --layers,
    --log-every, --timeout, --eval-only): solution 10's statements (tests/test_drift.py checks
    it), called by the solutions from solution 14 on."""
    if args.nvtx and args.profile:
        raise UserError("--nvtx hands the ranges to Nsight Systems or rocprofv3, --profile to "
                        "torch.profiler: use one at a time")
    for name in ("epochs", "batch_size", "n_steps_input", "width", "modes", "log_every", "layers"):
        if getattr(args, name) < 1:
            raise UserError(f"--{name.replace('_', '-')} must be at least 1")
    if args.max_steps < 0 or not 0 < args.lr < float("inf") or not 0 <= args.seed < 2**63:
        raise UserError("--max-steps must be 0 or more, --lr a positive number, --seed from 0 to "
                        "2**63-1")
    if not 0 < args.timeout < float("inf"):
        raise UserError("--timeout must be a positive number of seconds")
    if args.eval_only and args.profile:
        raise UserError("--profile traces training steps: drop it with --eval-only")
