"""Each check-your-work failure says what is wrong and names the task that fixes it (issue 20, 6).

A participant who runs exercise NN's check on the script of the step before (nothing of the
exercise done yet) must read, for every failing check, one sentence ending in
`(exercise NN, task N)` (tests/checks.py), and no dump of tensors, arrays, dicts or a traceback.
Runs each check with the README's arguments (all 14 in one pytest process, below), with
`--script` = the unchanged previous step, on the
quick checks only (`-m "not slow"`, so each run takes seconds), or, where a check-your-work file
has no quick check that the previous step fails, a few cheap slow ones picked by name. Adding an
exercise: one line in CASES (its check, the previous step's script, its number, which checks).
PLANTED: mistakes planted in a copy of a correct script, each of which must fail its exercise's
checks with a sentence naming the task that fixes it (and what is wrong).
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.checks import TASK
from tests.conftest import REPO
from tests.test_stats_distributed import ANSWERS

# exercise 12's checks, all of them on two runs of the script (the flag recomputes the blocks and
# nothing else; the same gradients, less kept; the same training)
CHECKS_12 = "run_again or keeps_less or trains_the_same"
# (check-your-work test file, the unchanged previous step's script, the exercise of its tasks,
#  the checks to run: None for the quick ones, else a -k expression picking a few cheap slow ones
#  where the file has no quick check that the previous step fails)
CASES = [
    ("tests/test_01_profiling.py", "fno.py", "01", None),
    ("tests/test_02_data_pipeline.py", "solutions/01_profiling/fno.py", "02", None),
    ("tests/test_03_affinity_solution.py", "solutions/02_data_pipeline/fno.py", "03", None),
    ("tests/test_stats_distributed.py", "exercises/04_distributed_stats/stats_parallel.py", "04",
     None),
    ("tests/test_05_ddp.py", "solutions/03_affinity/fno.py", "05",
     "incomplete_launcher or nccl_without_gpu"),
    ("tests/test_06_exact_metrics.py", "solutions/05_ddp/fno.py", "06",
     "eval_only_without_checkpoint or split_smaller"),
    # with the two-rank check a rank's death fails (it passed the step-06 script before issue 35)
    ("tests/test_07_failures.py", "solutions/06_exact_metrics/fno.py", "07",
     "timeout_must_be or (failing_rank and die)"),
    # with the checks of the runs the quick check shares (the issue-35 case: argparse's exit 2)
    ("tests/test_08_host_syncs.py", "solutions/07_failures/fno.py", "08",
     "log_every_changes or log_every_zero"),
    ("tests/test_09_mixed_precision.py", "solutions/08_host_syncs/fno.py", "09", "peak_memory"),
    ("tests/test_10_mfu.py", "solutions/09_mixed_precision/fno.py", "10", None),
    ("tests/test_11_compile.py", "solutions/10_mfu/fno.py", "11", None),
    ("tests/test_12_checkpointing.py", "solutions/11_compile/fno.py", "12", CHECKS_12),
    ("tests/test_13_domain_parallel.py", "solutions/12_checkpointing/fno.py", "13", None),
    ("tests/test_14_long_rollouts.py", "solutions/13_domain_parallel/fno.py", "14", None),
]
# Mistakes planted in a copy of the exercise's solution (in a folder of its own, beside copies of
# the files it imports from its folder; for 04 the finished starter): (name, check file, the
# solution, [(a text of it, the mistake in its place), or (a file beside it, its text, the
# mistake)], exercise, -k of the checks that must catch it, the tasks a sentence may name, a word
# it must say). `-k 05-` runs one exercise's.
SOLUTION_14 = "solutions/14_long_rollouts/fno.py"
PER_RANK_NOISE = '''

class {name}(unrolled.RolloutLoss):  # the mistake: each rank draws noise for its own samples
    def add_noise(self, x):
        if not self.noise:
            return x
        frames = x[:, :self.frame_channels]
        return torch.cat([frames + self.noise * torch.randn_like(frames),
                          x[:, self.frame_channels:]], dim=1)
'''
SOLUTION_11 = "solutions/11_compile/fno.py"
COMPILE_11 = ("    train_model = torch.compile(ddp_model) if args.compile else ddp_model  "
              "# compiles at first call")
SOLUTION_13 = "solutions/13_domain_parallel/fno.py"
# the VRMSE of each rank's slab (step 06's, on the rows it holds), not of the whole frame
SLAB_VRMSE = """


def slab_vrmse(inputs, true, pred, slab):  # the mistake: the slab's own VRMSE
    return rollout.step_vrmse(inputs, true, pred)


