"""wellfno: the code the course's steps share, so that each solution's diff shows one idea.

You need not read it all. Each module below belongs to the step that teaches it: read it when you
get there (that exercise's README links it). `python -m wellfno.NAME` runs the ones that are tools.

Step 00, the baseline (fno.py; exercises/00_explore_the_data.ipynb)
    grayscott          the embedded dataset: Gray-Scott reaction-diffusion in The Well's format
    data               find, check and load a dataset of The Well (its folder and stats.yaml)
    model              the FNO (neuraloperator's), predicting the change to the next frame
    rollout            autoregressive rollout, VRMSE, the persistence baseline to beat
    plots              the rollout figure: reference, prediction, error
    memory             will a training step fit? an estimate before the first step (more: 12)
    device             which device and which communication backend (backend: 05; synchronize: 08)
Step 01, profiling: nothing here (its tools are in profiling/)
Step 02, data pipeline
    fastwell           a faster reader: WellDataset's samples, bit for bit, without its overhead
Step 03, affinity: nothing here (its tools are in affinity/)
Step 04, distributed statistics (stats.py)
    moments            mergeable moments in float64: the arithmetic alone, no files
    stats              dataset statistics streamed over files and ranks; writes stats.yaml
Step 05, data parallelism (DDP)
    complex_ddp_check  why the FNO's complex weights are held as real numbers under DDP, and the
                       check that DDP averages them right (the day-0 GPU check runs it)
Step 06, exact metrics
    ranks              validation and metrics over ranks, samples left out
Step 07, failures
    watchdog           when one rank fails, every rank stops within seconds; one line names it
Step 08, host syncs: only device.synchronize (above)
Step 09, mixed precision
    amp                can this device run bf16 or fp16, and the FFTs kept in float32
Step 10, FLOPs and MFU
    flops              FLOPs per sample, FLOP/s, and MFU against the device's peak
Step 11, compile
    toolchain          is the compiler torch.compile needs installed? (python -m wellfno.toolchain)
Step 12, checkpointing
    checkpointing      each FNO block recomputed in the backward instead of kept
Step 13, domain parallelism
    domain             one sample's grid split across ranks, exact against one rank
    slabs              each rank reads only its rows of every frame (HDF5 hyperslabs)
    domain_check       your distributed spectral convolution checked against neuralop's
Step 14, long rollouts
    unrolled           training on the model's own K-step rollout; input noise
    evaluate           a finished run scored as The Well reports it (python -m wellfno.evaluate)

Plumbing: every step uses it, no step is about it
    cli                one-line `error:` messages instead of tracebacks; files written atomically
    options            the command-line options of fno.py, 01 and 02, shared from step 03 on
    launch             rank and world size from torchrun or srun (steps 04 and 05 read it)
    progress           the training loop's progress bar
    wellformat         The Well's HDF5 layout: writing its files, listing a split's files

Each module's docstring says more; DESIGN.md ("One line per module") names its functions.
"""
