"""What torch.compile sees of the course's model (issue 40, part 3, item 6).

The spectral convolutions' complex part (FFTs, the complex weights' views, their product) stays
out of the compiled graphs: Inductor's CUDA path for it has open bugs (wellfno.model's
EagerSpectralConv says which). Checked with a backend that records every graph Dynamo hands
over and runs it as traced (no Inductor, seconds on a CPU), on the device the tests have: the
model keeps the part out on every device, so a CPU run shows the graphs a GPU compiles.
"""
from __future__ import annotations

import pytest
import torch
from neuralop.models import FNO

from wellfno.model import EagerSpectralConv, NextFrameFNO

CHANNELS, FRAMES, GRID = 2, 2, (16, 12)


def model(**options):
    torch.manual_seed(0)
    stats = {k: torch.rand(CHANNELS) + 0.5 for k in ("mean", "std", "mean_delta", "std_delta")}
    return NextFrameFNO(CHANNELS, FRAMES, stats, resolution=GRID, modes=4, width=8, layers=2,
                        **options)


def complex_nodes(graph: torch.fx.GraphModule) -> list[str]:
    """The graph's nodes that are complex: an FFT, or a value Dynamo traced as a complex tensor."""
    found = []
    for node in graph.graph.nodes:
        value = node.meta.get("example_value")
        values = value if isinstance(value, (tuple, list)) else [value]
        if "fft" in str(node.target) or "complex" in str(node.target) or any(
                isinstance(v, torch.Tensor) and v.is_complex() for v in values):
            found.append(f"{node.op} {node.target}")
    return found


@pytest.mark.parametrize("real_weights", [True, False])
def test_no_complex_op_reaches_a_compiled_graph(real_weights):
    torch._dynamo.reset()
    fno = model(real_weights=real_weights)
    graphs = []

    def recording_backend(graph, example_inputs):
        graphs.append(graph)
        return graph.forward  # run as traced: what reached the compiler is what is checked

    x = torch.randn(3, CHANNELS * FRAMES, *GRID, requires_grad=True)
    compiled = torch.compile(fno, backend=recording_backend)
    out = compiled(x)
    out.sum().backward()  # the backward runs through the eager convolutions too
    assert graphs, "Dynamo compiled nothing: the check would pass vacuously"
    convs = sum("conv1d" in str(n.target) for g in graphs for n in g.graph.nodes)
    assert convs >= 2 * 2  # each block's channel MLP (2 conv1d): the pointwise work is compiled
    assert [node for g in graphs for node in complex_nodes(g)] == []
    eager = fno(x)
    assert torch.equal(out, eager)  # the eager spectral convolutions: the same numbers
    torch._dynamo.reset()


def test_the_eager_spectral_conv_is_neuralops():
    """The same state_dict keys and, loaded into neuralop's own FNO (SpectralConv), the same
    output: EagerSpectralConv changes what compile sees, nothing else."""
    ours = model(real_weights=False)
    assert all(type(conv) is EagerSpectralConv for conv in ours.fno.fno_blocks.convs)
    plain = FNO(n_modes=(4, 4), in_channels=CHANNELS * FRAMES, out_channels=CHANNELS,
                hidden_channels=8, n_layers=2)
    state = {k: v for k, v in ours.fno.state_dict().items() if k != "_metadata"}
    loaded = plain.load_state_dict(state, strict=False)
    assert loaded.missing_keys == [] and loaded.unexpected_keys == []
    x = torch.randn(2, CHANNELS * FRAMES, *GRID)
    assert torch.equal(plain(x), ours.fno(x))