domain.slab_step_vrmse = slab_vrmse
"""
SOLUTION_12 = "solutions/12_checkpointing/fno.py"
CHECKPOINT_12 = "checkpoint(block_forward, x, index, output_shape, use_reentrant=False)"
SOLUTION_05 = "solutions/05_ddp/fno.py"
SAVE_05 = """        if env.rank == 0:  # one writer; the others hold the same model
            atomic_torch_save(checkpoint, dict(model=model.state_dict(), epoch=epoch, step=step,
                                               optimizer=optimizer.state_dict(), history=history))
"""
SOLUTION_01 = "solutions/01_profiling/fno.py"
SOLUTION_02 = "solutions/02_data_pipeline/fno.py"
SOLUTION_03 = "solutions/03_affinity/fno.py"
SOLUTION_06 = "solutions/06_exact_metrics/fno.py"
SOLUTION_07 = "solutions/07_failures/fno.py"
SOLUTION_08 = "solutions/08_host_syncs/fno.py"
SOLUTION_09 = "solutions/09_mixed_precision/fno.py"
SOLUTION_10 = "solutions/10_mfu/fno.py"
# the checks of exercise 09 that compare fp16 with float32 (fp16: every CPU autocasts it in-process)
FP16_09 = "tracks_float32 and fp16"
# Exercise 04's participant finishes the starter (tests/test_stats_distributed.py's ANSWERS); a
# mistake there is one answer written wrong, the others right.
STARTER_04 = "exercises/04_distributed_stats/stats_parallel.py"
SPLIT_04, MERGE_04, GATHER_04 = ANSWERS


def answered(stub: str, wrong: str) -> list[tuple[str, str]]:
    """The starter's stubs answered as ANSWERS does, `stub`'s with `wrong`."""
    return [(each, wrong if each == stub else answer) for each, answer in ANSWERS.items()]


PLANTED = [
    # --- exercise 01: the profiled window
    # no wait: the window starts at step 0 and ends steps before the run does
    ("01-no-wait", "tests/test_01_profiling.py", SOLUTION_01,
     [("        args.profile_wait = args.max_steps - args.profile_warmup - args.profile_active",
       "        args.profile_wait = 0")], "01", "chrome_json", {3}, "wait"),
    # the copy to the device not in a range of its own (inside the forward's)
    ("01-copy-not-labelled", "tests/test_01_profiling.py", SOLUTION_01,
     [('        with record_function("h2d_copy"):\n            x, y = data.batch_to_model(batch, '
       'device)\n        with record_function("forward"):\n',
       '        with record_function("forward"):\n            x, y = data.batch_to_model(batch, '
       'device)\n')], "01", "labelled_ranges", {1}, "host-to-device"),
    # the table sorted by total CPU time (each range's children counted in it), not self
    ("01-sorted-by-total", "tests/test_01_profiling.py", SOLUTION_01,
     [("prof.key_averages().table(sort_by=sort_by,",
       'prof.key_averages().table(sort_by="cpu_time_total",')], "01", "key_averages", {5},
     "self_cpu_time_total"),
    # --- exercise 03: binding ranks and workers
    # the workers not given the rank's cores: each runs on all of them
    ("03-no-worker-init-fn", "tests/test_03_affinity_solution.py", SOLUTION_03,
     [("        if cpus:  # each worker on its own slice of the rank's cores, not all on one\n"
       "            loader_options[\"worker_init_fn\"] = worker_init_fn(cpus, "
       "report=args.report_workers)\n", "")], "03", "workers_are_spread", {3}, "worker_init_fn"),
    # the rank reports its CPUs before it is bound to its own
    ("03-report-before-binding", "tests/test_03_affinity_solution.py", SOLUTION_03,
     [("    cpus = None\n", "    cpus = None\n    print(report_line(device=device), flush=True)\n"),
      ("    print(report_line(device=device), flush=True)  # host, rank", "    # host, rank")], "03",
     "own_cores", {3}, "bind_this_rank"),
    # --bind without its choices: an unknown mode gets past argparse
    ("03-bind-without-choices", "tests/test_03_affinity_solution.py", SOLUTION_03,
     [('p.add_argument("--bind", choices=["exclusive", "node", "core-complex", "none"],',
       'p.add_argument("--bind",')], "03", "unknown_binding", {3}, "choices"),
    # --- exercise 02: the loader options
    # the copies left blocking: pin_memory pins the batches, and nothing copies them asynchronously
    ("02-no-non-blocking", "tests/test_02_data_pipeline.py", SOLUTION_02,
     [("            x, y = data.batch_to_model(batch, device, non_blocking=True)",
       "            x, y = data.batch_to_model(batch, device)"),
      ("        x, y = data.batch_to_model(batch, device, non_blocking=True)",
       "        x, y = data.batch_to_model(batch, device)")], "02",
     "non_blocking_copy", {3}, "non_blocking"),
    # prefetch_factor and persistent_workers passed to DataLoader with --num-workers 0 too
    ("02-worker-options-without-workers", "tests/test_02_data_pipeline.py", SOLUTION_02,
     [("    if args.num_workers:  # DataLoader refuses these without workers\n"
       "        loader_options.update(prefetch_factor=args.prefetch_factor,\n"
       "                              persistent_workers=args.persistent_workers)\n",
       "    loader_options.update(prefetch_factor=args.prefetch_factor,\n"
       "                          persistent_workers=args.persistent_workers)\n")], "02",
     "worker_options_without_workers", {2}, "only with workers"),
    # --num-workers -1 not refused: it fails later, for another reason (here: the empty folder)
    ("02-negative-workers-accepted", "tests/test_02_data_pipeline.py", SOLUTION_02,
     [("    if args.num_workers < 0 or (args.prefetch_factor is not None and "
       "args.prefetch_factor < 1):",
       "    if args.prefetch_factor is not None and args.prefetch_factor < 1:")], "02",
     "impossible_values", {2}, "--num-workers"),
    # --- exercise 04: the starter finished with one answer wrong
    # the two means averaged as if the sides held as many values each
    ("04-means-averaged", "tests/test_stats_distributed.py", STARTER_04,
     answered(MERGE_04, ANSWERS[MERGE_04].replace("ma + d * share", "(ma + mb) / 2")), "04",
     "merge", {4}, "chan_merge"),
    # the merged M2 given Bessel's n / (n - 1), the sample variance's correction, not the sum's
    ("04-unbiased-m2", "tests/test_stats_distributed.py", STARTER_04,
     answered(MERGE_04, ANSWERS[MERGE_04].replace("d * d * na * share",
                                                  "d * d * na * share * n / (n - 1)")),
     "04", "merge", {4}, "chan_merge"),
    # equal shares of n_items // world_size: the remainder's items read by no rank
    ("04-remainder-dropped", "tests/test_stats_distributed.py", STARTER_04,
     answered(SPLIT_04, "    share = n_items // world_size\n"
              "    return [(rank * share, (rank + 1) * share) for rank in range(world_size)]\n"),
     "04", "split", {3}, "split_items"),
    # no gather: rank 0 writes its own share's statistics as the dataset's
    ("04-rank-0-only", "tests/test_stats_distributed.py", STARTER_04,
     answered(GATHER_04, GATHER_04), "04", "world_sizes_equal_serial and srun-2", {5},
     "every rank"),
    # --- exercise 05: data-parallel training
    # the DistributedSampler made but not given to the DataLoader: every rank shuffles all samples
    ("05-sampler-not-passed", "tests/test_05_ddp.py", SOLUTION_05,
     [("batch_size=args.batch_size, sampler=train_sampler,",
       "batch_size=args.batch_size, shuffle=True,")], "05",
     "each_rank_trains", {2}, "DistributedSampler"),
    # every epoch the same shuffle
    ("05-no-set-epoch", "tests/test_05_ddp.py", SOLUTION_05,
     [("        train_sampler.set_epoch(epoch)", "        pass")], "05",
     "each_rank_trains", {2}, "set_epoch"),
    # each rank's sampler seeded differently: the ranks' shuffles differ, their shares overlap
    ("05-seed-per-rank", "tests/test_05_ddp.py", SOLUTION_05,
     [("shuffle=True, seed=args.seed)", "shuffle=True, seed=args.seed + env.rank)")], "05",
     "each_rank_trains", {2}, "DistributedSampler"),
    # the model not wrapped: each rank steps on its own gradients
    ("05-not-wrapped", "tests/test_05_ddp.py", SOLUTION_05,
     [("    ddp_model = DistributedDataParallel(model) if env.is_distributed else model",
       "    ddp_model = model")], "05",
     "two_ranks_of_b", {3}, "DistributedDataParallel"),
    # every rank saves the checkpoint (the same file, written by two processes)
    ("05-every-rank-saves", "tests/test_05_ddp.py", SOLUTION_05,
     [(SAVE_05, SAVE_05.split("\n", 1)[1].replace("    ", "", 1).replace("\n    ", "\n"))],
     "05", "each_rank_trains", {4}, "rank 0 alone writes"),
    # the global batch reported as one rank's
    ("05-global-batch-of-a-rank", "tests/test_05_ddp.py", SOLUTION_05,
     [("    global_batch = args.batch_size * env.world_size", "    global_batch = args.batch_size")],
     "05", "each_rank_trains", {5}, "global_batch_size"),
    # --- exercise 06: exact metrics over the ranks
    # validation split by a DistributedSampler: padded with repeats where the ranks do not divide it
    ("06-valid-padded", "tests/test_06_exact_metrics.py", SOLUTION_06,
     [('sampler=range(env.rank, len(splits["valid"]), env.world_size),',
       'sampler=torch.utils.data.DistributedSampler(splits["valid"], env.world_size, env.rank, '
       'shuffle=False),')], "06", "each_sample_counts_once", {1}, "validation"),
    # the training sampler pads instead of leaving the remainder out
    ("06-no-drop-last", "tests/test_06_exact_metrics.py", SOLUTION_06,
     [("shuffle=True, seed=args.seed, drop_last=True)", "shuffle=True, seed=args.seed)")], "06",
     "each_sample_counts_once", {2}, "drop_last"),
    # each rank's validation mean, rank 0's reported: not the job's
    ("06-valid-not-reduced", "tests/test_06_exact_metrics.py", SOLUTION_06,
     [("    if dist.is_initialized():\n        dist.all_reduce(total)\n", "")], "06",
     "eval_only_equal", {1}, "sums and counts"),
    # rank 0's epoch row as the job's
    ("06-no-over-ranks", "tests/test_06_exact_metrics.py", SOLUTION_06,
     [("        row = over_ranks(row, device)\n", "")], "06",
     "each_sample_counts_once", {2}, "over_ranks"),
    # --- exercise 07: failures
    # --timeout 0 let through (only negative refused)
    ("07-timeout-zero-accepted", "tests/test_07_failures.py", SOLUTION_07,
     [('    if not 0 < args.timeout < float("inf"):', "    if args.timeout < 0:")], "07",
     "timeout_must_be", {1}, "positive"),
    # no watchdog: rank 0 stops on gloo's own error, which names no rank
    ("07-no-watchdog", "tests/test_07_failures.py", SOLUTION_07,
     [("        with Watchdog(env.rank, env.world_size) as watchdog:  # one failed rank ends all, "
       "in seconds\n            train(args, env, backend, device)\n            "
       "watchdog.wait_for_all()", "        train(args, env, backend, device)\n        "
       "dist.barrier()")], "07", "failing_rank and die", {2}, "rank 1"),
    # the failed rendezvous not caught: torch's traceback instead of one line naming the rank
    ("07-rendezvous-not-caught", "tests/test_07_failures.py", SOLUTION_07,
     [("    except Exception as err:  # noqa: BLE001 - e.g. a rank never arrived\n",
       "    except KeyboardInterrupt as err:\n")], "07", "cannot_join", {1}, "rendezvous"),
    # --- exercise 08: host syncs
    # the loss read back into a Python float every step
    ("08-item-every-step", "tests/test_08_host_syncs.py", SOLUTION_08,
     [("        loss_sum += loss.detach() * len(x)", "        loss_sum += loss.item() * len(x)")],
     "08", "no_host_sync", {1}, "host syncs"),
    # the progress bar shown the step's loss, read back every step
    ("08-progress-bar-every-step", "tests/test_08_host_syncs.py", SOLUTION_08,
     [("        samples, steps = samples + len(x), steps + 1\n",
       "        samples, steps = samples + len(x), steps + 1\n"
       "        bar.set_postfix(loss=f\"{loss.item():.4f}\", refresh=False)\n")],
     "08", "no_host_sync", {1}, "host syncs"),
    # logged at steps 1, 1 + log_every, ...: --log-every 1000 still logs (and reads) step 1
    ("08-logs-the-first-step", "tests/test_08_host_syncs.py", SOLUTION_08,
     [("        if steps % log_every == 0:", "        if (steps - 1) % log_every == 0:")],
     "08", "log_every_changes", {1}, "loss_log"),
    # --- exercise 09: mixed precision
    # autocast around the backward pass, not the forward: the forward runs in float32
    ("09-autocast-around-backward", "tests/test_09_mixed_precision.py", SOLUTION_09,
     [('        with record_function("forward"), autocast():\n',
       '        with record_function("forward"):\n'),
      ('        with record_function("backward"):\n',
       '        with record_function("backward"), autocast():\n')], "09", FP16_09, {1},
     "autocast"),
    # the float32 pre-hooks never registered: a GPU's FFTs get bf16 (a CPU's autocast hides it)
    ("09-no-float32-hook", "tests/test_09_mixed_precision.py", SOLUTION_09,
     [("    spectral_convs_in_float32(model.fno)\n", "")], "09", "ffts_get_float32", {2},
     "float32"),
    # ... registered on the skip connections beside the spectral convolutions
    ("09-hook-on-the-skips", "tests/test_09_mixed_precision.py", SOLUTION_09,
     [("    for conv in fno.fno_blocks.convs:", "    for conv in fno.fno_blocks.fno_skips:")],
     "09", "ffts_get_float32", {2}, "float32"),
    # fp16 without GradScaler: loss.backward() and optimizer.step() as in float32
    ("09-scaler-unused", "tests/test_09_mixed_precision.py", SOLUTION_09,
     [("            scaler.scale(loss).backward()", "            loss.backward()"),
      ("            scaler.step(optimizer)  # optimizer.step(); fp16: unscale first, skip on "
       "inf/NaN\n            scaler.update()\n", "            optimizer.step()\n")], "09",
     "grad_scaler", {1}, "GradScaler"),
    # the GradScaler's state not saved with the checkpoint
    ("09-scaler-not-saved", "tests/test_09_mixed_precision.py", SOLUTION_09,
     [("world_size=env.world_size,\n                                               "
       "scaler=scaler.state_dict()))", "world_size=env.world_size))")], "09", "grad_scaler",
     {1}, "GradScaler"),
    # ... saved, but not loaded on --resume: the resumed run starts from torch's scale again
    ("09-scaler-not-loaded", "tests/test_09_mixed_precision.py", SOLUTION_09,
     [('            scaler.load_state_dict(state.get("scaler", {}))\n', "")], "09",
     "grad_scaler", {1}, "GradScaler"),
    # the peak memory measured but not written into metrics.json
    ("09-no-peak-memory", "tests/test_09_mixed_precision.py", SOLUTION_09,
     [("samples_per_second_excludes=excludes, **peak_memory,",
       "samples_per_second_excludes=excludes,")], "09", "peak_memory", {4}, "peak_memory_bytes"),
    # --- exercise 10: FLOPs and MFU
    # the FLOPs of the forward pass alone, a third of a training step's (flop_count.py, task 1)
    ("10-forward-only-count", "tests/test_10_mfu.py", SOLUTION_10,
     [("flop_count.py", "    def step():\n        loss_fn(model(x), y).backward()\n",
       "    def step():\n        loss_fn(model(x), y)\n")], "10", "how_far", {1}, "backward"),
    # MFU always against the float32 peak, whatever --amp
    ("10-fp32-peak-always", "tests/test_10_mfu.py", SOLUTION_10,
     [("flops.device_peak(device), args.amp,", 'flops.device_peak(device), "none",')], "10",
     "how_far", {1}, "fp16"),
    # --layers parsed and checked, never given to the model
    ("10-layers-not-passed", "tests/test_10_mfu.py", SOLUTION_10,
     [("modes=args.modes, layers=args.layers)", "modes=args.modes)")], "10", "how_far", {3},
     "--layers"),
    # the job's samples/s against one device's peak: MFU N times too high on N ranks
    ("10-peak-of-one-device", "tests/test_10_mfu.py", SOLUTION_10,
     [("args.amp, devices=env.world_size)", "args.amp)")], "10", "two_ranks", {1}, "devices"),
    # --- exercise 11: torch.compile (its quick check: torch.compile's stand-in, no compiling)
    # --compile parsed, printed, timed, but the model trained uncompiled
    ("11-not-compiled", "tests/test_11_compile.py", SOLUTION_11,
     [(COMPILE_11, "    train_model = ddp_model")], "11", "compiled_model", {1}, "torch.compile"),
    # the model compiled in place: validated, rolled out and saved compiled (`_orig_mod.` keys)
    ("11-compiled-in-place", "tests/test_11_compile.py", SOLUTION_11,
     [("    model = model.to(device)\n", "    model = model.to(device)\n    if args.compile:\n"
       "        model = torch.compile(model)\n"), (COMPILE_11, "    train_model = ddp_model")],
     "11", "compiled_model", {1}, "_orig_mod."),
    # validation with the compiled model
    ("11-validates-compiled", "tests/test_11_compile.py", SOLUTION_11,
     [("validate(model, valid_loader, device), left_out",
       "validate(train_model, valid_loader, device), left_out")], "11", "compiled_model", {1},
     "eval mode"),
    # the short last batch kept: a new batch shape, compiled again
    ("11-short-batch-kept", "tests/test_11_compile.py", SOLUTION_11,
     [("drop_last=args.compile, ", "")], "11", "compiled_model", {1}, "drop_last"),
    # compile_seconds timed around the torch.compile call, which compiles nothing yet (microseconds)
    ("11-times-the-compile-call", "tests/test_11_compile.py", SOLUTION_11,
     [(COMPILE_11, "    compiling = time.perf_counter()\n" + COMPILE_11.split("  #")[0]
       + "\n    compile_time = time.perf_counter() - compiling"),
      ('compile_seconds=history[0]["untimed_seconds"] if args.compile and first_epoch == 1\n'
       "        else None,", "compile_seconds=compile_time if args.compile else None,")], "11",
     "compiled_model", {1}, "first step"),
    # --- exercise 12: activation checkpointing
    # --checkpoint-blocks parsed, named in the memory line and metrics.json, but never applied
    ("12-flag-does-nothing", "tests/test_12_checkpointing.py", SOLUTION_12,
     [("        checkpoint_blocks(model.fno)\n", "        pass\n")], "12",
     "run_again or keeps_less", {1}, "FNO blocks"),
    # the lifting layer checkpointed instead of the FNO blocks
    ("12-wrong-layer", "tests/test_12_checkpointing.py", SOLUTION_12,
     [("    blocks = fno.fno_blocks\n", "    blocks = fno.lifting\n"),
      (CHECKPOINT_12, "checkpoint(block_forward, x, use_reentrant=False)")], "12",
     "run_again", {1}, "lifting"),
    # the Hints' recursion: the replaced forward checkpoints itself (not a 1000-frame traceback)
    ("12-recursion", "tests/test_12_checkpointing.py", SOLUTION_12,
     [(CHECKPOINT_12, CHECKPOINT_12.replace("block_forward", "blocks.forward"))], "12",
     CHECKS_12, {1}, "RecursionError"),
    # the reentrant variant, asked for or torch's default (2.13) when use_reentrant is left out:
    # it runs the blocks' forward under no_grad, and the FLOP count's module tracker
    # (wellfno.flops, FlopCounterMode) finds their outputs without a grad_fn
    ("12-reentrant", "tests/test_12_checkpointing.py", SOLUTION_12,
     [(CHECKPOINT_12, CHECKPOINT_12.replace("False", "True"))], "12", CHECKS_12, {1},
     "use_reentrant"),
    ("12-use-reentrant-left-out", "tests/test_12_checkpointing.py", SOLUTION_12,
     [(CHECKPOINT_12, CHECKPOINT_12.replace(", use_reentrant=False", ""))], "12", CHECKS_12, {1},
     "use_reentrant"),
    # --- exercise 13: domain parallelism
    # no DDP comm hook: DDP averages the loss shares' gradients over the group instead of summing
    # them (half the sample's gradient on 2 ranks, which Adam's first step hides in the parameters)
    ("13-no-comm-hook", "tests/test_13_domain_parallel.py", SOLUTION_13,
     [("        ddp_model.register_comm_hook(None, domain.domain_comm_hook(layout.data_size))\n",
       "")], "13", "domain_group_of_2", {4}, "DDP hook"),
    # each rank's loss its slab's mean, not its share of the sample's: twice the gradient on 2
    ("13-loss-per-slab", "tests/test_13_domain_parallel.py", SOLUTION_13,
     [("loss_fn = domain.sample_loss(model.loss, slab)", "loss_fn = model.loss")], "13",
     "domain_group_of_2", {4}, "loss shares"),
    # the rollout VRMSE of each rank's slab, averaged over the group: not the whole frame's
    ("13-vrmse-per-slab", "tests/test_13_domain_parallel.py", SOLUTION_13,
     [("import domain_conv  # exercise 13's tasks 2 and 3 (DomainSpectralConv, split_model): "
       "beside this\n", "import domain_conv\n" + SLAB_VRMSE)], "13", "domain_group_of_2",
     {5}, "VRMSE"),
    # in domain_conv.py: the first axis' kept modes indexed for the slab's rows, not the whole axis
    # it holds after the exchange (one rank: the same; the course's convolution on 3 ranks)
    ("13-modes-of-the-slab", "tests/test_13_domain_parallel.py", SOLUTION_13,
     [("domain_conv.py", "kept_indices(self.slab.n, modes[0], x.device)",
       "kept_indices(x.shape[2], modes[0], x.device)")], "13", "on_2_and_3_ranks", {2},
     "DomainSpectralConv"),
    # a resumed run (on any world size) draws epoch 1's noise and N again in epoch 2
    ("14-no-set-epoch", "tests/test_14_long_rollouts.py", SOLUTION_14,
     [("        rollout_loss.set_epoch(epoch, len(train_loader))", "        pass")], "14",
     "resumed_run", {4}, "set_epoch"),
    # one step's FLOPs for the whole K-step rollout's
    ("14-one-step-flops", "tests/test_14_long_rollouts.py", SOLUTION_14,
     [("counted = unrolled.training_flops_per_sample(model, example, targets, rollout_loss)",
       "counted = flops.training_flops_per_sample(model, example, targets[:, 0], loss_fn)")], "14",
     "flops_are_the_whole", {3}, "FLOPs"),
    # noise drawn per rank with randn_like, in the script's own RolloutLoss (its quick check) ...
    ("14-noise-per-rank", "tests/test_14_long_rollouts.py", SOLUTION_14,
     [("from wellfno.toolchain import check_compiler\n", "from wellfno.toolchain import "
       "check_compiler\n" + PER_RANK_NOISE.format(name="RolloutLoss")),
      ("rollout_loss = unrolled.RolloutLoss(", "rollout_loss = RolloutLoss(")], "14",
     "noise_of_a_sample", {4}, "noise"),
    # ... and under another name, which only training on 2 ranks against 1 shows
    ("14-noise-per-rank-2-ranks", "tests/test_14_long_rollouts.py", SOLUTION_14,
     [("from wellfno.toolchain import check_compiler\n", "from wellfno.toolchain import "
       "check_compiler\n" + PER_RANK_NOISE.format(name="PerRankNoise")),
      ("rollout_loss = unrolled.RolloutLoss(", "rollout_loss = PerRankNoise(")], "14",
     "two_ranks and noise", {4}, "noise"),
]
# Exercises none of whose checks may pass on the previous step's script (a check that passes
# there checks nothing of the exercise; a check of the repository's own code skips with --script).
NONE_MAY_PASS = {"14"}
# Checks that must fail on the previous step's script (a check that passes there checks nothing).
MUST_FAIL = {"07": ["test_a_failing_rank_ends_every_rank_within_seconds[script-die]"],
             "08": ["test_log_every_changes_only_when_numbers_are_read[script]"],
             "13": ["test_your_spectral_convolution_equals_spectral_conv_on_one_rank[script]"]}
# What a dump looks like: a tensor or array repr, a dict or list of values, pytest's introspection,
# a traceback or an exception raised while handling another, argparse's usage.
DUMPS = re.compile(r"tensor\(|array\(|Traceback|^E\s+assert |^E\s+where |\{'|^>\s"
                   r"|During handling of the above exception|^usage: ", re.M)
SUMMARY = re.compile(r"^(FAILED|ERROR) (?P<test>\S+)(?: - (?P<message>.*))?$", re.M)


# The 14 runs in one process, one pytest.main after another: a pytest process per exercise would
# import torch, neuralop and the conftest 14 times (about 3.5 s of CPU each on the 2-core CI VM).
# A check file runs more than once (its step's case and its planted mistakes): each run imports
# the check modules afresh, since exercise 04's picks its script at import from STATS_SCRIPT, which
# conftest.pytest_configure sets from each run's --script (torch and the packages stay imported).
# Each run's report is what a participant's terminal shows (pytest writes it to sys.stdout, here a
# buffer per run).
RUN_EACH = """
import contextlib, io, json, sys
import pytest
reports = []
for args in json.loads(sys.argv[1]):
    for name in [name for name in sys.modules if name.startswith("tests.test_")]:
        del sys.modules[name]
    report = io.StringIO()
    with contextlib.redirect_stdout(report):
        status = pytest.main(args)
    reports.append([int(status), report.getvalue()])
