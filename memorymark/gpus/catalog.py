"""The built-in GPU catalog: each GPU's memory, price and peak rates, with where each came from.

Owns `CATALOG`, data only, every figure cited. Must not know torch, name lookup
(memorymark/gpus/lookup.py) or how anything is displayed.
"""

from __future__ import annotations

from memorymark.gpus.record import GPU
from memorymark.units import MIB

# total_bytes: torch.cuda.get_device_properties(i).total_memory on a named machine, or the same
# cudaMemGetInfo total as printed by a PyTorch OOM ("total capacity of X GiB"), by vLLM
# ("total_gpu_memory") or by Ultralytics' select_device ("CUDA:0 (NAME, NMiB)", total_memory /
# 2**20). It moves with the driver, and newer drivers leave less: in 2025-26 logs the L4 went from
# 22693 to 22563 MiB, the A100 40GB from 40514 to 40441, the L40S from 44.52 to 44.39 GiB, the RTX
# 4090 from 23.64 to 23.52 GiB. The newest figure found is used; one known to two decimals of a GiB
# is stored as round(GiB * 1024) MiB (+-5 MiB). nvidia-smi's total is larger and is not used (T4:
# 15360 vs 15095 MiB, RTX 4090: 24564 vs ~24084), nor deviceQuery runs on other drivers.
#   T4        15095 MiB  torch, driver 550.54.15, Colab, 2026-01-19: mryab/efficient-dl-systems
#                        week01_intro/seminar.ipynb @ e632aa89 ("total_memory=15095MB")
#   L4        22563 MiB  torch 2.11.0+cu128, Colab, 2026: pitikorn-pam/sack-train-ml
#                        docs/result.md @ e096d8c4 ("CUDA:0 (NVIDIA L4, 22563MiB)", and its OOM
#                        says 22.03 GiB). Logs with torch 2.5-2.8 (2025) printed 22693MiB; vLLM's
#                        L4 CI said 22.05 GiB (vllm-project/vllm#20214, 2025-06)
#   A10       22600 MiB  22.07 GiB, driver unknown: vLLM on an OCI A10 shape, 2025-03, both its
#                        mem_get_info "total_gpu_memory (22.07GiB)" and the OOM "total capacity of
#                        22.07 GiB" (oracle-samples/oci-data-science-ai-samples
#                        ai-quick-actions/troubleshooting-tips.md @ 03135b92); a Lambda gpu_1x_a10
#                        run with torch 2.7.0 recorded 22.07 GiB too (2026). An older driver gave
#                        22.18 GiB (OpenBMB/MiniCPM-V#640, 2024-10). 21.99 GiB was a deviceQuery.
#   A10G      22587 MiB  torch 2.15 dev + cu130: TorchCodec docs, CUDA decoding tutorial (an
#                        older AWS log prints 22723MB; the newer, smaller figure is used)
#   RTX 4090  24084 MiB  23.52 GiB on 2026 drivers: OOM in Soul-AILab/SoulX-FlashTalk#5
#                        (2026-01); a driver 595.84 log (repository not identified) prints the same
#                        beside nvidia-smi's 24564 MiB. Drivers of 2023-25 gave 23.64 GiB:
#                        24209 MiB in Ultralytics logs (torch 2.0-2.1), 25386352640 B in
#                        thamada/nvidia-smi gls/RTX4090_deviceQuery.py (driver 12.4), OOMs in
#                        TMElyralab/MuseTalk#76 and deepseek-ai/DeepSeek-V3#205. The former
#                        24563 MiB (23.99 GiB) matches nvidia-smi's board total, not what torch
#                        reports on Linux. A card driving a display has less.
#   L40S      45455 MiB  44.39 GiB, 2026: "a 48 GB L40S" in FX-DOVE/ltx2.5
#                        tests/test_oom_regression.py @ ea51009d; other 2026 L40S OOMs print the
#                        same. 2024: 45589 MiB with driver 550.54.14 (blog "Understanding GPU
#                        utilization strategies in Kubernetes"), 45495 MiB with torch 2.2.2
#   A100 40GB 40441 MiB  Colab A100-SXM4-40GB, torch 2.11.0+cu128 and +cu130, 2026: Ultralytics
#                        logs "(NVIDIA A100-SXM4-40GB, 40441MiB)" (repository not identified); an
#                        A100 40GB OOM says 39.50 GiB (TianheWu/CoSeR#10, 2025-01). Logs with
#                        torch 2.3-2.5 printed 40514MiB. 39.39 GiB was a deviceQuery.
#   A100 80GB 81051 MiB  A100-SXM4-80GB, torch 2.9.1+cu128, 2025-12: ultralytics/ultralytics#22877
#                        ("CUDA:0 (NVIDIA A100-SXM4-80GB, 81051MiB)"). Other torch logs on this
#                        card range 81038-81251 MiB; mixbench on a PCIe card (driver 12.3) 81049 MB
#   H100 80GB 81090 MiB  torch on 8x "NVIDIA H100 80GB HBM3": Stanford CS336 (spring 2025)
#                        lecture 6 notes; torch 2.7.0/cu12.8 prints 81089MB, torch 2.0.1 81082MB
#   H200      143156 MiB torch on Modal: ai-bot-pro/achatbot
#                        deploy/modal/src/llm/vllm/vlm/skywork_r1v.py; an Ultralytics log with
#                        torch 2.11.0+cu128 (2026) prints the same 143156MiB
#   V100 16GB 16160 MiB  torch 1.7-1.13 logs print 16160-16161 MiB (YOLOv5 Colab, 2020-23); no
#                        figure from a current driver found, so unverified for current drivers
# usd_per_hour: on-demand list prices, a default only (the UI slider / CLI flag overrides it).
#   Modal, as listed May 2026 (techbytes.app "Serverless GPU Pricing Matrix", verified 2026-05-07):
#     T4 0.5904, L4 0.7992, L40S 1.9512, A100 80GB 2.4984, H100 3.9492. Lambda, same page:
#     A10 0.86, A100 40GB 1.48. AWS g5.xlarge (1x A10G) 1.006, us-east-2, Apr 2024 (`sky show-gpus`
#     in skypilot-org/skypilot#3430). RunPod RTX 4090 0.60 on-demand, Mar 2026 (deploybase.ai
#     "RunPod GPU Pricing"). RunPod serverless H200 $0.00155/s = 5.58/h (docs.runpod.io/serverless/
#     pricing, 2025-26). Baseten V100 16GB 3.67, Aug 2023
#     (the-full-stack/the-full-stack-website#84).
# bf16_tflops (dense) and bandwidth: NVIDIA datasheets, sparsity figures halved. The T4 and V100
# have no bf16 (compute capability 7.5 and 7.0; bf16 needs 8.0: memorymark/gpus/record.py), so
# their bf16_tflops is None and their datasheets' FP16 tensor rate is fp16_tflops. T4 (65 FP16;
# 320 GB/s), L4 (121, 300 GB/s), A10 (125, 600 GB/s), L40S (362.05, 864 GB/s),
# A100 (312; 1555 GB/s 40GB SXM, 2039 GB/s 80GB SXM), H100 SXM (989.5, 3.35 TB/s), H200 (989.5,
# 4.8 TB/s), V100 SXM2 (125 FP16, no bf16; 900 GB/s); RTX 4090: Ada Lovelace architecture
# whitepaper (165.2 with FP32 accumulate, 1008 GB/s). A10G: no NVIDIA datasheet; 70 and 600 GB/s
# from Baseten's "NVIDIA A10 vs A10G" (unverified; a public log measured 67.1 TFLOPS cuBLAS).
# fp32_tflops (plain FP32, no tensor cores), same datasheets and whitepaper: T4 8.1, L4 30.3,
# A10 31.2, RTX 4090 82.6, L40S 91.6, A100 19.5, H100 SXM 67, H200 67, V100 SXM2 15.7. A10G:
# assumed equal to the A10's (the same GA102 with 9216 CUDA cores; unverified).
# intra_node_bytes_per_s (one direction; datasheets give both directions, halved here): NVLink
# 900 GB/s on H100 SXM and H200 (NVIDIA H100 and H200 datasheets), 600 GB/s on A100 SXM (A100
# datasheet), 300 GB/s on V100 SXM2 (V100 datasheet). GPUs without NVLink talk over PCIe: Gen4
# x16, 64 GB/s both ways (L4, A10, L40S datasheets; A10G and RTX 4090 are Gen4 cards too), Gen3
# x16, 32 GB/s, on the T4 (T4 datasheet). Ring collectives inside a node reach about these
# rates per GPU (nccl-tests' bus bandwidth, NVIDIA/nccl-tests doc/PERFORMANCE.md).
# inter_node_bytes_per_s (per GPU, one direction): DGX H100 has one 400 Gb/s ConnectX-7 port
# per GPU (DGX H100 datasheet) = 50 GB/s; DGX A100 one 200 Gb/s ConnectX-6 HDR port per GPU
# (DGX A100 datasheet) = 25 GB/s; H200 (HGX H200) as H100. Others are PCIe cloud instances: AWS
# g5.48xlarge (8x A10G) and g6.48xlarge (8x L4) list 100 Gb/s per instance, 12.5 GB/s over 8
# GPUs; the same is assumed for the other PCIe GPUs and the V100 (unverified: an assumption).
CATALOG: tuple[GPU, ...] = (
    GPU(name="T4", intra_node_bytes_per_s=16e9,
        total_bytes=15095 * MIB, usd_per_hour=0.5904, bf16_tflops=None, fp16_tflops=65.0,
        memory_bandwidth_bytes_per_s=320e9, compute_capability=(7, 5), fp32_tflops=8.1,
        aliases=("Tesla T4", "NVIDIA T4")),
    GPU(name="L4", intra_node_bytes_per_s=32e9,
        total_bytes=22563 * MIB, usd_per_hour=0.7992, bf16_tflops=121.0,
        memory_bandwidth_bytes_per_s=300e9, compute_capability=(8, 9), fp32_tflops=30.3,
        aliases=("NVIDIA L4",)),
    GPU(name="A10", total_bytes=22600 * MIB, usd_per_hour=0.86, bf16_tflops=125.0,
        memory_bandwidth_bytes_per_s=600e9, compute_capability=(8, 6), fp32_tflops=31.2,
        aliases=("NVIDIA A10",)),
    GPU(name="A10G", total_bytes=22587 * MIB, usd_per_hour=1.006, bf16_tflops=70.0,
        memory_bandwidth_bytes_per_s=600e9, compute_capability=(8, 6), fp32_tflops=31.2,
        aliases=("NVIDIA A10G",)),
    GPU(name="RTX 4090", total_bytes=24084 * MIB, usd_per_hour=0.60, bf16_tflops=165.2,
        memory_bandwidth_bytes_per_s=1008e9, compute_capability=(8, 9), fp32_tflops=82.6,
        aliases=("4090", "GeForce RTX 4090", "NVIDIA GeForce RTX 4090")),
    GPU(name="L40S", total_bytes=45455 * MIB, usd_per_hour=1.9512, bf16_tflops=362.05,
        memory_bandwidth_bytes_per_s=864e9, compute_capability=(8, 9), fp32_tflops=91.6,
        aliases=("NVIDIA L40S",)),
    GPU(name="A100 40GB", intra_node_bytes_per_s=300e9, inter_node_bytes_per_s=25e9,
        total_bytes=40441 * MIB, usd_per_hour=1.48, bf16_tflops=312.0,
        memory_bandwidth_bytes_per_s=1555e9, compute_capability=(8, 0), fp32_tflops=19.5,
        aliases=("A100-SXM4-40GB", "A100-PCIE-40GB", "A100 PCIe 40GB")),
    GPU(name="A100 80GB", intra_node_bytes_per_s=300e9, inter_node_bytes_per_s=25e9,
        total_bytes=81051 * MIB, usd_per_hour=2.4984, bf16_tflops=312.0,
        memory_bandwidth_bytes_per_s=2039e9, compute_capability=(8, 0), fp32_tflops=19.5,
        aliases=("A100-SXM4-80GB", "A100 80GB PCIe", "A100-PCIE-80GB")),
    GPU(name="H100 80GB", intra_node_bytes_per_s=450e9, inter_node_bytes_per_s=50e9,
        total_bytes=81090 * MIB, usd_per_hour=3.9492, bf16_tflops=989.5,
        memory_bandwidth_bytes_per_s=3.35e12, compute_capability=(9, 0), fp32_tflops=67.0,
        aliases=("H100", "H100 SXM", "H100 80GB HBM3", "H100-SXM5-80GB")),
    GPU(name="H200", intra_node_bytes_per_s=450e9, inter_node_bytes_per_s=50e9,
        total_bytes=143156 * MIB, usd_per_hour=5.58, bf16_tflops=989.5,
        memory_bandwidth_bytes_per_s=4.8e12, compute_capability=(9, 0), fp32_tflops=67.0,
        aliases=("NVIDIA H200", "H200 141GB")),
    GPU(name="V100 16GB", intra_node_bytes_per_s=150e9,
        total_bytes=16160 * MIB, usd_per_hour=3.67, bf16_tflops=None, fp16_tflops=125.0,
        memory_bandwidth_bytes_per_s=900e9, compute_capability=(7, 0), fp32_tflops=15.7,
        aliases=("V100-SXM2-16GB", "V100-PCIE-16GB")),
)  # fmt: skip
