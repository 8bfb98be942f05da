"""The device and links the planner's alpha-beta time model assumes (Ascend 910B by default).

The numbers are public figures, not measurements made here (no Ascend chip is reachable from this repo's
test machines); override them per run (`mindvl plan --device-tflops ... --link-gbps ...`):

  peak_tflops 313       FP16/BF16 dense peak. Huawei quotes 320 TFLOP/s FP16 for the Ascend 910 (Hot Chips
                        31, 2019) and ~313 TFLOP/s is the figure commonly given for the 910B; we take 313.
  efficiency 0.45       achieved fraction of peak for Transformer matmuls (model FLOP utilisation); an
                        assumption in the range MindSpore/Megatron reports for large Transformers (40-55 %).
  memory_gb 64          HBM2e per 910B card (64 GB).
  intra_node_gbps 196   HCCS inside an 8-card node: 7 links x 28 GB/s = 196 GB/s per card, the 910B's quoted
                        full-mesh figure (GB/s, one direction).
  inter_node_gbps 25    RoCE between nodes: one 200 Gb/s port per card = 25 GB/s.
  devices_per_node 8    Atlas 800T A2 servers hold 8 cards.
  alpha_us 10 / 20      latency per collective step inside / across nodes (typical HCCL small-message times).
"""
from dataclasses import dataclass


@dataclass
class Hardware:
    name: str = "Ascend 910B"
    peak_tflops: float = 313.0
    efficiency: float = 0.45
    memory_gb: float = 64.0
    intra_node_gbps: float = 196.0  # GB/s (bytes), one direction, per card
    inter_node_gbps: float = 25.0
    devices_per_node: int = 8
    intra_alpha_us: float = 10.0
    inter_alpha_us: float = 20.0
    # bytes the backend keeps per byte of the planner's activation accounting (what backward needs, buffers
    # reused, as an accelerator compiler does): 1 on Ascend; MindSpore 2.10's CPU executor measured ~4.4
    # (benchmarks/activation_memory.py)
    activation_overhead: float = 1.0

    @property
    def flops(self) -> float:
        """Achieved FLOP/s per device."""
        return self.peak_tflops * 1e12 * self.efficiency

    def link(self, group: int, stride: int = 1):
        """(alpha seconds, bandwidth bytes/s) of a collective over `group` ranks spaced `stride` apart: inside
        a node when the group's span fits in one, otherwise the inter-node link bounds the ring."""
        if group * stride <= self.devices_per_node:
            return self.intra_alpha_us * 1e-6, self.intra_node_gbps * 1e9
        return self.inter_alpha_us * 1e-6, self.inter_node_gbps * 1e9