print("\\nREPORTS", json.dumps(reports))  # on a line of its own, after whatever a run printed
"""


def pytest_args(check, previous, chosen) -> list[str]:
    which = ["-m", "not slow and not gpu"] if chosen is None else \
        ["-m", "not gpu and not slurm", "-k", chosen]
    return ["-q", "-p", "no:cacheprovider", "-rfE", *which, "--show-capture=no", check,
            "--script", previous]


def planted(tmp, name, solution, mistakes) -> str:
    """A copy of `solution` in `tmp` with `mistakes` in it: each (a text of it, the mistake in its
    place), or (a file beside it, a text of that file, the mistake), as 10's flop_count.py; each
    text found once, or the file changed under the mistake: plant it again."""
    own = Path(solution).name
    # beside the files the solution imports from its folder (03's binding.py, 10's flop_count.py)
    texts = {sibling.name: sibling.read_text() for sibling in (REPO / solution).parent.glob("*.py")}
    for mistake in mistakes:
        file, correct, wrong = mistake if len(mistake) == 3 else (own, *mistake)
        assert texts[file].count(correct) == 1, f"{name}: {correct!r} is not once in {file}"
        texts[file] = texts[file].replace(correct, wrong)
    folder = tmp / name
    folder.mkdir()
    for file, text in texts.items():
        (folder / (f"{name}.py" if file == own else file)).write_text(text)
    return str(folder / f"{name}.py")


@pytest.fixture(scope="module")
def reports(request, tmp_path_factory) -> dict:
    """exercise (or planted mistake) -> (pytest's exit status, its report) of each case's check
    on the previous step (on the planted copy)."""
    tmp = tmp_path_factory.mktemp("planted")
    # only the cases of the tests selected (`-k 05-`: one exercise's planted mistakes, not all 14
    # steps' runs)
    wanted = {item.callspec.id for item in request.session.items
              if item.module is request.module and hasattr(item, "callspec")}
    cases = [(exercise, pytest_args(check, previous, chosen))
             for check, previous, exercise, chosen in CASES if exercise in wanted]
    cases += [(name, pytest_args(check, planted(tmp, name, solution, mistakes), chosen))
              for name, check, solution, mistakes, _, chosen, _, _ in PLANTED if name in wanted]
    result = subprocess.run([sys.executable, "-c", RUN_EACH, json.dumps([a for _, a in cases])],
                            cwd=REPO, capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, f"the checks' runner failed:\n{result.stderr[-3000:]}"
    runs = json.loads(result.stdout.rsplit("\nREPORTS ", 1)[-1])
    return {name: tuple(run) for (name, _), run in zip(cases, runs)}


def failure_sentences(out: str, where: str, failed: list) -> list[str]:
    """Each failure's own section of a report, checked to be one sentence naming a task, with no
    dump of values."""
    # each failure's own section: the text between its header line and the next one
    sections = re.split(r"^_+ .+ _+$", out.split("short test summary info")[0], flags=re.M)[1:]
    assert len(sections) == len(failed), \
        f"{len(failed)} failures but {len(sections)} sections:\n{out[-2000:]}"
    sentences = []
    for section in sections:
        lines = section.strip().splitlines()
        sentence = "\n".join(line for line in lines if not line.startswith("="))
        assert TASK.search(sentence), f"{where}: a failure names no task:\n{sentence[:1500]}"
        said = [line for line in sentence.splitlines()  # conftest's summary ends the last one
                if line.strip() and not line.startswith("time by kind:")]
        assert len(said) == 1, f"{where}: a failure is not one sentence:\n{sentence[:1500]}"
        assert not DUMPS.search(sentence), f"{where}: a failure dumps values:\n{sentence[:1500]}"
        sentences.append(said[0])
    return sentences


@pytest.mark.slow  # a pytest run per exercise, each running the previous step
@pytest.mark.parametrize("check, previous, exercise, chosen", CASES,
                         ids=[case[2] for case in CASES])
def test_failures_on_the_previous_step_name_their_task(reports, check, previous, exercise, chosen):
    status, out = reports[exercise]
    assert status == 1, (f"{check} on {previous}: expected failures, got exit "
                         f"{status}:\n{out[-2000:]}")
    failed = SUMMARY.findall(out)
    assert failed, f"no FAILED/ERROR lines in:\n{out[-2000:]}"
    for test in MUST_FAIL.get(exercise, []):
        assert any(found[1].endswith("::" + test) for found in failed), \
            f"{check}'s {test} passes on {previous}, which has nothing of exercise {exercise}"
    if exercise in NONE_MAY_PASS:
        passed = re.search(r"(\d+) passed", out.strip().splitlines()[-1])
        assert passed is None, (f"{passed.group(1)} of {check}'s checks pass on {previous}, which "
                                f"has nothing of exercise {exercise}:\n{out[-1500:]}")
    for sentence in failure_sentences(out, f"{check} on {previous}", failed):
        assert f"(exercise {exercise}, task" in sentence, sentence[:1500]


@pytest.mark.slow  # a pytest run per planted mistake, in the same runner as the cases above
@pytest.mark.parametrize("name, check, solution, mistakes, exercise, chosen, tasks, word",
                         PLANTED, ids=[case[0] for case in PLANTED])
def test_planted_mistakes_fail_naming_their_task(reports, name, check, solution, mistakes,
                                                 exercise, chosen, tasks, word):
    status, out = reports[name]
    where = f"{check} -k '{chosen}' on {solution} with the mistake {name}"
    assert status == 1, f"{where}: expected failures, got exit {status}:\n{out[-2000:]}"
    failed = SUMMARY.findall(out)
    assert failed, f"{where}: no FAILED/ERROR lines in:\n{out[-2000:]}"
    for sentence in failure_sentences(out, where, failed):
        named = {number for ex, number in re.findall(r"\(exercise (\d\d), task O?(\d+)\)",
                                                     sentence) if ex == exercise}
        assert named and named <= {str(t) for t in tasks}, \
            f"{where}: the failure names task(s) {sorted(named)}, not {sorted(tasks)}: {sentence}"
        assert word in sentence, f"{where}: the failure does not say '{word}': {sentence}"
