"""A process group that treats complex tensors as ProcessGroupNCCL does, on the CPU (over gloo).

NCCL (RCCL on AMD) has no complex type. ProcessGroupNCCL all-reduces and broadcasts a complex
tensor through its real view, and the view is what the collective hands back as its result
(`Work.result()`, the future's value): torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp,
`allreduce` and `broadcast`: `if (tensor.is_complex()) { tensor = at::view_as_real(tensor); }`
before the collective on `tensor` (pytorch/pytorch#121045, torch 2.3 on; before it NCCL refused
complex tensors outright: pytorch/pytorch#71613). DDP's reducer copies that result into the
gradients; before pytorch/pytorch#166863 (Nov 2025) it did so with the complex parameters' sizes
and strides, so over NCCL the averaged gradients of complex parameters come out wrong
(pytorch/pytorch#158753: "the imaginary component of the gradient is always zero").

gloo does neither: torch 2.5's gloo refuses complex tensors ("Invalid scalar type"), newer gloo
reduces them as they are and returns them complex. This group runs gloo underneath and does what
NCCL does on top, so that a CPU run shows what a GPU run over NCCL would: `2 ranks x b == 1 rank x
2b` holds only where the program's DDP is right for NCCL on the torch under test.

What it does not emulate: NCCL's device rule (CUDA tensors only), its streams, its other
collectives' complex handling (torch.distributed's Python layer views complex tensors as real for
all_gather, all_to_all and reduce_scatter itself, for every backend).
"""
from __future__ import annotations

import datetime

NAME = "nccllike"


def _real(tensors):
    import torch

    return [torch.view_as_real(t) if t.is_complex() else t for t in tensors]


def _group_class():
    import sys

    import torch.distributed as dist
    from torch._C import _distributed_c10d as c10d  # the collectives' options classes

    class NcclLikeGroup(dist.ProcessGroup):
        """gloo underneath; allreduce and broadcast of complex tensors as NCCL does them."""

        def __init__(self, store, rank: int, size: int, timeout: datetime.timedelta):
            super().__init__(rank, size)
            self.gloo = dist.ProcessGroupGloo(store, rank, size, timeout)
            # the tests look for this line: a seam that did not load must not pass for one
            print(f"nccl-like seam: rank {rank} of {size} in a {NAME} group", file=sys.stderr,
                  flush=True)

        def getBackendName(self):  # noqa: N802 (torch's name)
            return NAME

        # NCCL's two: the collective runs on the real view, and the view is its result
        def allreduce(self, tensors, opts=None):
            return self.gloo.allreduce(_real(tensors), _opts(opts, c10d.AllreduceOptions))

        def broadcast(self, tensors, opts=None):
            return self.gloo.broadcast(_real(tensors), _opts(opts, c10d.BroadcastOptions))

        # the rest as gloo does them
        def allreduce_coalesced(self, tensors, opts=None):
            return self.gloo.allreduce_coalesced(
                _real(tensors), _opts(opts, c10d.AllreduceCoalescedOptions))

        def allgather(self, output_tensors, input_tensors, opts=None):
            return self.gloo.allgather(output_tensors, input_tensors,
                                       _opts(opts, c10d.AllgatherOptions))

        def _allgather_base(self, output, input, opts=None):
            return self.gloo._allgather_base(output, input, _opts(opts, c10d.AllgatherOptions))

        def gather(self, output_tensors, input_tensors, opts=None):
            return self.gloo.gather(output_tensors, input_tensors, _opts(opts, c10d.GatherOptions))

        def scatter(self, output_tensors, input_tensors, opts=None):
            return self.gloo.scatter(output_tensors, input_tensors,
                                     _opts(opts, c10d.ScatterOptions))

        def reduce(self, tensors, opts=None):
            return self.gloo.reduce(_real(tensors), _opts(opts, c10d.ReduceOptions))

        def reduce_scatter(self, output_tensors, input_tensors, opts=None):
            return self.gloo.reduce_scatter(output_tensors, input_tensors,
                                            _opts(opts, c10d.ReduceScatterOptions))

        def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
            return self.gloo.alltoall_base(output, input, output_split_sizes, input_split_sizes,
                                           _opts(opts, c10d.AllToAllOptions))

        def alltoall(self, output_tensors, input_tensors, opts=None):
            return self.gloo.alltoall(output_tensors, input_tensors,
                                      _opts(opts, c10d.AllToAllOptions))

        def barrier(self, opts=None):
            return self.gloo.barrier(_opts(opts, c10d.BarrierOptions))

        def monitored_barrier(self, timeout=None, wait_all_ranks=False):
            return self.gloo.monitored_barrier(timeout, wait_all_ranks)

        def send(self, tensors, dst, tag):
            return self.gloo.send(tensors, dst, tag)

        def recv(self, tensors, src, tag):
            return self.gloo.recv(tensors, src, tag)

        def recv_anysource(self, tensors, tag):
            return self.gloo.recv_anysource(tensors, tag)

    return NcclLikeGroup


def _opts(opts, kind):
    return opts if opts is not None else kind()


def create(store, rank, size, timeout):
    return _group_class()(store, rank, size, timeout)


def install():
    """Register `nccllike` and make gloo process groups `nccllike` ones."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    dist.Backend.register_backend(NAME, create, devices=["cpu"])
    init = distributed_c10d.init_process_group

    def init_process_group(backend=None, *args, **kwargs):
        if backend in (None, "gloo", "cpu:gloo"):
            backend = NAME
        return init(backend, *args, **kwargs)

    distributed_c10d.init_process_group = init_process_group
    dist.init_process_group = init_process_group
